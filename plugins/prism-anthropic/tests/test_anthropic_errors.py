"""The Anthropic error model: ``classify_anthropic`` on its own, and through the real gateway.

The gateway tests use a chain of two anthropic bindings, ``first/claude-a``
then ``second/claude-b``, with the fake upstream's scenarios ``first`` and
``second``.  Waits between retries go through an injected ``sleep`` that
only records them (and ``random`` is fixed, so backoff delays are exact):
nothing here really sleeps.
"""

from __future__ import annotations

from typing import Any

import anthropic
import openai
import orjson
import pytest
from prism_anthropic import classify_anthropic
from prism_fake_upstream import Fault

from prism_proxy import Outcome, UpstreamResult
from prism_proxy.testing import Sleeps

PLUGINS = ["anthropic"]
MESSAGES = [{"role": "user", "content": "Hello"}]
CREDIT_MESSAGE = (
    "Your credit balance is too low to access the Anthropic API. "
    "Please go to Plans & Billing to upgrade or purchase credits."
)


def error(kind: str, message: str = "boom") -> dict[str, Any]:
    """An Anthropic error body."""
    return {"type": "error", "error": {"type": kind, "message": message}}


CREDIT_BODY = error("invalid_request_error", CREDIT_MESSAGE)


@pytest.fixture
def sleeps() -> Sleeps:
    return Sleeps()


@pytest.fixture
def start(prism_fake, prism_gateway, sleeps):
    """Start a gateway over the two-binding chain; ``random`` fixed at 0.5."""

    async def start(config: dict[str, Any] | None = None, **model: Any):
        data = {
            "providers": {
                "first": {"kind": "anthropic", "base_url": prism_fake.base_url("first")},
                "second": {"kind": "anthropic", "base_url": prism_fake.base_url("second")},
            },
            "models": {
                "m": {
                    "chain": [
                        {"provider": "first", "model": "claude-a"},
                        {"provider": "second", "model": "claude-b"},
                    ],
                    **model,
                }
            },
        }
        return await prism_gateway(
            data, config=config, sleep=sleeps, random=lambda: 0.5, load_plugins=PLUGINS
        )

    return start


def log(headers) -> list[tuple[str, str, str]]:
    """``x-prism-attempt-log`` as (binding, outcome, status) triples, in order."""
    return [tuple(entry.split()[:3]) for entry in headers["x-prism-attempt-log"].split("; ")]


async def create(gw, **kwargs: Any):
    """A Messages call through the Anthropic SDK; returns (message, headers)."""
    async with gw.anthropic() as client:
        raw = await client.messages.with_raw_response.create(
            model="m", max_tokens=100, messages=MESSAGES, **kwargs
        )
        return await raw.parse(), raw.headers


# --- through the gateway -------------------------------------------------------------------


async def test_overloaded_is_retried_with_backoff_then_fails_over(prism_fake, start, sleeps):
    prism_fake.script("first", [Fault(status=529)] * 3)
    gw = await start()
    message, headers = await create(gw)
    assert message.content[0].text.startswith("Hello from claude-b")
    assert log(headers) == [
        ("first/claude-a", "transient", "529"),
        ("first/claude-a", "transient", "529"),
        ("first/claude-a", "transient", "529"),
        ("second/claude-b", "ok", "200"),
    ]
    assert headers["x-prism-provider"] == "second"
    assert prism_fake.hits("first") == 3  # the first try and the 2 default retries
    assert prism_fake.hits("second") == 1
    # Jittered exponential backoff (base 250 ms, random() = 0.5), no Retry-After to honour.
    assert sleeps == [0.125, 0.25]


async def test_overloaded_honours_retry_after(prism_fake, start, sleeps):
    prism_fake.script("first", [Fault(status=529, headers={"retry-after": "2"})])
    gw = await start()
    message, headers = await create(gw)
    assert message.content[0].text.startswith("Hello from claude-a")
    assert log(headers) == [("first/claude-a", "transient", "529"), ("first/claude-a", "ok", "200")]
    assert sleeps == [2.0]
    assert prism_fake.hits("second") == 0


