"""Context-window fallback: a prompt one line refuses as too long moves to a larger line.

The fake upstream's ``ctxN`` scenarios are models with an N-token context
window (prompt counted in words): a longer prompt gets the refusal the real
API gives (OpenAI 400 ``context_length_exceeded``; Anthropic 400
``invalid_request_error`` "prompt is too long: N tokens > M maximum").
"""

from __future__ import annotations

import anthropic
import openai
import pytest

#: Twelve words: more than a ``ctx5`` line takes, far less than any declared window.
PROMPT = "one two three four five six seven eight nine ten eleven twelve"
MESSAGES = [{"role": "user", "content": PROMPT}]
#: A catalog line: (provider name, kind, fake upstream scenario, max_context_tokens).
Line = tuple[str, str, str, int]


def catalog(fake, *lines: Line, fallback: bool = True) -> dict:
    model: dict = {
        "chain": [
            {"provider": name, "model": f"up-{name}", "max_context_tokens": size}
            for name, _, _, size in lines
        ]
    }
    if fallback:
        model["context_fallback"] = True
    return {
        "providers": {
            name: {"kind": kind, "base_url": fake.base_url(scenario)}
            for name, kind, scenario, _ in lines
        },
        "models": {"m": model},
    }


@pytest.fixture
def gateway(prism_fake, prism_gateway):
    """Starts a gateway whose model ``m`` is a chain of ``lines`` on the fake upstream."""

    async def start(*lines: Line, fallback: bool = True):
        return await prism_gateway(catalog(prism_fake, *lines, fallback=fallback))

    return start


async def refusal(gw, client: str) -> openai.BadRequestError | anthropic.BadRequestError:
    """The 400 a caller of ``client``'s API gets for ``PROMPT`` (its SDK retrying nothing)."""
    if client == "openai":
        with pytest.raises(openai.BadRequestError) as refused:
            await gw.openai(max_retries=0).chat.completions.create(model="m", messages=MESSAGES)
        return refused.value
    with pytest.raises(anthropic.BadRequestError) as refused_messages:
        await gw.anthropic(max_retries=0).messages.create(
            model="m", max_tokens=50, messages=MESSAGES
        )
    return refused_messages.value


@pytest.mark.parametrize("stream", [False, True], ids=["whole", "stream"])
async def test_openai_refusal_moves_to_a_larger_line(prism_fake, gateway, stream):
    gw = await gateway(
        ("small", "openai", "ctx5", 100),
        ("smaller", "openai", "cf-smaller", 50),
        ("big", "anthropic", "cf-big", 200_000),
    )
    raw = await gw.openai().chat.completions.with_raw_response.create(
        model="m", messages=MESSAGES, stream=stream
    )
    if stream:
        text = "".join([chunk.choices[0].delta.content or "" async for chunk in raw.parse()
                        if chunk.choices])  # fmt: skip
    else:
        text = raw.parse().choices[0].message.content
    assert text.startswith("Hello from up-big")
    assert raw.headers["x-prism-provider"] == "big"
    assert raw.headers["x-prism-fallback"] == "context"
    log = raw.headers["x-prism-attempt-log"]
    entries = log.split("; ")
    assert entries[0].startswith("small/up-small request_error 400")
    assert entries[1] == "note context_fallback: small/up-small refused the prompt's size"
    assert entries[2] == "smaller/up-smaller skipped context_fallback: context 50 not above 100"
    assert entries[3].startswith("big/up-big ok 200")
    assert prism_fake.hits("cf-smaller") == 0


async def test_anthropic_refusal_moves_to_a_larger_line(gateway):
    gw = await gateway(("claude", "anthropic", "ctx6", 100), ("gpt", "openai", "cf-gpt", 128_000))
    raw = await gw.anthropic().messages.with_raw_response.create(
        model="m", max_tokens=50, messages=MESSAGES
    )
    message = await raw.parse()
    assert message.content[0].text.startswith("Hello from up-gpt")
    assert raw.headers["x-prism-attempt-log"].startswith("claude/up-claude request_error 400")
    assert raw.headers["x-prism-provider"] == "gpt"


async def test_without_the_flag_the_refusal_is_returned_unchanged(prism_fake, gateway):
    gw = await gateway(
        ("small", "openai", "ctx4", 100), ("big", "openai", "cf-off-big", 200_000), fallback=False
    )
    refused = await refusal(gw, "openai")
    assert refused.code == "context_length_exceeded"
    assert "maximum context length is 4 tokens" in refused.message
    assert prism_fake.hits("cf-off-big") == 0


async def test_no_larger_line_returns_the_refusal(prism_fake, gateway):
    gw = await gateway(
        ("claude", "anthropic", "ctx3", 100_000), ("gpt", "openai", "cf-small-gpt", 8_000)
    )
    refused = await refusal(gw, "anthropic")
    assert refused.body["error"]["message"] == "prompt is too long: 12 tokens > 3 maximum"
    assert (
        "gpt/up-gpt skipped context_fallback: context 8000 not above 100000"
        in refused.response.headers["x-prism-attempt-log"]
    )
    assert prism_fake.hits("cf-small-gpt") == 0


async def test_other_request_errors_are_not_moved(prism_fake, gateway):
    """Only a context-length refusal moves on: any other 400 is the caller's, returned as is."""
    gw = await gateway(("small", "openai", "err400", 100), ("big", "openai", "cf-400-big", 200_000))
    await refusal(gw, "openai")
    assert prism_fake.hits("cf-400-big") == 0


def test_fake_refusal_bodies_are_the_documented_ones():
    """The fake's refusals are the APIs' own shapes (what the classifier matches)."""
    from prism_fake_upstream.faults import Fault, fault_for_scenario_name

    assert fault_for_scenario_name("ctx42") == Fault(context_limit=42)
