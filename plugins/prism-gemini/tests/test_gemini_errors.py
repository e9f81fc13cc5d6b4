"""Google's error model: ``classify_gemini`` on real bodies, and through the gateway.

Lines ``g/gemini-g`` then ``h/gemini-h`` (the fake's scenarios ``g`` and ``h``);
pauses between retries are recorded, never slept.
"""

from __future__ import annotations

import logging
from typing import Any

import openai
import pytest
from prism_fake_upstream import Fault
from prism_gemini import classify_gemini

from prism_proxy import Outcome, UpstreamResult

_T = "type.googleapis.com/google.rpc."
PER_MINUTE = {
    "error": {
        "code": 429,
        "message": "You exceeded your current quota, please check your plan and billing details. "
        "* Quota exceeded for metric: generativelanguage.googleapis.com/"
        "generate_content_free_tier_requests, limit: 10, model: gemini-2.5-flash\n"
        "Please retry in 7.2s.",
        "status": "RESOURCE_EXHAUSTED",
        "details": [
            {
                "@type": _T + "QuotaFailure",
                "violations": [
                    {
                        "quotaMetric": "generativelanguage.googleapis.com/"
                        "generate_content_free_tier_requests",
                        "quotaId": "GenerateRequestsPerMinutePerProjectPerModel-FreeTier",
                        "quotaDimensions": {"location": "global", "model": "gemini-2.5-flash"},
                        "quotaValue": "10",
                    }
                ],
            },
            {"@type": _T + "Help", "links": [{"description": "Learn more", "url": "https://x"}]},
            {"@type": _T + "RetryInfo", "retryDelay": "7s"},
        ],
    }
}
PER_DAY: dict[str, Any] = {
    "error": {
        **PER_MINUTE["error"],
        "details": [
            {
                "@type": _T + "QuotaFailure",
                "violations": [
                    {
                        "quotaMetric": "generativelanguage.googleapis.com/"
                        "generate_content_free_tier_requests",
                        "quotaId": "GenerateRequestsPerDayPerProjectPerModel-FreeTier",
                        "quotaValue": "250",
                    }
                ],
            },
            {"@type": _T + "RetryInfo", "retryDelay": "43s"},
        ],
    }
}
VERTEX_429 = {
    "error": {
        "code": 429,
        "message": "Resource exhausted. Please try again later. Please refer to "
        "https://cloud.google.com/vertex-ai/generative-ai/docs/error-code-429 for more details.",
        "status": "RESOURCE_EXHAUSTED",
    }
}
BAD_KEY = {
    "error": {
        "code": 400,
        "message": "API key not valid. Please pass a valid API key.",
        "status": "INVALID_ARGUMENT",
        "details": [
            {
                "@type": _T + "ErrorInfo",
                "reason": "API_KEY_INVALID",
                "domain": "googleapis.com",
                "metadata": {"service": "generativelanguage.googleapis.com"},
            }
        ],
    }
}


def body(code: int, status: str, message: str = "boom") -> dict[str, Any]:
    return {"error": {"code": code, "message": message, "status": status}}


@pytest.mark.parametrize(
    ("status", "payload", "outcome", "code", "wait"),
    [
        (429, PER_MINUTE, Outcome.RATE_LIMITED, None, 7.0),
        (429, PER_DAY, Outcome.PERMANENT, "upstream_quota_exhausted", None),
        (429, VERTEX_429, Outcome.RATE_LIMITED, None, None),
        (503, body(503, "UNAVAILABLE", "The model is overloaded."), Outcome.TRANSIENT, None, None),
        (500, body(500, "INTERNAL"), Outcome.TRANSIENT, None, None),
        (504, body(504, "DEADLINE_EXCEEDED"), Outcome.TRANSIENT, None, None),
        (400, body(400, "INVALID_ARGUMENT"), Outcome.REQUEST_ERROR, None, None),
        (400, BAD_KEY, Outcome.PERMANENT, "upstream_auth_failed", None),
        (403, body(403, "PERMISSION_DENIED"), Outcome.PERMANENT, "upstream_auth_failed", None),
        (401, body(401, "UNAUTHENTICATED"), Outcome.PERMANENT, "upstream_auth_failed", None),
        (404, body(404, "NOT_FOUND"), Outcome.PERMANENT, "upstream_model_not_found", None),
        (
            400,
            body(400, "FAILED_PRECONDITION", "User location is not supported for the API use."),
            Outcome.PERMANENT,
            "upstream_quota_exhausted",
            None,
        ),
    ],
)
def test_classify_gemini(status, payload, outcome, code, wait):
    import orjson

    verdict = classify_gemini(UpstreamResult(status, {}, orjson.dumps(payload), wire="gemini"))
    assert verdict is not None
    assert (verdict.outcome, verdict.code, verdict.retry_after_s) == (outcome, code, wait)