@pytest.mark.parametrize(
    ("retry_after", "waited"),
    [({"retry-after": "3"}, 3.0), ({"retry-after-ms": "1500"}, 1.5), ({}, 0.125)],
    ids=["seconds", "milliseconds", "none-backoff"],
)
async def test_rate_limit_honours_retry_after(prism_fake, start, sleeps, retry_after, waited):
    prism_fake.script("first", [Fault(status=429, headers=retry_after)])
    gw = await start()
    message, headers = await create(gw)
    assert message.content[0].text.startswith("Hello from claude-a")
    assert log(headers) == [
        ("first/claude-a", "rate_limited", "429"),
        ("first/claude-a", "ok", "200"),
    ]
    assert sleeps == [waited]
    assert prism_fake.hits("first") == 2
    assert prism_fake.hits("second") == 0


async def test_credit_balance_too_low_is_permanent_and_fails_over_at_once(
    prism_fake, start, sleeps
):
    # Anthropic says "out of money" as a 400 invalid_request_error: were it
    # taken for the caller's mistake, the caller would get a 400 and no failover.
    prism_fake.script("first", [Fault(status=400, body=CREDIT_BODY)])
    gw = await start()
    message, headers = await create(gw)
    assert message.content[0].text.startswith("Hello from claude-b")
    assert log(headers) == [
        ("first/claude-a", "permanent", "400"),
        ("second/claude-b", "ok", "200"),
    ]
    assert prism_fake.hits("first") == 1
    assert sleeps == []  # no retry, no wait


@pytest.mark.parametrize(
    ("fault", "outcome", "tries", "code", "reason"),
    [
        (Fault(status=529), "transient", 3, "upstream_unavailable", "overloaded"),
        (
            Fault(status=400, body=CREDIT_BODY),
            "permanent",
            1,
            "upstream_quota_exhausted",
            "marker: credit balance is too low",
        ),
        (
            Fault(status=401),
            "permanent",
            1,
            "upstream_auth_failed",
            "upstream refused credentials (401)",
        ),
        (
            Fault(status=403),
            "permanent",
            1,
            "upstream_auth_failed",
            "upstream refused credentials (403)",
        ),
        (
            Fault(status=402, body=error("billing_error", "Payment required.")),
            "permanent",
            1,
            "upstream_quota_exhausted",
            "billing error",
        ),
        (Fault(status=404), "permanent", 1, "upstream_model_not_found", "upstream model not found"),
        (Fault(status=429), "rate_limited", 3, "upstream_rate_limited", "rate limited"),
        (Fault(status=500), "transient", 3, "upstream_unavailable", "upstream api_error"),
        (Fault(status=504), "transient", 3, "upstream_unavailable", "upstream timeout_error"),
    ],
    ids=[
        "529-overloaded",
        "400-credit-balance",
        "401-authentication",
        "403-permission",
        "402-billing",
        "404-not-found",
        "429-rate-limit",
        "500-api-error",
        "504-timeout-error",
    ],
)
async def test_a_spent_chain_answers_503_with_the_code(
    prism_fake, start, sleeps, fault, outcome, tries, code, reason
):
    prism_fake.script("first", [fault] * tries)
    prism_fake.script("second", [fault] * tries)
    gw = await start()
    with pytest.raises(anthropic.APIStatusError) as info:
        await create(gw)
    err = info.value
    assert err.status_code == 503
    assert err.body["type"] == "error"
    assert err.body["error"]["code"] == code
    status = str(fault.status)
    expected = [("first/claude-a", outcome, status)] * tries
    expected += [("second/claude-b", outcome, status)] * tries
    assert log(err.response.headers) == expected
    assert err.response.headers["x-prism-attempts"] == str(2 * tries)
    attempts = err.body["error"]["attempts"]
    assert [(a["binding"], a["outcome"], a["status"]) for a in attempts] == [
        (b, o, int(s)) for b, o, s in expected
    ]
    assert {a["reason"] for a in attempts} == {reason}
    assert prism_fake.hits("first") == tries
    assert prism_fake.hits("second") == tries
    assert len(sleeps) == 2 * (tries - 1)  # waits only between retries of one binding


async def test_the_error_type_decides_before_the_status(prism_fake, start, sleeps):
    # A proxy in front of Anthropic answering 500 for a refused key: the body
    # says authentication_error, so it is permanent (a bare 500 would be retried).
    prism_fake.script("first", [Fault(status=500, body=error("authentication_error"))])
    prism_fake.script("second", [Fault(status=503, body=error("overloaded_error")), Fault()])
    gw = await start()
    message, headers = await create(gw)
    assert message.content[0].text.startswith("Hello from claude-b")
    assert log(headers) == [
        ("first/claude-a", "permanent", "500"),
        ("second/claude-b", "transient", "503"),
        ("second/claude-b", "ok", "200"),
    ]
    assert prism_fake.hits("first") == 1
    assert sleeps == [0.125]


