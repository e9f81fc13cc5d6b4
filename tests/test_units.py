"""Unit tests of the small parts: SSE splitting, Retry-After, classification, the record."""

from __future__ import annotations

import email.utils
import types

import pytest

from prism_proxy import Attempt, Binding, Call, Endpoint, Outcome, Skip, UpstreamResult
from prism_proxy.classification import find_permanent_marker, parse_retry_after
from prism_proxy.defaults.classify import DefaultClassify
from prism_proxy.record import attempt_log, prism_headers
from prism_proxy.sse import SSEBuffer, event_data


def _events(buffer: SSEBuffer, *reads: bytes) -> list[bytes]:
    events = []
    for data in reads:
        buffer.feed(data)
        while (event := buffer.next_event()) is not None:
            events.append(event)
    return events


def test_sse_buffer_handles_events_split_anywhere():
    stream = b'data: {"a":1}\n\ndata: {"b":2}\n\n: comment\n\ndata: [DONE]\n\n'
    for cut in range(1, len(stream)):
        events = _events(SSEBuffer(), stream[:cut], stream[cut:])
        assert [event_data(e) for e in events] == [b'{"a":1}', b'{"b":2}', None, b"[DONE]"]


def test_sse_crlf_and_multiline_data():
    stream = b"event: x\r\ndata: one\r\ndata:two\r\n\r\nevent: y\r\ndata: 3\r\n\r\n"
    for cut in range(1, len(stream)):
        events = _events(SSEBuffer(), stream[:cut], stream[cut:])
        assert [event_data(e) for e in events] == [b"one\ntwo", b"3"], cut
        assert events[1].startswith(b"event: y\n")


def test_sse_takes_every_whole_event_and_gives_back_what_it_is_told():
    content = b'data: {"choices":[{"index":0,"delta":{"content":"a"},"finish_reason":null}]}\n\n'
    finish = b'data: {"choices":[{"index":0,"delta":{},"finish_reason":"stop"}]}\n\n'
    stream = content * 3 + finish + content
    for cut in range(1, len(stream)):
        buffer = SSEBuffer()
        buffer.feed(stream[:cut])
        run = buffer.take_complete()
        last = stream[:cut].rfind(b"\n\n")
        assert run == stream[: last + 2 if last >= 0 else 0], cut
        if len(run) > len(content):
            buffer.put_back(run[len(content) :])  # the first event kept, the rest looked at again
            run = run[: len(content)]
        rest = _events(buffer, stream[cut:])
        assert run + b"".join(rest) == stream, cut


def test_retry_after_forms():
    assert parse_retry_after({"retry-after": "3"}) == 3
    assert parse_retry_after({"retry-after-ms": "1500", "retry-after": "9"}) == 1.5
    when = email.utils.formatdate(1_000_030, usegmt=True)
    assert parse_retry_after({"retry-after": when}, now=lambda: 1_000_000) == pytest.approx(30)
    assert parse_retry_after({"retry-after": "soon"}) is None
    assert parse_retry_after({"retry-after": "-4"}) is None
    assert parse_retry_after({}) is None


def test_quota_alone_is_not_a_permanent_marker():
    assert find_permanent_marker("rate limit: tokens per minute quota reached") is None
    assert find_permanent_marker("you exceeded your current quota, check billing") == (
        "exceeded your current quota"
    )
    assert find_permanent_marker("custom: wallet empty", ["wallet empty"]) == "wallet empty"


def _call() -> Call:
    # Unit tests of a classifier or the record need no request, and of a generation its number.
    return Call(
        request_id="req_x",
        endpoint=Endpoint.CHAT,
        received_at=0.0,
        request=None,
        generation=types.SimpleNamespace(number=1),
    )


def _classify(result: UpstreamResult) -> tuple[Outcome, str | None]:
    binding = Binding("p", "m")
    attempt = Attempt(1, binding, "att", 0.0)
    verdict = DefaultClassify().prism_classify(_call(), attempt, result)
    return verdict.outcome, verdict.code


@pytest.mark.parametrize(
    ("status", "body", "outcome", "code"),
    [
        (
            200,
            b'{"choices":[{"message":{"content":"hi"},"finish_reason":"stop"}]}',
            Outcome.OK,
            None,
        ),
        (
            200,
            b'{"choices":[{"message":{"content":""},"finish_reason":"length"}]}',
            Outcome.EMPTY,
            None,
        ),
        (400, b'{"error":{"code":"context_length_exceeded"}}', Outcome.REQUEST_ERROR, None),
        (422, b"{}", Outcome.REQUEST_ERROR, None),
        (
            400,
            b'{"error":{"message":"Your credit balance is too low"}}',
            Outcome.PERMANENT,
            "upstream_quota_exhausted",
        ),
        (
            429,
            b'{"error":{"code":"insufficient_quota"}}',
            Outcome.PERMANENT,
            "upstream_quota_exhausted",
        ),
        (429, b'{"error":{"message":"requests per minute quota"}}', Outcome.RATE_LIMITED, None),
        (401, b'{"error":{"code":"invalid_api_key"}}', Outcome.PERMANENT, "upstream_auth_failed"),
        (403, b"{}", Outcome.PERMANENT, "upstream_auth_failed"),
        (
            404,
            b'{"error":{"code":"model_not_found"}}',
            Outcome.PERMANENT,
            "upstream_model_not_found",
        ),
        (500, b"oops", Outcome.TRANSIENT, None),
        (529, b"{}", Outcome.TRANSIENT, None),
        (200, b'{"error":{"message":"overloaded"}}', Outcome.TRANSIENT, None),
    ],
)
def test_default_classification_reads_status_and_body(status, body, outcome, code):
    assert _classify(UpstreamResult(status, {}, body)) == (outcome, code)


