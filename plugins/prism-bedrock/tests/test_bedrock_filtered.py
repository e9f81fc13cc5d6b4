"""A guardrail or content filter that cuts the answer: stopReason guardrail_intervened /
content_filtered, in the wire's ``filtered``, follows the model's ``empty`` policy."""

from __future__ import annotations

from typing import Any

import pytest

from prism_proxy import hookimpl

from .bedrock_support import MESSAGES, PLUGINS


@pytest.mark.parametrize("scenario", ["guardrail", "contentfiltered"])
async def test_a_filtered_answer_is_served_flagged(prism_fake, prism_gateway, catalog, scenario):
    gw = await prism_gateway(catalog((scenario, "model-a:0")), load_plugins=PLUGINS)
    raw = await gw.openai().chat.completions.with_raw_response.create(model="m", messages=MESSAGES)
    completion = raw.parse()
    assert completion.choices[0].finish_reason == "content_filter"
    assert raw.headers["x-prism-outcome"] == "content_filtered"
    assert raw.headers["x-prism-attempt-log"].startswith(f"{scenario}/model-a:0 content_filtered")


class Settled:
    def __init__(self) -> None:
        self.outcomes: list[Any] = []

    @hookimpl
    def prism_settle(self, call, settlement):
        self.outcomes.append(settlement.outcome)


async def test_a_filtered_stream_is_settled_filtered(prism_fake, prism_gateway, catalog):
    settled = Settled()
    gw = await prism_gateway(
        catalog(("guardrail", "model-a:0")),
        plugins=[(settled, "settled")],
        load_plugins=PLUGINS,
    )
    stream = await gw.openai().chat.completions.with_raw_response.create(
        model="m", messages=MESSAGES, stream=True
    )
    chunks = [c async for c in stream.parse()]
    finishes = [
        c.choices[0].finish_reason for c in chunks if c.choices and c.choices[0].finish_reason
    ]
    assert finishes == ["content_filter"]
    assert settled.outcomes == ["content_filtered"]


async def test_with_empty_fallback_the_next_line_answers(prism_fake, prism_gateway, catalog):
    data = catalog(("guardrail", "model-a:0"), ("ok", "model-b:0"), empty="fallback")
    gw = await prism_gateway(data, load_plugins=PLUGINS)
    raw = await gw.openai().chat.completions.with_raw_response.create(model="m", messages=MESSAGES)
    assert raw.parse().choices[0].message.content.startswith("Hello from model-b:0")
    entries = raw.headers["x-prism-attempt-log"].split("; ")
    assert entries[0].startswith("guardrail/model-a:0 content_filtered")
    assert entries[-1].startswith("ok/model-b:0 ok 200")
