"""Conversations that carry signed reasoning continue only on lines of the family that signed it.

Anthropic thinking blocks carry a signature only Anthropic can check, and
OpenAI's encrypted reasoning items only OpenAI can read: a line of another
provider family is skipped before dispatch (``signed_reasoning`` in the
attempt record) instead of failing upstream.
"""

from __future__ import annotations

import anthropic
import openai
import pytest

from .responses_support import catalog

THINKING_HISTORY = [
    {"role": "user", "content": "What is 2 + 2?"},
    {
        "role": "assistant",
        "content": [
            {"type": "thinking", "thinking": "Two and two.", "signature": "c2lnbmVk"},
            {"type": "text", "text": "4"},
        ],
    },
    {"role": "user", "content": "And times 3?"},
]
REDACTED_HISTORY = [
    THINKING_HISTORY[0],
    {
        "role": "assistant",
        "content": [
            {"type": "redacted_thinking", "data": "ZW5jcnlwdGVk"},
            {"type": "text", "text": "4"},
        ],
    },
    THINKING_HISTORY[2],
]


@pytest.mark.parametrize(
    "history", [THINKING_HISTORY, REDACTED_HISTORY], ids=["thinking", "redacted"]
)
async def test_signed_thinking_skips_openai_lines(prism_fake, prism_gateway, history):
    gw = await prism_gateway(
        catalog(prism_fake, ("gpt", "openai", "sr-gpt"), ("claude", "anthropic", "sr-claude"))
    )
    raw = await gw.anthropic().messages.with_raw_response.create(
        model="m", max_tokens=50, messages=history
    )
    message = await raw.parse()
    assert message.content[0].text.startswith("Hello from up-claude")
    assert raw.headers["x-prism-provider"] == "claude"
    log = raw.headers["x-prism-attempt-log"]
    assert log.startswith("gpt/up-gpt skipped signed_reasoning")
    assert raw.headers["x-prism-attempts"] == "1"
    assert prism_fake.hits("sr-gpt") == 0
    # The Anthropic line got the signed blocks as they were.
    sent = prism_fake.requests("sr-claude")[-1].body
    assert sent["messages"][1]["content"][0] == history[1]["content"][0]


async def test_signed_thinking_with_only_other_lines_is_refused(prism_fake, prism_gateway):
    gw = await prism_gateway(catalog(prism_fake, ("gpt", "openai", "sr-only-gpt")))
    with pytest.raises(anthropic.BadRequestError) as info:
        await gw.anthropic(max_retries=0).messages.create(
            model="m", max_tokens=50, messages=THINKING_HISTORY
        )
    error = info.value.body["error"]
    assert error["code"] == "no_compatible_binding"
    assert "signed_reasoning" in error["message"]
    assert info.value.response.headers["x-prism-attempt-log"].startswith(
        "gpt/up-gpt skipped signed_reasoning"
    )
    assert prism_fake.hits("sr-only-gpt") == 0


async def test_unsigned_history_is_not_gated(prism_fake, prism_gateway):
    """A plain conversation (no reasoning) still goes to the first line, translated."""
    gw = await prism_gateway(
        catalog(prism_fake, ("gpt", "openai", "sr-plain-gpt"), ("claude", "anthropic", "sr-c"))
    )
    raw = await gw.anthropic().messages.with_raw_response.create(
        model="m",
        max_tokens=50,
        messages=[
            {"role": "user", "content": "Hi"},
            {"role": "assistant", "content": "Hello"},
            {"role": "user", "content": "Again"},
        ],
    )
    assert raw.headers["x-prism-provider"] == "gpt"
    assert "signed_reasoning" not in raw.headers.get("x-prism-attempt-log", "")


ENCRYPTED_INPUT = [
    {"role": "user", "content": "What is 2 + 2?"},
    {"type": "reasoning", "id": "rs_1", "summary": [], "encrypted_content": "gAAAAB-opaque"},
    {
        "type": "message",
        "role": "assistant",
        "content": [{"type": "output_text", "text": "4"}],
    },
    {"role": "user", "content": "And times 3?"},
]


async def test_encrypted_reasoning_skips_anthropic_lines(prism_fake, prism_gateway):
    gw = await prism_gateway(
        catalog(prism_fake, ("claude", "anthropic", "sr-r-claude"), ("gpt", "openai", "sr-r-gpt"))
    )
    raw = await gw.openai().responses.with_raw_response.create(model="m", input=ENCRYPTED_INPUT)
    response = raw.parse()
    assert response.output_text.startswith("Hello from up-gpt")
    assert raw.headers["x-prism-provider"] == "gpt"
    assert raw.headers["x-prism-attempt-log"].startswith(
        "claude/up-claude skipped signed_reasoning"
    )
    assert prism_fake.hits("sr-r-claude") == 0


async def test_encrypted_reasoning_with_only_anthropic_lines_is_refused(prism_fake, prism_gateway):
    gw = await prism_gateway(catalog(prism_fake, ("claude", "anthropic", "sr-r-only")))
    with pytest.raises(openai.BadRequestError) as info:
        await gw.openai(max_retries=0).responses.create(model="m", input=ENCRYPTED_INPUT)
    assert info.value.code == "no_compatible_binding"
    assert "signed_reasoning" in info.value.message
    assert prism_fake.hits("sr-r-only") == 0


async def test_reasoning_without_encrypted_content_is_not_gated(prism_fake, prism_gateway):
    gw = await prism_gateway(catalog(prism_fake, ("claude", "anthropic", "sr-r-plain")))
    items = [dict(item) for item in ENCRYPTED_INPUT]
    del items[1]["encrypted_content"]
    raw = await gw.openai().responses.with_raw_response.create(model="m", input=items)
    assert raw.headers["x-prism-provider"] == "claude"
