"""Bills for output the caller cannot read: thinking, redacted thinking, empty answers.

An Anthropic upstream bills the whole thinking it generated, though the answer
carries only its summary (or nothing of it, or an encrypted blob), and an
empty answer bills what it spent before reaching its limit.  Those reports are
billed as reported; lies about them are still refused.  Every call goes
through the real gateway with the official SDKs; the ledger is read as an
auditor would.
"""

from __future__ import annotations

from decimal import Decimal
from typing import Any

import pytest
from prism_fake_upstream import Fault

from .conftest import PRICE_A, Ledger, expected_cost

MESSAGES = [{"role": "user", "content": "hello there"}]  # the fake counts 2 prompt tokens
TEXT = "The answer is four."
#: A summary of the thinking, as Claude 4 models return it: far shorter than what it cost.
SUMMARY = "Adding two and two gives four."
#: The API's redacted thinking: encrypted, nothing in it can be counted.
REDACTED = "EmwKAhgBEgy3va3pzix/LafPsn4aDFIT2Xlxh0L5L8rLVyIwxtE3rAFBa8cr3qpP"
#: What the upstream bills: the thinking it generated, not the summary's few words.
REPORTED = 1500
MAX_TOKENS = 4000


def catalog(fake: Any, kind: str = "anthropic") -> dict[str, Any]:
    return {
        "providers": {"think": {"kind": kind, "base_url": fake.base_url("think")}},
        "models": {
            "m": {
                "retries": 0,
                "chain": [{"provider": "think", "model": "up-think", "price": PRICE_A}],
            }
        },
    }


async def ask_anthropic(gw: Any, stream: bool) -> tuple[Any, Any]:
    """(headers, the message the SDK assembled) for one Messages call."""
    async with gw.anthropic() as client:
        if not stream:
            raw = await client.messages.with_raw_response.create(
                model="m", max_tokens=MAX_TOKENS, messages=MESSAGES
            )
            return raw.headers, await raw.parse()
        async with client.messages.stream(
            model="m", max_tokens=MAX_TOKENS, messages=MESSAGES
        ) as events:
            message = await events.get_final_message()
            return events.response.headers, message


async def ask_openai(gw: Any, stream: bool, **extra: Any) -> tuple[Any, str]:
    """(headers, the answer's text) for one chat completion."""
    async with gw.openai() as client:
        raw = await client.chat.completions.with_raw_response.create(
            model="m", messages=MESSAGES, stream=stream, **extra
        )
        if not stream:
            return raw.headers, raw.parse().choices[0].message.content or ""
        texts = []
        async for chunk in raw.parse():
            texts.extend(choice.delta.content or "" for choice in chunk.choices)
        return raw.headers, "".join(texts)


def assert_billed_as_reported(ledger: Ledger, headers: Any, outcome: str, output: int) -> None:
    row = ledger.row(headers["x-prism-request-id"])
    assert (row["outcome"], row["provider"]) == (outcome, "think")
    assert (row["usage_suspect"], row["estimated"]) == (0, 0)
    assert (row["input_tokens"], row["output_tokens"]) == (2, output)
    assert Ledger.cost(row) == expected_cost(PRICE_A, 2, output) > 0


