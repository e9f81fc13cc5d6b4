"""Responses API calls that go wrong, are billed, or come from LangChain.

Refusals come in the Responses API's error shape, so the openai SDK raises
its own error classes with ``code`` and ``param``; a stream that breaks after
its first content ends with ``error`` and ``response.failed`` events; a
served call is a ledger row like a chat call's.
"""

from __future__ import annotations

import asyncio
import sqlite3
from decimal import Decimal
from pathlib import Path
from typing import Any

import aiohttp
import openai
import pytest
from prism_fake_upstream import Fault

from prism_proxy.testing import eventually

from .responses_support import ANTHROPIC_LINE, OPENAI_LINE, WEATHER_TOOL, answer, catalog


async def refused(gw: Any, **request: Any) -> openai.APIStatusError:
    with pytest.raises(openai.APIStatusError) as info:
        await gw.openai().responses.create(model="m", **request)
    return info.value


@pytest.mark.parametrize(
    ("request_", "code", "param"),
    [
        ({"input": "Hi", "tools": [{"type": "web_search"}]}, "unsupported_tool", "tools[0].type"),
        ({"input": "Hi", "conversation": "conv_1"}, "unsupported_parameter", "conversation"),
        ({"input": "Hi", "background": True}, "unsupported_parameter", "background"),
        ({"input": "Hi", "include": ["message.output_text.logprobs"]}, "unsupported_parameter",
         "include[0]"),
        ({"input": [{"type": "item_reference", "id": "msg_1"}]}, "unsupported_input",
         "input[0].type"),
        ({"input": [{"role": "user", "content": [{"type": "input_file", "file_id": "f"}]}]},
         "unsupported_input", "input[0].content[0].type"),
        ({"input": "Hi", "tool_choice": {"type": "file_search"}}, "unsupported_tool",
         "tool_choice.type"),
        ({"input": "Hi", "text": {"format": {"type": "xml"}}}, "invalid_value",
         "text.format.type"),
        ({"input": "Hi", "max_output_tokens": 0}, "invalid_value", "max_output_tokens"),
        ({"input": []}, "invalid_value", "input"),
        ({"instructions": "Hi"}, "missing_field", "input"),
    ],
)  # fmt: skip
async def test_unsupported_or_bad_input_is_a_400_naming_the_field(
    prism_fake, prism_gateway, request_, code, param
):
    gw = await prism_gateway(catalog(prism_fake, OPENAI_LINE))
    err = await refused(gw, **request_)
    assert isinstance(err, openai.BadRequestError)
    assert err.status_code == 400
    assert err.code == code
    assert err.param == param
    assert err.type == "invalid_request_error"
    assert param.split("[")[0].split(".")[0] in err.message
    assert prism_fake.hits("gpt-ok") == 0


async def test_an_unknown_parameter_is_refused_by_name(prism_fake, prism_gateway):
    gw = await prism_gateway(catalog(prism_fake, OPENAI_LINE))
    with pytest.raises(openai.BadRequestError) as info:
        await gw.openai().responses.create(model="m", input="Hi", extra_body={"frobnicate": 1})
    assert info.value.code == "unsupported_parameter"
    assert info.value.param == "frobnicate"


async def test_store_false_and_metadata_are_accepted(prism_fake, prism_gateway):
    gw = await prism_gateway(catalog(prism_fake, OPENAI_LINE))
    response = await gw.openai().responses.create(
        model="m", input="Hi", store=False, metadata={"ticket": "42"}, user="u-1"
    )
    assert response.output_text == answer(OPENAI_LINE)
    sent = prism_fake.requests("gpt-ok")[-1].body
    assert "metadata" not in sent and "store" not in sent
    assert sent["user"] == "u-1"


async def test_unknown_model_is_not_found(prism_fake, prism_gateway):
    gw = await prism_gateway(catalog(prism_fake, OPENAI_LINE))
    with pytest.raises(openai.NotFoundError) as info:
        await gw.openai().responses.create(model="nope", input="Hi")
    assert info.value.code == "model_not_found"
    assert info.value.param == "model"


async def test_every_line_failing_is_a_503_with_the_record(prism_fake, prism_gateway):
    gw = await prism_gateway(catalog(prism_fake, ("gpt", "openai", "err500"), retries=0))
    with pytest.raises(openai.InternalServerError) as info:
        await gw.openai().responses.create(model="m", input="Hi")
    assert info.value.status_code == 503
    body = info.value.body
    assert body["attempts"][0]["outcome"] == "transient"
    assert info.value.response.headers["x-prism-attempts"] == "1"


async def test_an_upstream_request_error_is_the_callers_400_without_failover(
    prism_fake, prism_gateway
):
    prism_fake.script(
        "claude-ok",
        [
            Fault(
                status=400,
                body={
                    "type": "error",
                    "error": {"type": "invalid_request_error", "message": "prompt is too long"},
                },
            )
        ],
    )
    gw = await prism_gateway(catalog(prism_fake, ANTHROPIC_LINE, OPENAI_LINE))
    with pytest.raises(openai.BadRequestError) as info:
        await gw.openai().responses.create(model="m", input="Hi")
    assert "prompt is too long" in info.value.message
    assert info.value.code == "upstream_request_error"
    assert prism_fake.hits("gpt-ok") == 0


