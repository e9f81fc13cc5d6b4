"""Anthropic's ``POST /v1/messages/count_tokens`` through the real gateway and the anthropic SDK.

On a model with an Anthropic line the count is that line's (the fake
upstream records the request it got); on a model without one, and when every
Anthropic line fails, it is Prism's estimate, marked ``x-prism-estimated``.
"""

from __future__ import annotations

from typing import Any

import anthropic
import pytest
from prism_fake_upstream import Fault

from .responses_support import catalog

MESSAGES = [{"role": "user", "content": "What is the weather like in Paris today?"}]
SYSTEM = "You are brief."


async def count(gw: Any, **body: Any) -> Any:
    body.setdefault("messages", MESSAGES)
    return await gw.anthropic().messages.with_raw_response.count_tokens(model="m", **body)


async def test_an_anthropic_line_counts_natively(prism_fake, prism_gateway):
    gw = await prism_gateway(
        catalog(prism_fake, ("gpt", "openai", "gpt-ok"), ("claude", "anthropic", "claude-ok"))
    )
    raw = await count(gw, system=SYSTEM)
    # The fake counts words: 3 of the system prompt, 8 of the message.
    assert (await raw.parse()).input_tokens == 11
    assert raw.headers["x-prism-provider"] == "claude"
    assert "x-prism-estimated" not in raw.headers
    [sent] = prism_fake.requests("claude-ok")
    assert sent.path == "messages/count_tokens"
    assert sent.body == {"model": "up-claude", "messages": MESSAGES, "system": SYSTEM}
    assert prism_fake.hits("gpt-ok") == 0  # never sent to a line that has no count


async def test_an_openai_only_model_gets_the_estimate(prism_fake, prism_gateway):
    gw = await prism_gateway(catalog(prism_fake, ("gpt", "openai", "gpt-ok")))
    raw = await count(gw, system=SYSTEM)
    chars = len(SYSTEM) + len(MESSAGES[0]["content"])
    assert (await raw.parse()).input_tokens == -(-chars // 4)
    assert raw.headers["x-prism-estimated"] == "true"
    assert prism_fake.hits("gpt-ok") == 0


async def test_a_failing_anthropic_line_passes_to_the_next_then_to_the_estimate(
    prism_fake, prism_gateway
):
    prism_fake.script("claude-a", [Fault(status=503)])
    gw = await prism_gateway(
        catalog(prism_fake, ("a", "anthropic", "claude-a"), ("b", "anthropic", "claude-b"))
    )
    raw = await count(gw)
    assert (await raw.parse()).input_tokens == 8
    assert raw.headers["x-prism-provider"] == "b"
    prism_fake.script("claude-a", [Fault(status=500)])
    prism_fake.script("claude-b", [Fault(status=529)])
    raw = await count(gw)
    assert raw.headers["x-prism-estimated"] == "true"
    assert (await raw.parse()).input_tokens == -(-len(MESSAGES[0]["content"]) // 4)


async def test_the_callers_mistake_is_told_in_anthropics_shape(prism_fake, prism_gateway):
    gw = await prism_gateway(catalog(prism_fake, ("claude", "anthropic", "claude-ok")))
    client = gw.anthropic()
    with pytest.raises(anthropic.NotFoundError) as info:
        await client.messages.count_tokens(model="nope", messages=MESSAGES)
    assert "nope" in info.value.message
    with pytest.raises(anthropic.BadRequestError) as info:
        await client.messages.count_tokens(model="m", messages=[])
    assert info.value.body["error"]["type"] == "invalid_request_error"
    assert "messages" in info.value.message
    assert prism_fake.hits("claude-ok") == 0