def assert_billed_at_the_estimate(ledger: Ledger, headers: Any, delivered: str) -> None:
    row = ledger.row(headers["x-prism-request-id"])
    assert (row["usage_suspect"], row["estimated"]) == (1, 1)
    # Prism's estimate: about four characters a token of what was delivered.
    assert row["output_tokens"] == -(-len(delivered) // 4)
    assert Ledger.cost(row) < Decimal("0.001")


THINKING = [
    pytest.param({"thinking": SUMMARY}, SUMMARY, id="summarised"),
    pytest.param({"thinking": ""}, "", id="omitted"),
    pytest.param({"redacted_thinking": REDACTED}, None, id="redacted"),
]


@pytest.mark.parametrize("stream", [False, True], ids=["body", "stream"])
@pytest.mark.parametrize(("thinking", "shown"), THINKING)
async def test_a_thinking_answer_is_billed_for_the_output_the_upstream_reports(
    prism_fake, billing_gateway, ledger, stream, thinking, shown
):
    prism_fake.script("think", [Fault(text=TEXT, usage={"output_tokens": REPORTED}, **thinking)])
    gw = await billing_gateway(catalog(prism_fake))
    headers, message = await ask_anthropic(gw, stream)
    # The caller gets the thinking block as the upstream sent it, and the text.
    first, text = message.content
    if shown is None:
        assert (first.type, first.data) == ("redacted_thinking", REDACTED)
    else:
        assert (first.type, first.thinking) == ("thinking", shown)
        assert first.signature
    assert (text.type, text.text) == ("text", TEXT)
    assert message.usage.output_tokens == REPORTED
    assert_billed_as_reported(ledger, headers, "ok", REPORTED)
    if not stream:
        assert Decimal(headers["x-prism-cost"]) == expected_cost(PRICE_A, 2, REPORTED)


@pytest.mark.parametrize("stream", [False, True], ids=["body", "stream"])
async def test_a_thinking_answer_translated_for_an_openai_caller_is_billed_within_its_cap(
    prism_fake, billing_gateway, ledger, stream
):
    prism_fake.script(
        "think", [Fault(thinking=SUMMARY, text=TEXT, usage={"output_tokens": REPORTED})]
    )
    gw = await billing_gateway(catalog(prism_fake))
    # No max_tokens: the translation asks the upstream for its default (4096), the cap.
    headers, text = await ask_openai(gw, stream)
    assert text == TEXT  # chat completions carry no thinking
    assert_billed_as_reported(ledger, headers, "ok", REPORTED)
    # More than that default is more than the upstream was allowed.
    prism_fake.script("think", [Fault(thinking=SUMMARY, text=TEXT, usage={"output_tokens": 4097})])
    headers, _ = await ask_openai(gw, stream)
    assert_billed_at_the_estimate(ledger, headers, SUMMARY + TEXT)


async def test_a_thinking_breakdown_bounds_the_rest_by_the_delivered_text(
    prism_fake, billing_gateway, ledger
):
    # The upstream says how much was thinking: the rest is what the text must hold.
    honest = {"output_tokens": REPORTED, "output_tokens_details": {"thinking_tokens": 1490}}
    lying = {"output_tokens": REPORTED, "output_tokens_details": {"thinking_tokens": 10}}
    prism_fake.script(
        "think",
        [Fault(thinking=SUMMARY, text=TEXT, usage=honest)] * 2
        + [Fault(thinking=SUMMARY, text=TEXT, usage=lying)] * 2,
    )
    gw = await billing_gateway(catalog(prism_fake))
    for stream in (False, True):
        headers, _ = await ask_anthropic(gw, stream)
        assert_billed_as_reported(ledger, headers, "ok", REPORTED)
    for stream in (False, True):
        headers, _ = await ask_anthropic(gw, stream)
        assert_billed_at_the_estimate(ledger, headers, SUMMARY + TEXT)


@pytest.mark.parametrize(
    "output",
    [
        pytest.param(10**15, id="10e15-int"),
        pytest.param(1e15, id="1e15-float"),
        pytest.param(MAX_TOKENS + 1, id="above-max-tokens"),
    ],
)
@pytest.mark.parametrize("stream", [False, True], ids=["body", "stream"])
@pytest.mark.parametrize(("thinking", "shown"), THINKING[::2])
async def test_a_thinking_answer_claiming_more_than_the_call_allowed_is_refused(
    prism_fake, billing_gateway, ledger, stream, thinking, shown, output
):
    prism_fake.script("think", [Fault(text=TEXT, usage={"output_tokens": output}, **thinking)])
    gw = await billing_gateway(catalog(prism_fake))
    headers, message = await ask_anthropic(gw, stream)
    assert message.content[-1].text == TEXT
    assert_billed_at_the_estimate(ledger, headers, (shown or "") + TEXT)


#: (caller wire, stream, max_tokens): an empty answer in every way a caller can get one.
EMPTY_MODES = [
    pytest.param("openai", False, None, id="openai"),
    pytest.param("openai", True, None, id="openai-stream"),
    pytest.param("openai", False, 100, id="openai-max-tokens"),
    pytest.param("anthropic", False, 100, id="anthropic"),
    pytest.param("anthropic", True, 100, id="anthropic-stream"),
]


async def ask_empty(gw: Any, wire: str, stream: bool, max_tokens: int | None) -> Any:
    if wire == "openai":
        extra = {} if max_tokens is None else {"max_tokens": max_tokens}
        headers, text = await ask_openai(gw, stream, **extra)
        assert text == ""
        return headers
    async with gw.anthropic() as client:
        if stream:
            async with client.messages.stream(
                model="m", max_tokens=max_tokens, messages=MESSAGES
            ) as events:
                message = await events.get_final_message()
                headers = events.response.headers
        else:
            raw = await client.messages.with_raw_response.create(
                model="m", max_tokens=max_tokens, messages=MESSAGES
            )
            headers, message = raw.headers, await raw.parse()
    assert (message.content, message.stop_reason) == ([], "max_tokens")
    return headers


def empty_usage(wire: str, output: Any) -> dict[str, Any]:
    return {"completion_tokens" if wire == "openai" else "output_tokens": output}


@pytest.mark.parametrize(("wire", "stream", "max_tokens"), EMPTY_MODES)
async def test_an_empty_answer_is_billed_for_the_output_it_reports(
    prism_fake, billing_gateway, ledger, wire, stream, max_tokens
):
    # Cut at its limit before anything visible: what it generated, the caller never sees.
    prism_fake.script("think", [Fault(empty_length=True, usage=empty_usage(wire, 20))])
    gw = await billing_gateway(catalog(prism_fake, wire))
    headers = await ask_empty(gw, wire, stream, max_tokens)
    assert headers["x-prism-outcome"] == "empty"
    assert_billed_as_reported(ledger, headers, "empty", 20)


@pytest.mark.parametrize(("wire", "stream", "max_tokens"), EMPTY_MODES)
async def test_an_empty_answer_claiming_more_than_any_call_could_is_refused(
    prism_fake, billing_gateway, ledger, wire, stream, max_tokens
):
    prism_fake.script("think", [Fault(empty_length=True, usage=empty_usage(wire, 10**15))])
    gw = await billing_gateway(catalog(prism_fake, wire))
    headers = await ask_empty(gw, wire, stream, max_tokens)
    row = ledger.row(headers["x-prism-request-id"])
    assert (row["outcome"], row["usage_suspect"], row["estimated"]) == ("empty", 1, 1)
    assert row["output_tokens"] == 0  # the estimate of what was delivered: nothing
    assert Ledger.cost(row) == expected_cost(PRICE_A, row["input_tokens"], 0)