def test_classification_of_failures_without_a_response():
    import asyncio

    assert _classify(UpstreamResult(None, timed_out=True))[0] is Outcome.TIMEOUT
    assert _classify(UpstreamResult(None, error=ConnectionRefusedError()))[0] is Outcome.TRANSIENT
    assert _classify(UpstreamResult(None, error=asyncio.CancelledError()))[0] is Outcome.CANCELLED
    broken = UpstreamResult(200, streaming=True, stream_broken=True)
    assert _classify(broken)[0] is Outcome.BROKEN_STREAM


def test_attempt_log_and_headers_are_single_latin1_lines():
    call = _call()
    call.record += [Skip("skipped", "breaker open", Binding("p", "m")), Skip("note", "stood down")]
    attempt = call.new_attempt(Binding("p\n", "modèle✓"), 0.0)
    attempt.elapsed_ms = 12.4
    attempt.status = 500
    log = attempt_log(call)
    assert log.startswith("p/m skipped breaker open; note stood down; ")
    assert "\n" not in log
    log.encode("latin-1")
    headers = prism_headers(call)
    assert headers["x-prism-attempts"] == "1"
    assert "\n" not in headers["x-prism-provider"]


def test_plain_runs_are_text_and_finishes_up_to_the_first_chunk_worth_parsing():
    from prism_proxy.wire.openai import chunk_kind, digest, plain_run

    text = (
        b'{"id":"c","choices":[{"index":0,"delta":{"content":"Hello"},"finish_reason":null}],'
        b'"usage":null}'
    )
    spaced = b'{"choices": [{"index": 0, "delta": {"content": "h\\u00e9"}, "finish_reason": null}]}'
    tool = (
        b'{"choices":[{"index":0,"delta":{"tool_calls":[{"index":0,'
        b'"function":{"arguments":"{\\"a\\""}}]},"finish_reason":null}]}'
    )
    two = b'{"choices":[{"index":0,"delta":{"content":"ab"}},{"index":1,"delta":{"content":"c"}}]}'
    finish = b'{"choices":[{"index":0,"delta":{},"finish_reason":"stop"}],"usage":null}'
    role = b'{"choices":[{"index":0,"delta":{"role":"assistant","content":"","refusal":null}}]}'
    refusal = b'{"choices":[{"index":0,"delta":{"refusal":"I cannot"}}]}'
    legacy = b'{"choices":[{"index":0,"delta":{"function_call":{"name":"f"}}}]}'
    empty_call = b'{"choices":[{"index":0,"delta":{"function_call":{}}}]}'
    plain = [role, text, spaced, tool, two, refusal, legacy, empty_call, finish]
    assert plain_run(plain) == (9, 5 + 2 + 4 + 3, "stop", 1)
    assert plain_run([role, empty_call, refusal]) == (3, 0, None, 2)
    # What it finds is what parsing each chunk would have: its kind, text and finish.
    for data in plain:
        kind, payload = chunk_kind(data)
        assert kind.name in ("CONTENT", "PRELUDE"), data
        chars, reason = digest(payload) if kind.name == "CONTENT" else (0, None)
        first = 0 if kind.name == "CONTENT" else -1
        assert plain_run([data]) == (1, chars, reason, first), data
    # Anything else ends the run there, whatever follows.
    for other in [
        b'{"choices":[],"usage":{"prompt_tokens":1}}',
        b'{"choices":[{"index":0,"delta":{"content":"a"}}],"usage":{"prompt_tokens":1}}',
        b'{"error":{"message":"overloaded"}}',
        b"[DONE]",
        b'{"choices":[{"index":0,"delta":{"content":"a"}}]',
        b'{"choices":[{"index":0,"delta":{"content":5}}]}',
        b'{"choices":[{"index":0,"delta":{"content":"a"}}]} {}',
        b'{"choices":[null]}',
        b'{"choices":[{"delta":[]}]}',
        b'{"choices":[{"delta":{"content":"a"}}],"x":' + b"[" * 100_000 + b"]" * 100_000 + b"}",
    ]:
        assert plain_run([text, other, text]) == (1, 5, None, 0), other