async def test_only_anthropic_answers_get_the_anthropic_model(prism_fake, prism_gateway, sleeps):
    # The same answer from an openai binding and from an anthropic one: only
    # the anthropic attempt is read by its error.type (the other is a 500).
    refused = Fault(status=500, body=error("authentication_error"))
    prism_fake.script("gpt", [refused] * 3)
    prism_fake.script("claude", [refused] * 3)
    data = {
        "providers": {
            "gpt": {"kind": "openai", "base_url": prism_fake.base_url("gpt")},
            "claude": {"kind": "anthropic", "base_url": prism_fake.base_url("claude")},
        },
        "models": {
            "m": {
                "chain": [
                    {"provider": "gpt", "model": "gpt-x"},
                    {"provider": "claude", "model": "claude-y"},
                ]
            }
        },
    }
    gw = await prism_gateway(
        data, sleep=sleeps, random=lambda: 0.5, load_plugins=["anthropic", "openai"]
    )
    with pytest.raises(anthropic.APIStatusError) as info:
        await create(gw)
    assert info.value.status_code == 503
    assert info.value.body["error"]["code"] == "upstream_auth_failed"
    assert log(info.value.response.headers) == [
        *[("gpt/gpt-x", "transient", "500")] * 3,
        ("claude/claude-y", "permanent", "500"),
    ]
    assert prism_fake.hits("gpt") == 3
    assert prism_fake.hits("claude") == 1


@pytest.mark.parametrize(
    "fault",
    [
        Fault(status=400, body=error("invalid_request_error", "messages: roles must alternate")),
        Fault(status=413, body=error("request_too_large", "Request exceeds the maximum size")),
    ],
    ids=["400-invalid-request", "413-request-too-large"],
)
async def test_a_request_error_is_passed_through_unchanged(prism_fake, start, sleeps, fault):
    prism_fake.script("first", [fault])
    gw = await start()
    with pytest.raises(anthropic.APIStatusError) as info:
        await create(gw)
    err = info.value
    assert err.status_code == fault.status
    # The upstream's own body, byte for byte: no Prism code, no attempt list.
    assert err.response.content == orjson.dumps(fault.body)
    assert log(err.response.headers) == [("first/claude-a", "request_error", str(fault.status))]
    assert prism_fake.hits("first") == 1
    assert prism_fake.hits("second") == 0  # the caller's mistake: no failover
    assert sleeps == []


async def test_a_request_error_reaches_an_openai_caller_in_its_own_shape(prism_fake, start, sleeps):
    prism_fake.script(
        "first", [Fault(status=400, body=error("invalid_request_error", "prompt is too long"))]
    )
    gw = await start()
    with pytest.raises(openai.BadRequestError) as info:
        await gw.openai().chat.completions.create(model="m", messages=MESSAGES)
    err = info.value
    assert err.status_code == 400
    assert err.code == "upstream_request_error"
    assert err.body["message"] == "prompt is too long"
    assert prism_fake.hits("second") == 0


async def test_an_error_event_before_content_is_transient(prism_fake, start, sleeps):
    # The API's mid-stream overload: 200, then event: error before any content.
    prism_fake.script("first", [Fault(stream_error={})] * 3)
    gw = await start()
    async with gw.anthropic().messages.stream(
        model="m", max_tokens=100, messages=MESSAGES
    ) as stream:
        text = "".join([t async for t in stream.text_stream])
    assert text == "Hello from claude-b. This is the fake upstream answering."
    assert prism_fake.hits("first") == 3
    assert prism_fake.hits("second") == 1
    assert sleeps == [0.125, 0.25]

    # The reason recorded is Anthropic's: overloaded.
    prism_fake.script("first", [Fault(stream_error={})] * 3)
    prism_fake.script("second", [Fault(stream_error={"type": "api_error"})] * 3)
    with pytest.raises(anthropic.APIStatusError) as info:
        async with gw.anthropic().messages.stream(
            model="m", max_tokens=100, messages=MESSAGES
        ) as stream:
            await stream.get_final_message()
    assert info.value.status_code == 503
    attempts = info.value.body["error"]["attempts"]
    assert [(a["binding"], a["outcome"], a["status"], a["reason"]) for a in attempts] == [
        *[("first/claude-a", "transient", 200, "overloaded")] * 3,
        *[("second/claude-b", "transient", 200, "upstream api_error")] * 3,
    ]


