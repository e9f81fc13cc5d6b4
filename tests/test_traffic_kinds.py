"""Operator traffic kinds are the plugins' words: ``x-prism-traffic`` takes what they register."""

from __future__ import annotations

from typing import Any

import aiohttp
import pytest

from prism_proxy import ConfigError, config_from_mapping, create_app, hookimpl

ADMIN = {"x-prism-admin-token": "traffic-admin"}
BODY = {"model": "chat-a", "messages": [{"role": "user", "content": "hi"}]}


class Shadow:
    """A plugin that sends shadow traffic of its own (and, like prism-probes, probes)."""

    def __init__(self, *kinds: str) -> None:
        self.kinds = kinds

    @hookimpl
    def prism_traffic_kinds(self) -> tuple[str, ...]:
        return self.kinds


async def post(gw: Any, headers: dict[str, str]) -> tuple[int, Any]:
    async with aiohttp.ClientSession() as session:
        async with session.post(
            gw.url + "/v1/chat/completions", json=BODY, headers=headers
        ) as response:
            return response.status, await response.json()


@pytest.fixture
def admin_token(monkeypatch: pytest.MonkeyPatch) -> dict[str, str]:
    monkeypatch.setenv("TRAFFIC_TEST_ADMIN", "traffic-admin")
    return {"admin_token_env": "TRAFFIC_TEST_ADMIN"}


async def test_without_a_plugin_registering_kinds_the_header_is_refused(
    prism_gateway, catalog, admin_token, recorder
):
    # prism-probes not loaded: "probe" is nobody's word.
    gw = await prism_gateway(catalog, config=admin_token, load_plugins=["openai"])
    status, answer = await post(gw, {"x-prism-traffic": "probe", **ADMIN})
    assert status == 400
    error = answer["error"]
    assert (error["code"], error["param"]) == ("invalid_traffic", "x-prism-traffic")
    assert error["message"].endswith("traffic kinds plugins register: none")
    assert [c.traffic for c, _ in recorder.settled] == ["customer"]


async def test_a_kind_a_plugin_registers_is_accepted_and_settled_as_that_traffic(
    prism_gateway, catalog, admin_token, recorder
):
    # prism-probes and the test plugin both name "probe": they share it.
    gw = await prism_gateway(
        catalog,
        config=admin_token,
        plugins=[(Shadow("shadow", "probe"), "test-shadow")],
        load_plugins=["openai", "probes"],
    )
    assert (await post(gw, {"x-prism-traffic": "shadow", **ADMIN}))[0] == 200
    assert (await post(gw, {"x-prism-traffic": "probe", **ADMIN}))[0] == 200
    status, answer = await post(gw, {"x-prism-traffic": "free", **ADMIN})
    assert (status, answer["error"]["code"]) == (400, "invalid_traffic")
    assert answer["error"]["message"].endswith(": preflight, probe, shadow")
    status, answer = await post(gw, {"x-prism-traffic": "shadow"})
    assert (status, answer["error"]["code"]) == (403, "traffic_not_allowed")
    assert [c.traffic for c, _ in recorder.settled] == ["shadow", "probe"] + ["customer"] * 2


async def test_a_call_with_the_internal_token_names_its_kind(
    prism_gateway, catalog, recorder
):
    gw = await prism_gateway(
        catalog, plugins=[(Shadow("shadow"), "test-shadow")], load_plugins=["openai"]
    )
    internal = {"x-prism-internal-token": gw.gateway.self_link.token}
    assert (await post(gw, {**internal, "x-prism-traffic": "shadow"}))[0] == 200
    status, answer = await post(gw, internal)
    assert (status, answer["error"]["code"]) == (400, "invalid_traffic")
    assert answer["error"]["message"].endswith(": shadow")
    assert [c.traffic for c, _ in recorder.settled] == ["shadow", "customer"]


@pytest.mark.parametrize("kind", ["customer", ""])
def test_a_plugin_cannot_register_the_callers_own_kind(catalog, kind):
    config = config_from_mapping({"disable": ["metrics"]}, catalog_data=catalog)
    with pytest.raises(ConfigError) as info:
        create_app(config, plugins=[(Shadow(kind), "test-shadow")])
    assert info.value.key == "plugins" and "prism_traffic_kinds" in str(info.value)
