"""Bedrock's errors, by ``x-amzn-ErrorType`` and exception frame, through the real gateway.

A chain of two bedrock lines, ``first`` then ``second`` (the fake's
scenarios); waits between retries go through an injected ``sleep`` that only
records them: nothing here really sleeps.
"""

from __future__ import annotations

from typing import Any

import openai
import pytest
from prism_bedrock import classify_bedrock
from prism_fake_upstream import Fault

from prism_proxy import Outcome, UpstreamResult
from prism_proxy.testing import Sleeps

from .bedrock_support import MESSAGES, PLUGINS


@pytest.fixture
def start(prism_gateway, catalog):
    sleeps = Sleeps()

    async def start(**model: Any):
        data = catalog(("first", "model-a:0"), ("second", "model-b:0"), **model)
        return await prism_gateway(data, sleep=sleeps, random=lambda: 0.5, load_plugins=PLUGINS)

    return start


def log(headers) -> list[tuple[str, str, str]]:
    return [tuple(entry.split()[:3]) for entry in headers["x-prism-attempt-log"].split("; ")]


async def chat(gw, **kwargs: Any):
    raw = await gw.openai().chat.completions.with_raw_response.create(
        model="m", messages=MESSAGES, **kwargs
    )
    return raw.parse(), raw.headers


def aws_error(status: int, kind: str) -> Fault:
    """An error as Bedrock sends it: the type in ``x-amzn-ErrorType``, the fake's usual message."""
    return Fault(status=status, headers={"x-amzn-ErrorType": kind})


@pytest.mark.parametrize(
    ("status", "kind", "outcome"),
    [
        (429, "ThrottlingException", "rate_limited"),
        (429, "ModelNotReadyException", "transient"),
        (408, "ModelTimeoutException", "transient"),
        (424, "ModelErrorException", "transient"),
        (503, "ServiceUnavailableException", "transient"),
        (500, "InternalServerException", "transient"),
    ],
)
async def test_retryable_errors_fail_over(prism_fake, start, status, kind, outcome):
    prism_fake.script("first", [aws_error(status, kind)] * 3)
    gw = await start()
    completion, headers = await chat(gw)
    assert completion.choices[0].message.content.startswith("Hello from model-b:0")
    entries = log(headers)
    assert entries[0] == ("first/model-a:0", outcome, str(status))
    assert entries[-1] == ("second/model-b:0", "ok", "200")
    assert all(entry[1] == outcome for entry in entries[:-1])


@pytest.mark.parametrize(
    ("status", "kind", "code"),
    [
        (400, "ServiceQuotaExceededException", "upstream_quota_exhausted"),
        (403, "AccessDeniedException", "upstream_auth_failed"),
        (404, "ResourceNotFoundException", "upstream_model_not_found"),
    ],
)
async def test_a_broken_line_is_permanent_and_fails_over_at_once(
    prism_fake, start, status, kind, code
):
    prism_fake.script("first", [aws_error(status, kind)])
    gw = await start()
    completion, headers = await chat(gw)
    assert completion.choices[0].message.content.startswith("Hello from model-b:0")
    assert log(headers) == [
        ("first/model-a:0", "permanent", str(status)),
        ("second/model-b:0", "ok", "200"),
    ]
    assert prism_fake.hits("first") == 1


async def test_a_validation_error_is_the_callers(prism_fake, start):
    prism_fake.script(
        "first",
        [
            Fault(
                status=400,
                body={"message": "messages.0: bad"},
                headers={"x-amzn-ErrorType": "ValidationException"},
            )
        ],
    )
    gw = await start()
    with pytest.raises(openai.BadRequestError) as caught:
        await chat(gw)
    assert "request_error" in caught.value.response.headers["x-prism-attempt-log"]
    assert prism_fake.hits("second") == 0


async def test_an_exception_frame_before_content_fails_over(prism_fake, start):
    prism_fake.script(
        "first", [Fault(stream_error={"type": "throttlingException", "message": "slow down"})] * 3
    )
    gw = await start()
    stream = await gw.openai().chat.completions.with_raw_response.create(
        model="m", messages=MESSAGES, stream=True
    )
    chunks = [chunk async for chunk in stream.parse()]
    text = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    assert text.startswith("Hello from model-b:0")
    assert log(stream.headers)[0] == ("first/model-a:0", "rate_limited", "200")
    assert log(stream.headers)[-1] == ("second/model-b:0", "ok", "200")


async def test_a_model_stream_error_mid_stream_breaks_the_stream(prism_fake, start):
    prism_fake.script(
        "first",
        [
            Fault(
                die_after_chunks=3,
                stream_error={"type": "modelStreamErrorException", "message": "boom"},
            )
        ],
    )
    gw = await start()
    stream = await gw.openai().chat.completions.create(model="m", messages=MESSAGES, stream=True)
    received: list[str] = []
    with pytest.raises(openai.APIError) as caught:
        async for chunk in stream:
            if chunk.choices:
                received.append(chunk.choices[0].delta.content or "")
    # What came before the break was delivered; nothing from the second line was spliced in.
    assert "".join(received) == "Hello from model-a:0."
    assert caught.value.code == "upstream_stream_broken"
    assert "broke after the answer started" in caught.value.message
    assert prism_fake.hits("second") == 0


async def test_a_bad_secret_is_refused_by_the_signature_check(prism_fake, start, aws_env):
    aws_env.setenv("AWS_SECRET_ACCESS_KEY", "not-the-secret")
    gw = await start()
    with pytest.raises(openai.APIStatusError) as caught:
        await chat(gw)
    headers = caught.value.response.headers
    assert log(headers) == [
        ("first/model-a:0", "permanent", "403"),
        ("second/model-b:0", "permanent", "403"),
    ]
    assert "not-the-secret" not in caught.value.response.text


def test_classify_reads_the_error_type_header_and_exception_events():
    def result(status: int, body: bytes, **headers: str) -> UpstreamResult:
        return UpstreamResult(status, headers, body, wire="bedrock")

    throttled = classify_bedrock(
        result(429, b'{"message":"x"}', **{"x-amzn-ErrorType": "ThrottlingException:http://x/"})
    )
    assert throttled is not None and throttled.outcome is Outcome.RATE_LIMITED
    event = classify_bedrock(result(200, b'{"modelStreamErrorException":{"message":"x"}}'))
    assert event is not None and event.outcome is Outcome.TRANSIENT
    quota = classify_bedrock(
        result(400, b'{"message":"x"}', **{"x-amzn-ErrorType": "ServiceQuotaExceededException"})
    )
    assert quota is not None and quota.code == "upstream_quota_exhausted"
    empty = classify_bedrock(result(200, b'{"messageStop":{"stopReason":"max_tokens"}}'))
    assert empty is not None and empty.outcome is Outcome.EMPTY