@pytest.mark.parametrize("policy", ["return", "fallback"])
async def test_max_tokens_with_no_content_is_empty(prism_fake, start, policy):
    prism_fake.script("first", [Fault(empty_length=True)])
    gw = await start(empty=policy)
    message, headers = await create(gw)
    if policy == "return":
        assert message.content == [] and message.stop_reason == "max_tokens"
        assert log(headers) == [("first/claude-a", "empty", "200")]
        assert headers["x-prism-outcome"] == "empty"
    else:
        assert message.content[0].text.startswith("Hello from claude-b")
        assert log(headers) == [
            ("first/claude-a", "empty", "200"),
            ("second/claude-b", "ok", "200"),
        ]


async def test_operator_markers_make_a_message_permanent(prism_fake, start, sleeps):
    disabled = error("invalid_request_error", "This organization has been disabled.")
    prism_fake.script("first", [Fault(status=400, body=disabled)] * 2)
    # Without the marker: the caller's mistake, passed through.
    gw = await start()
    with pytest.raises(anthropic.BadRequestError):
        await create(gw)
    assert prism_fake.hits("second") == 0
    # With it: permanent, and the chain moves on.
    gw = await start(config={"permanent_markers": "organization has been disabled"})
    message, headers = await create(gw)
    assert message.content[0].text.startswith("Hello from claude-b")
    assert log(headers) == [
        ("first/claude-a", "permanent", "400"),
        ("second/claude-b", "ok", "200"),
    ]


# --- classify_anthropic on its own ---------------------------------------------------------


def result(status: int | None, body: Any = None, headers: dict | None = None, **kw: Any):
    raw = body if isinstance(body, bytes) else (b"" if body is None else orjson.dumps(body))
    return UpstreamResult(status, headers or {}, raw, wire="anthropic", **kw)


def message(content: list, stop_reason: str = "end_turn") -> dict[str, Any]:
    return {"type": "message", "role": "assistant", "content": content, "stop_reason": stop_reason}


TEXT = [{"type": "text", "text": "Hi"}]
TOOL = [{"type": "tool_use", "id": "toolu_1", "name": "f", "input": {}}]
AUTH, QUOTA, NOT_FOUND = (
    "upstream_auth_failed",
    "upstream_quota_exhausted",
    "upstream_model_not_found",
)


def case(name: str, status: int, body: Any, outcome: Outcome, code=None, wait=None, **kw: Any):
    """One row: ``name``, what the upstream said, the verdict expected (``wait``: Retry-After)."""
    return pytest.param(result(status, body, **kw), outcome, code, wait, id=name)


EMPTY_TEXT = [{"type": "text", "text": ""}]
MAX_TOKENS_DELTA = {"type": "message_delta", "delta": {"stop_reason": "max_tokens"}}


