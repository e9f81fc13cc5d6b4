"""The ``gemini`` wire on its own: events, usage, finish reasons, 200s that are no answer."""

from __future__ import annotations

import orjson
import pytest
from prism_fake_upstream import Fault
from prism_gemini import GEMINI

from prism_proxy import ChunkKind, Endpoint, Usage


def chunk(parts=None, finish=None, **more):
    candidate: dict = {"content": {"role": "model", "parts": parts or []}, "index": 0}
    if finish:
        candidate["finishReason"] = finish
    return orjson.dumps({"candidates": [candidate], **more})


@pytest.mark.parametrize(
    ("data", "kind"),
    [
        (chunk([{"text": "Hi"}]), ChunkKind.CONTENT),
        (chunk([{"text": ""}]), ChunkKind.PRELUDE),
        (chunk([{"text": "musing", "thought": True}]), ChunkKind.PRELUDE),
        (chunk([{"functionCall": {"name": "f", "args": {}}}]), ChunkKind.CONTENT),
        (chunk([], "STOP"), ChunkKind.CONTENT),
        (orjson.dumps({"promptFeedback": {"blockReason": "SAFETY"}}), ChunkKind.CONTENT),
        (orjson.dumps({"usageMetadata": {"promptTokenCount": 3}}), ChunkKind.USAGE),
        (orjson.dumps({"error": {"code": 503, "status": "UNAVAILABLE"}}), ChunkKind.ERROR),
        (orjson.dumps([1, 2]), ChunkKind.ERROR),
        (b"{not json", ChunkKind.INVALID),
    ],
)
def test_stream_events(data, kind):
    assert GEMINI.inspect(data)[0] is kind


def test_digest_counts_text_and_arguments_and_gives_the_raw_reason():
    _, payload = GEMINI.inspect(
        chunk([{"text": "abc"}, {"functionCall": {"name": "f", "args": {"a": 1}}}], "SAFETY")
    )
    assert GEMINI.digest(payload) == (3 + len('{"a":1}'), "SAFETY")
    assert "SAFETY" in GEMINI.filtered and "STOP" not in GEMINI.filtered
    blocked = {"promptFeedback": {"blockReason": "OTHER"}}
    assert GEMINI.finish_reason(blocked) == "PROMPT_BLOCKED"


def test_usage_counts_thinking_as_output_and_cached_tokens_as_input():
    payload = {
        "usageMetadata": {
            "promptTokenCount": 10,
            "cachedContentTokenCount": 4,
            "candidatesTokenCount": 5,
            "thoughtsTokenCount": 7,
            "totalTokenCount": 22,
        }
    }
    assert GEMINI.usage_update(None, payload) == Usage(
        input_tokens=10, output_tokens=12, cached_input_tokens=4, reasoning_tokens=7
    )
    assert GEMINI.usage_update(None, {"usageMetadata": {"promptTokenCount": -1}}).suspect


@pytest.mark.parametrize(
    ("endpoint", "payload", "problem"),
    [
        (Endpoint.CHAT, {}, "answer without candidates"),
        (Endpoint.CHAT, {"candidates": "x"}, "answer without candidates"),
        (Endpoint.CHAT, {"candidates": [{"content": "x"}]}, "not an object"),
        (Endpoint.CHAT, {"candidates": [{"finishReason": "SAFETY"}]}, None),
        (Endpoint.CHAT, {"promptFeedback": {"blockReason": "SAFETY"}}, None),
        (Endpoint.EMBEDDINGS, {"embedding": {"values": [0.1]}}, None),
        (Endpoint.EMBEDDINGS, {"embeddings": [{}]}, "no values"),
        (Endpoint.EMBEDDINGS, {}, "without embeddings"),
    ],
)
def test_answer_problem(endpoint, payload, problem):
    found = GEMINI.answer_problem(endpoint, payload)
    assert found == problem if problem is None else problem in found


async def test_a_200_that_is_no_answer_fails_over(prism_fake, start, log):
    prism_fake.script("g", [Fault(body={"candidates": "nonsense"})])
    gw = await start("g", "h", retries=0)
    raw = await gw.openai().chat.completions.with_raw_response.create(
        model="m", messages=[{"role": "user", "content": "Hi"}]
    )
    assert log(raw.headers) == [("g/gemini-g", "transient", "200"), ("h/gemini-h", "ok", "200")]
