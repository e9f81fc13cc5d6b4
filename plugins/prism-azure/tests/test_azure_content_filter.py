"""Azure's content filter, on the prompt (a 400) and on the answer (``finish_reason``),
under both of the model's ``empty`` policies."""

from __future__ import annotations

import sqlite3

import aiohttp
import openai
import pytest

from prism_proxy import Outcome
from prism_proxy.testing import eventually

from .azure_support import MESSAGES, azure, catalog


def two_lines(fake, first: str, **model) -> dict:
    return catalog(
        {"az": azure(fake, first), "az2": azure(fake, "healthy")},
        [("az", "dep"), ("az2", "dep")],
        **model,
    )


async def test_a_refused_prompt_is_a_400_content_filtered_never_retried(
    prism_fake, prism_gateway, settled
):
    gw = await prism_gateway(two_lines(prism_fake, "cfprompt", retries=2))
    with pytest.raises(openai.BadRequestError) as err:
        await gw.openai().chat.completions.create(model="m", messages=MESSAGES)
    assert err.value.status_code == 400
    body = err.value.body
    assert body["code"] == "content_filtered"
    assert "content filter of az/dep refused the prompt" in body["message"]
    assert body["attempts"][0]["outcome"] == "content_filtered"
    assert "hate" in body["attempts"][0]["reason"]  # the category, never the prompt
    # Not retried, and (empty = "return") the next line is not tried either.
    assert prism_fake.hits("cfprompt") == 1 and prism_fake.hits("healthy") == 0
    [settlement] = settled.all
    assert settlement.outcome == "content_filtered"
    assert settlement.error_code == "content_filtered" and settlement.status == 400


async def test_a_refused_prompt_falls_back_with_empty_fallback(prism_fake, prism_gateway, settled):
    gw = await prism_gateway(two_lines(prism_fake, "cfprompt", empty="fallback", retries=2))
    raw = await gw.openai().chat.completions.with_raw_response.create(model="m", messages=MESSAGES)
    assert raw.headers["x-prism-provider"] == "az2"
    assert raw.headers["x-prism-attempt-log"].startswith("az/dep content_filtered 400")
    assert "x-prism-outcome" not in raw.headers
    assert prism_fake.hits("cfprompt") == 1
    assert settled.all[0].outcome == "ok"


async def test_an_answer_cut_by_the_filter_is_returned_flagged(prism_fake, prism_gateway, settled):
    gw = await prism_gateway(two_lines(prism_fake, "cfanswer"))
    raw = await gw.openai().chat.completions.with_raw_response.create(model="m", messages=MESSAGES)
    answer = raw.parse()
    assert raw.headers["x-prism-outcome"] == "content_filtered"
    assert answer.choices[0].finish_reason == "content_filter"
    assert answer.choices[0].message.content == "Hello from"
    assert prism_fake.hits("healthy") == 0
    [settlement] = settled.all
    assert settlement.outcome == "content_filtered"
    assert settlement.error_code == "content_filtered"
    assert settlement.served is not None
    assert settlement.served.outcome is Outcome.CONTENT_FILTERED
    # Azure bills the whole generation, the withheld part too: so does the usage.
    assert settlement.usage.output_tokens == answer.usage.completion_tokens
    assert not settlement.usage.suspect


async def test_an_answer_cut_by_the_filter_falls_back_with_empty_fallback(
    prism_fake, prism_gateway, settled
):
    gw = await prism_gateway(two_lines(prism_fake, "cfanswer", empty="fallback"))
    raw = await gw.openai().chat.completions.with_raw_response.create(model="m", messages=MESSAGES)
    assert raw.parse().choices[0].finish_reason == "stop"
    assert raw.headers["x-prism-provider"] == "az2"
    assert raw.headers["x-prism-attempt-log"].startswith("az/dep content_filtered 200")
    assert settled.all[0].outcome == "ok"


async def test_every_line_filtered_under_fallback_is_a_400_content_filtered(
    prism_fake, prism_gateway
):
    gw = await prism_gateway(
        catalog(
            {"az": azure(prism_fake, "cfanswer-a"), "az2": azure(prism_fake, "cfprompt-b")},
            [("az", "dep"), ("az2", "dep")],
            empty="fallback",
        )
    )
    with pytest.raises(openai.BadRequestError) as err:
        await gw.openai().chat.completions.create(model="m", messages=MESSAGES)
    assert err.value.body["code"] == "content_filtered"
    assert [a["outcome"] for a in err.value.body["attempts"]] == [
        "content_filtered",
        "content_filtered",
    ]