async def test_what_a_line_cannot_express_skips_it(prism_fake, prism_gateway):
    """Reasoning effort has no Messages equivalent: the Anthropic line is skipped, and said so."""
    gw = await prism_gateway(catalog(prism_fake, ANTHROPIC_LINE, OPENAI_LINE))
    raw = await gw.openai().responses.with_raw_response.create(
        model="m", input="Think", reasoning={"effort": "high"}
    )
    assert raw.headers["x-prism-provider"] == "gpt"
    assert "reasoning_effort" in raw.headers["x-prism-attempt-log"]
    assert prism_fake.requests("gpt-ok")[-1].body["reasoning_effort"] == "high"
    assert prism_fake.hits("claude-ok") == 0


@pytest.mark.parametrize("line", [OPENAI_LINE, ANTHROPIC_LINE], ids=["openai-line", "anthropic"])
async def test_a_stream_broken_after_its_first_content_ends_with_failure_events(
    prism_fake, prism_gateway, line
):
    name, kind, _ = line
    gw = await prism_gateway(catalog(prism_fake, (name, kind, "die3"), retries=0))
    stream = await gw.openai().responses.create(model="m", input="Hello", stream=True)
    events = [event async for event in stream]
    assert [e.sequence_number for e in events] == list(range(len(events)))
    assert [e.type for e in events[-2:]] == ["error", "response.failed"]
    assert events[-2].code == "upstream_stream_broken"
    failed = events[-1].response
    assert failed.status == "failed"
    assert failed.error.code == "upstream_stream_broken"
    delivered = "".join(e.delta for e in events if e.type == "response.output_text.delta")
    assert delivered == " ".join(answer(line).split()[:3])
    assert failed.output[0].content[0].text == delivered


@pytest.mark.parametrize("stream", [False, True], ids=["whole", "streamed"])
async def test_a_degraded_answer_is_a_response(prism_fake, prism_gateway, prism_clock, stream):
    """The call budget runs out on a stalled line: the operator's answer, as a Response."""
    prism_fake.clock = prism_clock
    prism_fake.script("stuck", [Fault(stall_s=30)])
    cat = catalog(prism_fake, ("gpt", "openai", "stuck"), retries=0)
    cat["models"]["m"].update(call_budget_ms=1200, degraded="Busy, try later ({model}).")
    gw = await prism_gateway(cat, clock=prism_clock)
    async with asyncio.timeout(10):
        pending = asyncio.ensure_future(
            gw.openai().responses.with_raw_response.create(model="m", input="Hi", stream=stream)
        )
        await eventually(lambda: prism_fake.hits("stuck") == 1)
        prism_clock.advance(1.35)
        raw = await pending
    assert raw.headers["x-prism-outcome"] == "degraded"
    if stream:
        events = [event async for event in raw.parse()]
        assert [e.sequence_number for e in events] == list(range(len(events)))
        assert events[-1].type == "response.completed"
        response = events[-1].response
    else:
        response = raw.parse()
    assert response.output_text == "Busy, try later (m)."
    assert response.status == "completed"


# -- billing --------------------------------------------------------------------------

PRICE = {"input": 3.0, "output": 15.0}


def ledger_rows(path: Path) -> list[dict[str, Any]]:
    conn = sqlite3.connect(path)
    conn.row_factory = sqlite3.Row
    try:
        return [dict(r) for r in conn.execute("SELECT * FROM ledger ORDER BY ts")]
    finally:
        conn.close()


@pytest.mark.parametrize("stream", [False, True], ids=["whole", "streamed"])
async def test_a_responses_call_is_billed_like_a_chat_call(
    prism_fake, prism_gateway, tmp_path, stream
):
    cat = catalog(prism_fake, ("gpt", "openai", "err503"), ANTHROPIC_LINE, retries=0)
    for line in cat["models"]["m"]["chain"]:
        line["price"] = PRICE
    ledger = tmp_path / "ledger.sqlite"
    gw = await prism_gateway(cat, sections={"billing": {"ledger_path": str(ledger)}})
    raw = await gw.openai().responses.with_raw_response.create(
        model="m", input="hello there", stream=stream
    )
    parsed = raw.parse()
    usage = [e async for e in parsed][-1].response.usage if stream else parsed.usage
    [row] = ledger_rows(ledger)
    assert row["request_id"] == raw.headers["x-prism-request-id"]
    assert row["endpoint"] == "responses"
    assert row["provider"] == "claude"
    assert (row["input_tokens"], row["output_tokens"]) == (usage.input_tokens, usage.output_tokens)
    expected = (usage.input_tokens * Decimal("3") + usage.output_tokens * Decimal("15")) / Decimal(
        1_000_000
    )
    assert Decimal(row["cost_nanos"]).scaleb(-9) == expected


async def test_the_error_shape_of_a_raw_request(prism_fake, prism_gateway):
    """What any client (not only the SDK) reads: the Responses API's error object."""
    gw = await prism_gateway(catalog(prism_fake, OPENAI_LINE))
    async with aiohttp.ClientSession() as session:
        async with session.post(
            f"{gw.base_url}/responses",
            json={"model": "m", "input": "Hi", "tools": [WEATHER_TOOL, {"type": "mcp"}]},
        ) as response:
            assert response.status == 400
            assert response.headers["x-prism-request-id"]
            assert await response.json() == {
                "error": {
                    "message": (
                        "built-in tool 'mcp' is not supported by Prism (only function tools)"
                    ),
                    "type": "invalid_request_error",
                    "param": "tools[1].type",
                    "code": "unsupported_tool",
                }
            }
