"""What the gateway fails to send is never evidence against the upstream.

A body nested deeper than the upstream request can be written is the
caller's 400 before dispatch; a provider that fails before a byte goes out
is the gateway's own failure.  Either way one call must not isolate a
healthy line for everyone.
"""

from __future__ import annotations

from typing import Any

import aiohttp
import orjson
import pytest

from prism_proxy import HttpProvider, hookimpl

MESSAGES = [{"role": "user", "content": "hello"}]


def nested(levels: int) -> list[Any]:
    value: list[Any] = []
    for _ in range(levels - 1):
        value = [value]
    return value


async def post(gw: Any, path: str, body: dict[str, Any]) -> tuple[int, dict[str, str], Any]:
    async with aiohttp.ClientSession() as session:
        async with session.post(gw.base_url + path, json=body) as response:
            return response.status, dict(response.headers), await response.json()


async def assert_untouched(kit: Any, gw: Any, binding: str) -> None:
    entry = await kit.binding(gw, binding)
    assert (entry["state"], entry["consecutive_failures"], entry["window"]["calls"]) == (
        "eligible",
        0,
        0,
    )


@pytest.mark.parametrize(
    ("kind", "scenario", "path", "body"),
    [
        ("openai", "gpt-ok", "/chat/completions", {"messages": MESSAGES}),
        ("anthropic", "claude-ok", "/messages", {"messages": MESSAGES, "max_tokens": 20}),
    ],
    ids=["chat", "messages"],
)
async def test_a_body_nested_too_deep_is_the_callers_400_and_isolates_nothing(
    prism_fake, prism_gateway, kit, kind, scenario, path, body
):
    catalog = {
        "providers": {"a": {"kind": kind, "base_url": prism_fake.base_url(scenario)}},
        "models": {"m": {"chain": [{"provider": "a", "model": "up-a"}]}},
    }
    gw = await prism_gateway(catalog)
    # An unknown field, 255 levels deep: the upstream request could not be written.
    deep = {"model": "m", **body, "x": nested(255)}
    for _ in range(2):  # more than one call, and none counted
        status, headers, error = await post(gw, path, deep)
        assert status == 400
        if kind == "anthropic":
            assert error["type"] == "error"
        assert (error["error"]["code"], error["error"]["param"]) == ("body_too_deep", "x")
        assert "128 levels" in error["error"]["message"]
        assert headers["x-prism-attempts"] == "0"
    assert prism_fake.hits(scenario) == 0
    await assert_untouched(kit, gw, "a/up-a")
    status, headers, _ = await post(gw, path, {"model": "m", **body})
    assert status == 200 and headers["x-prism-provider"] == "a"


class Enveloping(HttpProvider):
    """Wraps each request in an envelope of its own, deeper than the encoder writes."""

    async def send(self, call: Any, binding: Any, endpoint: Any, body: dict[str, Any]) -> Any:
        envelope: dict[str, Any] = {**body, "model": binding.model}
        for _ in range(300):
            envelope = {"wrapped": envelope}
        url = self.spec.options["base_url"] + "/chat/completions"
        return await self.post(url, self.base_headers, orjson.dumps(envelope))


class EnvelopingKind:
    @hookimpl
    def prism_provider_kinds(self) -> dict[str, Any]:
        return {"enveloping": Enveloping}


async def test_a_provider_failing_before_it_sends_is_never_held_against_the_upstream(
    prism_fake, prism_gateway, kit
):
    catalog = {
        "providers": {
            name: {"kind": "enveloping", "base_url": prism_fake.base_url(name)}
            for name in ("a", "b")
        },
        "models": {"m": {"chain": [{"provider": n, "model": f"up-{n}"} for n in ("a", "b")]}},
    }
    gw = await prism_gateway(catalog, plugins=[(EnvelopingKind(), "enveloping")])
    for _ in range(4):  # more than the three failures that would isolate a line
        status, headers, error = await post(
            gw, "/chat/completions", {"model": "m", "messages": MESSAGES}
        )
        # The gateway's own failure, said as one; not retried, the next line tried.
        assert status == 500
        assert error["error"]["code"] == "internal_error"
        assert [entry.split()[:2] for entry in headers["x-prism-attempt-log"].split("; ")] == [
            ["a/up-a", "cancelled"],
            ["b/up-b", "cancelled"],
        ]
    assert prism_fake.hits("a") == prism_fake.hits("b") == 0
    for binding in ("a/up-a", "b/up-b"):
        await assert_untouched(kit, gw, binding)
