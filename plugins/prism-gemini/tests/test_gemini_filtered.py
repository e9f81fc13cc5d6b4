"""Answers Gemini's safety filters cut (finishReason SAFETY, RECITATION…) or prompts they
block (promptFeedback): never served as a plain success; the model's ``empty`` policy decides.

The fake's scenario ``…-finish-<REASON>`` ends its answer with that reason,
``…-block-<REASON>`` blocks the prompt.
"""

from __future__ import annotations

from typing import Any

from prism_proxy import hookimpl

CUT = "cut-finish-SAFETY"


class Settled:
    def __init__(self) -> None:
        self.settlements: list[Any] = []

    @hookimpl
    def prism_settle(self, call, settlement):
        self.settlements.append(settlement)


async def chat(gw, **kwargs: Any):
    return await gw.openai().chat.completions.with_raw_response.create(
        model="m", messages=[{"role": "user", "content": "Hi"}], **kwargs
    )


async def test_a_cut_answer_is_served_flagged(prism_fake, start):
    gw = await start(CUT, "h")
    raw = await chat(gw)
    completion = raw.parse()
    assert raw.headers["x-prism-outcome"] == "content_filtered"
    assert raw.headers["x-prism-provider"] == CUT
    assert completion.choices[0].finish_reason == "content_filter"
    assert prism_fake.hits("h") == 0


async def test_with_empty_fallback_the_next_line_answers(prism_fake, start, log):
    gw = await start("cut-finish-RECITATION", "h", empty="fallback")
    raw = await chat(gw)
    assert raw.headers["x-prism-provider"] == "h"
    assert log(raw.headers)[0] == (
        "cut-finish-RECITATION/gemini-cut-finish-RECITATION",
        "content_filtered",
        "200",
    )


async def test_a_blocked_prompt_is_never_a_plain_answer(prism_fake, start, log):
    gw = await start("b-block-PROHIBITED_CONTENT", "h", empty="fallback")
    raw = await chat(gw)
    assert raw.headers["x-prism-provider"] == "h"
    assert log(raw.headers)[0][1] == "content_filtered"
    gw = await start("b-block-SAFETY")
    raw = await chat(gw)
    assert raw.headers["x-prism-outcome"] == "content_filtered"
    assert raw.parse().choices[0].message.content is None
    assert raw.parse().choices[0].finish_reason == "content_filter"


async def test_a_stream_cut_after_content_is_settled_as_filtered(
    prism_fake, prism_gateway, gemini_catalog
):
    settled = Settled()
    gw = await prism_gateway(
        gemini_catalog(CUT), plugins=[(settled, "settled")], load_plugins=["gemini"]
    )
    stream = await gw.openai().chat.completions.create(
        model="m", messages=[{"role": "user", "content": "Hi"}], stream=True
    )
    chunks = [chunk async for chunk in stream]
    assert [c.choices[0].finish_reason for c in chunks if c.choices][-1] == "content_filter"
    [settlement] = settled.settlements
    assert settlement.outcome == "content_filtered"
    assert settlement.served.finish_reason == "SAFETY"


async def test_an_anthropic_caller_sees_a_refusal(prism_fake, start):
    gw = await start(CUT)
    message = await gw.anthropic().messages.create(
        model="m", max_tokens=50, messages=[{"role": "user", "content": "Hi"}]
    )
    assert message.stop_reason == "refusal"