async def chat(gw, **kwargs: Any):
    return await gw.openai().chat.completions.with_raw_response.create(
        model="m", messages=[{"role": "user", "content": "Hi"}], **kwargs
    )


async def test_a_per_minute_limit_waits_as_told_then_fails_over(prism_fake, start, sleeps, log):
    prism_fake.script("g", [Fault(status=429, body=PER_MINUTE)] * 2)
    gw = await start("g", "h", retries=1)
    raw = await chat(gw)
    assert raw.headers["x-prism-provider"] == "h"
    assert log(raw.headers) == [
        ("g/gemini-g", "rate_limited", "429"),
        ("g/gemini-g", "rate_limited", "429"),
        ("h/gemini-h", "ok", "200"),
    ]
    assert sleeps == [7.0]


async def test_a_spent_daily_quota_fails_over_at_once(prism_fake, start, sleeps, log):
    prism_fake.script("g", [Fault(status=429, body=PER_DAY)])
    gw = await start("g", "h", retries=3)
    raw = await chat(gw)
    assert log(raw.headers) == [("g/gemini-g", "permanent", "429"), ("h/gemini-h", "ok", "200")]
    assert sleeps == []


async def test_unavailable_is_retried_with_backoff_then_fails_over(prism_fake, start, sleeps, log):
    prism_fake.script("g", [Fault(status=503)] * 2)
    gw = await start("g", "h", retries=1)
    raw = await chat(gw, stream=True)
    assert log(raw.headers) == [
        ("g/gemini-g", "transient", "503"),
        ("g/gemini-g", "transient", "503"),
        ("h/gemini-h", "ok", "200"),
    ]
    assert len(sleeps) == 1
    assert raw.parse() is not None


async def test_permission_denied_fails_over_and_the_last_error_is_coded(prism_fake, start, log):
    prism_fake.script("g", [Fault(status=403)])
    prism_fake.script("h", [Fault(status=403)])
    gw = await start("g", "h")
    with pytest.raises(openai.APIStatusError) as info:
        await chat(gw)
    assert info.value.body["code"] == "upstream_auth_failed"
    assert [(a["binding"], a["outcome"]) for a in info.value.body["attempts"]] == [
        ("g/gemini-g", "permanent"),
        ("h/gemini-h", "permanent"),
    ]


async def test_invalid_argument_is_the_callers_error_in_its_own_shape(prism_fake, start):
    message = "* GenerateContentRequest.generation_config.temperature: must be <= 2"
    prism_fake.script("g", [Fault(status=400, body=body(400, "INVALID_ARGUMENT", message))])
    gw = await start("g", "h")
    with pytest.raises(openai.BadRequestError) as info:
        await chat(gw)
    assert info.value.body["message"] == message
    assert prism_fake.hits("h") == 0


async def test_a_stream_that_breaks_before_content_fails_over(prism_fake, start, log):
    prism_fake.script("g", [Fault(die_after_chunks=0)])
    gw = await start("g", "h", retries=0)
    raw = await chat(gw, stream=True)
    assert log(raw.headers) == [
        ("g/gemini-g", "broken_stream", "200"),
        ("h/gemini-h", "ok", "200"),
    ]


async def test_an_error_event_before_content_fails_over(prism_fake, start, log):
    prism_fake.script("g", [Fault(stream_error={})])
    gw = await start("g", "h", retries=0)
    raw = await chat(gw, stream=True)
    assert log(raw.headers) == [("g/gemini-g", "transient", "200"), ("h/gemini-h", "ok", "200")]


async def test_a_stream_broken_mid_way_ends_with_an_error_for_the_caller(prism_fake, start):
    prism_fake.script("g", [Fault(die_after_chunks=3)])
    gw = await start("g", "h")
    stream = await gw.openai().chat.completions.create(
        model="m", messages=[{"role": "user", "content": "Hi"}], stream=True
    )
    texts = []
    with pytest.raises(openai.APIError):
        async for chunk in stream:
            texts.append(chunk.choices[0].delta.content or "" if chunk.choices else "")
    assert "".join(texts) == "Hello from gemini-g."
    assert prism_fake.hits("h") == 0


async def test_the_api_key_never_reaches_logs_or_error_bodies(
    prism_fake, start, caplog, gemini_key
):
    caplog.set_level(logging.DEBUG)
    prism_fake.script("g", [Fault(status=400, body=BAD_KEY)])
    prism_fake.script("h", [Fault(status=403)])
    gw = await start("g", "h")
    with pytest.raises(openai.APIStatusError) as info:
        await chat(gw)
    assert info.value.body["code"] == "upstream_auth_failed"
    # The key went upstream, and nowhere else.
    assert prism_fake.requests("g")[0].headers["x-goog-api-key"] == gemini_key
    assert gemini_key not in caplog.text
    assert gemini_key not in info.value.response.text