@pytest.mark.parametrize(
    ("upstream", "outcome", "code", "retry_after"),
    [
        # Answers.
        case("200-text", 200, message(TEXT), Outcome.OK),
        case("200-tool-use-cut", 200, message(TOOL, "max_tokens"), Outcome.OK),
        case("200-text-cut", 200, message(TEXT, "max_tokens"), Outcome.OK),
        case("200-nothing-cut", 200, message([], "max_tokens"), Outcome.EMPTY),
        case("200-empty-text-cut", 200, message(EMPTY_TEXT, "max_tokens"), Outcome.EMPTY),
        case("200-nothing-end-turn", 200, message([], "end_turn"), Outcome.OK),
        case("200-stream-cut-before-content", 200, MAX_TOKENS_DELTA, Outcome.EMPTY),
        case("200-not-json", 200, b"<html>proxy error</html>", Outcome.TRANSIENT),
        case(
            "200-stream-broken",
            200,
            None,
            Outcome.BROKEN_STREAM,
            stream_broken=True,
            streaming=True,
        ),
        # An error event inside a 200 stream, before any content.
        case("200-event-overloaded", 200, error("overloaded_error"), Outcome.TRANSIENT),
        case("200-event-api-error", 200, error("api_error"), Outcome.TRANSIENT),
        case(
            "200-event-invalid-request", 200, error("invalid_request_error"), Outcome.REQUEST_ERROR
        ),
        # Billing and credential markers decide before anything else.
        case("400-credit-balance", 400, CREDIT_BODY, Outcome.PERMANENT, QUOTA),
        case(
            "529-credit-balance",
            529,
            error("overloaded_error", "credit balance is too low"),
            Outcome.PERMANENT,
            QUOTA,
        ),
        case(
            "400-invalid-api-key-marker",
            400,
            error("invalid_request_error", "invalid_api_key"),
            Outcome.PERMANENT,
            AUTH,
        ),
        # Overloaded, by type or status; Retry-After is read.
        case("529-overloaded", 529, error("overloaded_error"), Outcome.TRANSIENT),
        case(
            "529-retry-after", 529, None, Outcome.TRANSIENT, wait=4.0, headers={"retry-after": "4"}
        ),
        case("503-overloaded", 503, error("overloaded_error"), Outcome.TRANSIENT),
        # Rate limits.
        case(
            "429-retry-after",
            429,
            error("rate_limit_error"),
            Outcome.RATE_LIMITED,
            wait=7.0,
            headers={"retry-after": "7"},
        ),
        case(
            "429-retry-after-ms",
            429,
            None,
            Outcome.RATE_LIMITED,
            wait=0.25,
            headers={"retry-after-ms": "250"},
        ),
        case("403-rate-limit-type", 403, error("rate_limit_error"), Outcome.RATE_LIMITED),
        # Credentials.
        case(
            "401-authentication",
            401,
            error("authentication_error", "invalid x-api-key"),
            Outcome.PERMANENT,
            AUTH,
        ),
        case("403-permission", 403, error("permission_error"), Outcome.PERMANENT, AUTH),
        case(
            "500-authentication-type", 500, error("authentication_error"), Outcome.PERMANENT, AUTH
        ),
        case("401-plain-text", 401, b"Unauthorized", Outcome.PERMANENT, AUTH),
        # Money.
        case("402-billing", 402, error("billing_error"), Outcome.PERMANENT, QUOTA),
        case("400-billing-type", 400, error("billing_error"), Outcome.PERMANENT, QUOTA),
        # A broken catalog line.
        case(
            "404-not-found",
            404,
            error("not_found_error", "model: claude-nope"),
            Outcome.PERMANENT,
            NOT_FOUND,
        ),
        case("404-plain-text", 404, b"Not Found", Outcome.PERMANENT, NOT_FOUND),
        # The caller's mistake.
        case("400-invalid-request", 400, error("invalid_request_error"), Outcome.REQUEST_ERROR),
        case("413-request-too-large", 413, error("request_too_large"), Outcome.REQUEST_ERROR),
        case("422-no-body", 422, None, Outcome.REQUEST_ERROR),
        case("500-request-too-large-type", 500, error("request_too_large"), Outcome.REQUEST_ERROR),
        # Anything else on the server's side.
        case("500-api-error", 500, error("api_error"), Outcome.TRANSIENT),
        case("504-timeout-error", 504, error("timeout_error"), Outcome.TRANSIENT),
        case(
            "502-html-retry-after",
            502,
            b"<html>Bad Gateway</html>",
            Outcome.TRANSIENT,
            wait=1.0,
            headers={"retry-after": "1"},
        ),
    ],
)
def test_classify_anthropic(upstream, outcome, code, retry_after):
    verdict = classify_anthropic(upstream)
    assert verdict is not None
    assert verdict.outcome is outcome
    assert verdict.code == code
    assert verdict.retry_after_s == retry_after
    # Reasons are short and never quote the body.
    assert "boom" not in verdict.reason and "claude-nope" not in verdict.reason


@pytest.mark.parametrize(
    "upstream",
    [
        result(None, error=ConnectionResetError()),
        result(None, timed_out=True),
        result(200, message(TEXT), error=ConnectionResetError()),
        result(529, error("overloaded_error"), timed_out=True),
    ],
    ids=["no-answer", "timeout", "broken-after-200", "timeout-after-status"],
)
def test_classify_anthropic_leaves_failures_without_an_answer_to_the_default(upstream):
    assert classify_anthropic(upstream) is None


def test_extra_markers_are_permanent_and_name_their_kind():
    disabled = result(400, error("invalid_request_error", "This Organization Has Been Disabled"))
    assert classify_anthropic(disabled).outcome is Outcome.REQUEST_ERROR
    verdict = classify_anthropic(disabled, ("organization has been disabled",))
    assert (verdict.outcome, verdict.code) == (Outcome.PERMANENT, QUOTA)
    revoked = result(400, error("invalid_request_error", "workspace key revoked"))
    verdict = classify_anthropic(revoked, ("key revoked",))
    assert (verdict.outcome, verdict.code) == (Outcome.PERMANENT, AUTH)