async def test_a_stream_cut_after_its_first_text_is_relayed_and_recorded_filtered(
    prism_fake, prism_gateway, settled
):
    # Past the commit point nothing can fall back: the caller sees the cut (the
    # wire's own finish_reason) and the call is settled as content_filtered.
    gw = await prism_gateway(two_lines(prism_fake, "cfanswer", empty="fallback"))
    stream = await gw.openai().chat.completions.create(model="m", messages=MESSAGES, stream=True)
    text, finish = "", None
    async for chunk in stream:
        if chunk.choices:
            text += chunk.choices[0].delta.content or ""
            finish = chunk.choices[0].finish_reason or finish
    assert (text, finish) == ("Hello from", "content_filter")
    assert prism_fake.hits("healthy") == 0
    [settlement] = settled.all
    assert settlement.outcome == "content_filtered"
    assert settlement.error_code == "content_filtered"
    assert settlement.served.outcome is Outcome.CONTENT_FILTERED


async def test_a_stream_cut_before_any_text_falls_back_with_empty_fallback(
    prism_fake, prism_gateway, settled
):
    gw = await prism_gateway(two_lines(prism_fake, "cfnothing", empty="fallback"))
    stream = await gw.openai().chat.completions.with_raw_response.create(
        model="m", messages=MESSAGES, stream=True
    )
    assert stream.headers["x-prism-provider"] == "az2"
    text = ""
    async for chunk in stream.parse():
        if chunk.choices:
            text += chunk.choices[0].delta.content or ""
    assert text.startswith("Hello from dep")
    assert settled.all[0].outcome == "ok"


async def test_a_stream_cut_before_any_text_is_returned_flagged(prism_fake, prism_gateway, settled):
    gw = await prism_gateway(two_lines(prism_fake, "cfnothing"))
    stream = await gw.openai().chat.completions.with_raw_response.create(
        model="m", messages=MESSAGES, stream=True
    )
    assert stream.headers["x-prism-outcome"] == "content_filtered"
    finishes = [c.choices[0].finish_reason async for c in stream.parse() if c.choices]
    assert finishes[-1] == "content_filter"
    assert settled.all[0].outcome == "content_filtered"


async def test_anthropic_callers_see_a_filtered_answer_as_a_refusal(prism_fake, prism_gateway):
    gw = await prism_gateway(two_lines(prism_fake, "cfanswer"))
    message = await gw.anthropic().messages.create(model="m", max_tokens=50, messages=MESSAGES)
    assert message.stop_reason == "refusal"
    assert message.content[0].text == "Hello from"


async def test_the_outcome_reaches_the_ledger_and_the_metrics(prism_fake, prism_gateway, tmp_path):
    ledger = tmp_path / "ledger.sqlite"
    gw = await prism_gateway(
        catalog(
            {"az": azure(prism_fake, "cfanswer"), "az2": azure(prism_fake, "cfprompt")},
            [("az", "dep")],
        )
        | {
            "models": {
                "cut": {"chain": [{"provider": "az", "model": "dep"}]},
                "refused": {"chain": [{"provider": "az2", "model": "dep"}]},
            }
        },
        sections={"billing": {"ledger_path": str(ledger), "require_prices": "false"}},
        load_plugins=["azure", "billing", "metrics"],
    )
    client = gw.openai()
    await client.chat.completions.create(model="cut", messages=MESSAGES)
    with pytest.raises(openai.BadRequestError):
        await client.chat.completions.create(model="refused", messages=MESSAGES)

    def rows() -> list[tuple]:
        with sqlite3.connect(ledger) as db:
            return db.execute(
                "SELECT model, outcome, status, error_code, output_tokens"
                " FROM ledger ORDER BY model"
            ).fetchall()

    await eventually(lambda: ledger.exists() and len(rows()) == 2, what="two ledger rows")
    cut, refused = rows()
    assert cut[:4] == ("cut", "content_filtered", 200, "content_filtered") and cut[4] > 0
    assert refused == ("refused", "content_filtered", 400, "content_filtered", 0)
    async with aiohttp.ClientSession() as session:
        async with session.get(gw.url + "/metrics") as response:
            text = await response.text()
    for model in ("cut", "refused"):
        assert (
            f'prism_requests_total{{code="content_filtered",endpoint="chat",model="{model}",'
            f'outcome="content_filtered",route="default"}} 1.0'
        ) in text
