"""One exit: errors in the shape the caller reads wherever they come from, and the
core's per-call state kept off ``call.extensions`` (plugins' own)."""

from __future__ import annotations

from typing import Any

import anthropic
import openai
import pytest

from prism_proxy import hookimpl

HI = [{"role": "user", "content": "hi"}]


def one_line(fake: Any, **line: Any) -> dict[str, Any]:
    return {
        "providers": {"p": {"kind": "openai", "base_url": fake.base_url("ok")}},
        "models": {"m": {"chain": [{"provider": "p", "model": "x", **line}]}},
    }


async def test_an_admin_route_refuses_in_the_shape_the_callers_sdk_reads(prism_fake, prism_gateway):
    gw = await prism_gateway(one_line(prism_fake))
    with pytest.raises(anthropic.PermissionDeniedError) as refused:
        await gw.anthropic().post("/prism/admin/reload", cast_to=object)
    body = refused.value.body
    assert isinstance(body, dict) and body["type"] == "error"
    assert (body["error"]["type"], body["error"]["code"]) == ("permission_error", "admin_disabled")
    with pytest.raises(openai.PermissionDeniedError) as also:
        await gw.openai().post(gw.url + "/prism/admin/reload", cast_to=object)
    assert also.value.code == "admin_disabled"


class BrokenModelFilter:
    """A plugin whose bug escapes a handler: the server's own 500 answers it."""

    @hookimpl
    def prism_model_allowed(self, call: Any, model: Any) -> bool:
        raise RuntimeError("plugin bug")


async def test_a_server_error_outside_a_call_is_in_the_callers_shape(
    prism_fake, prism_gateway, caplog
):
    gw = await prism_gateway(one_line(prism_fake), plugins=[(BrokenModelFilter(), "broken")])
    with pytest.raises(anthropic.InternalServerError) as failed:
        await gw.anthropic().models.list()
    body = failed.value.body
    assert isinstance(body, dict) and body["type"] == "error"
    assert (body["error"]["type"], body["error"]["code"]) == ("api_error", "internal_error")
    with pytest.raises(openai.InternalServerError) as also:
        await gw.openai().models.list()
    assert also.value.code == "internal_error"


class ExtensionsAtSettle:
    """What ``call.extensions`` holds when the call settles (every hook has run)."""

    def __init__(self) -> None:
        self.seen: list[dict[str, Any]] = []

    @hookimpl
    def prism_settle(self, call: Any, settlement: Any) -> None:
        self.seen.append(dict(call.extensions))


@pytest.mark.parametrize("stream", [False, True])
async def test_the_core_keeps_its_call_state_out_of_plugins_extensions(
    prism_fake, prism_gateway, stream
):
    # A line that gates (capabilities, context size) and counts (a capacity slot):
    # every piece of the core's own per-call state is in use.
    line = {"capabilities": ["tools"], "max_context_tokens": 10_000, "max_concurrency": 1}
    seen = ExtensionsAtSettle()
    gw = await prism_gateway(
        one_line(prism_fake, **line), plugins=[(seen, "seen")], load_plugins=["openai"]
    )
    client = gw.openai()
    for _ in range(2):  # the slot came back: the second call is served by the same line
        raw = await client.chat.completions.with_raw_response.create(
            model="m", messages=HI, stream=stream
        )
        assert (raw.headers["x-prism-provider"], raw.headers["x-prism-model"]) == ("p", "x")
        if stream:
            async for _ in raw.parse():
                pass
    assert seen.seen == [{}, {}]
