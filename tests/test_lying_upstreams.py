"""Upstreams that answer 200 and lie: in the body's shape, in the usage, in the stream's bytes.

Each lie must fail over (never served, never billed) or be billed at Prism's own
estimate and flagged; the ledger is read with plain sqlite3, as an auditor would.
"""

from __future__ import annotations

import logging
import re
import sqlite3
from decimal import Decimal
from pathlib import Path
from typing import Any

import aiohttp
import orjson
import pytest
from prism_fake_upstream import Fault

MESSAGES = [{"role": "user", "content": "hello there"}]  # the fake counts 2 prompt tokens
TEXT = "one two three four five six seven eight nine ten"  # the fake reports 10 tokens
PIECES = len(TEXT.split())
#: Prism's estimates of TEXT and of the prompt: about four characters a token.
TEXT_ESTIMATE = -(-len(TEXT) // 4)
PROMPT_ESTIMATE = -(-len("hello there") // 4)
#: The healthy second line's answer (the fake names the upstream model, ``b``).
SECOND_ANSWER = "Hello from b. This is the fake upstream answering."

PRICE_FIRST = {"input": 30.0, "output": 60.0}
PRICE_SECOND = {"input": 3.0, "output": 15.0}

ANTHROPIC_HEADERS = {"anthropic-version": "2023-06-01"}

#: (client wire, stream, include_usage): every way a caller can be answered.
MODES = [
    pytest.param("openai", False, False, id="openai"),
    pytest.param("openai", True, False, id="openai-stream"),
    pytest.param("openai", True, True, id="openai-stream-include-usage"),
    pytest.param("anthropic", False, False, id="anthropic"),
    pytest.param("anthropic", True, False, id="anthropic-stream"),
]


class Ledger:
    def __init__(self, path: Path) -> None:
        self.path = path

    def rows(self) -> list[dict[str, Any]]:
        conn = sqlite3.connect(self.path)
        conn.row_factory = sqlite3.Row
        try:
            return [dict(r) for r in conn.execute("SELECT * FROM ledger ORDER BY ts")]
        finally:
            conn.close()

    def only_row(self, request_id: str) -> dict[str, Any]:
        rows = self.rows()
        assert [r["request_id"] for r in rows] == [request_id], rows
        return rows[0]

    @staticmethod
    def cost(row: dict[str, Any]) -> Decimal:
        return Decimal(row["cost_nanos"]).scaleb(-9)


@pytest.fixture
def ledger(tmp_path: Path) -> Ledger:
    return Ledger(tmp_path / "ledger.sqlite")


@pytest.fixture
def billed(prism_gateway, ledger, prism_clock):
    """Start a gateway with billing on, its ledger in the test's tmp dir (retries pause no time)."""

    async def start(catalog: dict) -> Any:
        return await prism_gateway(
            catalog, sections={"billing": {"ledger_path": str(ledger.path)}}, clock=prism_clock
        )

    return start


def expected_cost(price: dict[str, float], inp: int, out: int) -> Decimal:
    """The cost rule, written out independently of the billing plugin."""
    return (inp * Decimal(repr(price["input"])) + out * Decimal(repr(price["output"]))) / Decimal(
        1_000_000
    )


def two_lines(fake: Any, kind: str, first: str, second: str = "healthy") -> dict:
    """Model ``m``: line ``first/a`` (scenario ``first``), then ``second/b``; both priced."""
    return {
        "providers": {
            "first": {"kind": kind, "base_url": fake.base_url(first)},
            "second": {"kind": kind, "base_url": fake.base_url(second)},
        },
        "models": {
            "m": {
                "retries": 0,
                "chain": [
                    {"provider": "first", "model": "a", "price": PRICE_FIRST},
                    {"provider": "second", "model": "b", "price": PRICE_SECOND},
                ],
            }
        },
    }


def one_line(fake: Any, kind: str, scenario: str) -> dict:
    return {
        "providers": {"only": {"kind": kind, "base_url": fake.base_url(scenario)}},
        "models": {
            "m": {
                "retries": 0,
                "chain": [{"provider": "only", "model": "x", "price": PRICE_SECOND}],
            }
        },
    }


ATTEMPT_LOG = re.compile(r"first/a (\S+) 200 \d+ms; second/b ok 200 \d+ms")


# --- 1. a 200 that is not an answer in its wire's shape ---------------------------------

LIE_USAGE_OPENAI = {"prompt_tokens": 7000, "completion_tokens": 9000, "total_tokens": 16000}
LIE_USAGE_ANTHROPIC = {"input_tokens": 7000, "output_tokens": 9000}

OPENAI_CHAT_SHAPES = [
    pytest.param({}, "answer without choices", id="empty-object"),
    pytest.param({"choices": None}, "answer without choices", id="choices-null"),
    pytest.param(
        {"object": "chat.completion", "choices": [], "usage": LIE_USAGE_OPENAI},
        "answer without choices",
        id="choices-empty",
    ),
    pytest.param(
        {
            "object": "chat.completion",
            "choices": [{"index": 0, "finish_reason": "stop", "text": "a lie"}],
            "usage": LIE_USAGE_OPENAI,
        },
        "answer with a choice that has no message",
        id="choice-without-message",
    ),
]


@pytest.mark.parametrize(("body", "reason"), OPENAI_CHAT_SHAPES)
async def test_openai_chat_200_without_an_answer_fails_over_and_is_never_billed(
    prism_fake, billed, ledger, recorder, body, reason
):
    prism_fake.script("bad", [Fault(body=body)])
    gw = await billed(two_lines(prism_fake, "openai", "bad"))
    async with gw.openai() as client:
        raw = await client.chat.completions.with_raw_response.create(model="m", messages=MESSAGES)
    completion = raw.parse()
    assert raw.status_code == 200
    assert completion.choices[0].message.content == SECOND_ANSWER
    assert raw.headers["x-prism-provider"] == "second"
    _assert_failed_over(raw.headers, recorder, "transient", reason)
    reported = completion.usage
    _assert_billed_to_second(
        ledger, raw.headers, reported.prompt_tokens, reported.completion_tokens
    )


@pytest.mark.parametrize(
    "body",
    [
        pytest.param(
            {
                "object": "list",
                "model": "a",
                "usage": {"prompt_tokens": 9000, "total_tokens": 9000},
            },
            id="no-data",
        ),
        pytest.param(
            {
                "object": "list",
                "data": [],
                "model": "a",
                "usage": {"prompt_tokens": 9000, "total_tokens": 9000},
            },
            id="data-empty",
        ),
    ],
)
async def test_embeddings_200_without_data_fails_over_and_is_never_billed(
    prism_fake, billed, ledger, recorder, body
):
    prism_fake.script("bad", [Fault(body=body)])
    gw = await billed(two_lines(prism_fake, "openai", "bad"))
    async with gw.openai() as client:
        raw = await client.embeddings.with_raw_response.create(
            model="m", input="four words in here"
        )
    answer = raw.parse()
    assert raw.status_code == 200
    assert len(answer.data) == 1 and len(answer.data[0].embedding) > 0
    _assert_failed_over(raw.headers, recorder, "transient", "embeddings answer without data")
    row = _assert_billed_to_second(ledger, raw.headers, answer.usage.prompt_tokens, 0)
    assert row["input_tokens"] == 4  # the healthy line's report, not the lie's 9000


@pytest.mark.parametrize(
    ("body", "reason"),
    [
        pytest.param(
            {"id": "msg_1", "type": "message", "role": "assistant"},
            "message without content",
            id="no-content",
        ),
        pytest.param(
            {
                "id": "msg_1",
                "type": "message",
                "role": "assistant",
                "content": None,
                "usage": LIE_USAGE_ANTHROPIC,
            },
            "message without content",
            id="content-null",
        ),
        pytest.param(
            {
                "id": "msg_1",
                "type": "completion",
                "role": "assistant",
                "content": [{"type": "text", "text": "a lie"}],
                "stop_reason": "end_turn",
                "usage": LIE_USAGE_ANTHROPIC,
            },
            "200 whose type is not message",
            id="type-not-message",
        ),
    ],
)
async def test_anthropic_200_without_a_message_fails_over_and_is_never_billed(
    prism_fake, billed, ledger, recorder, body, reason
):
    prism_fake.script("bad", [Fault(body=body)])
    gw = await billed(two_lines(prism_fake, "anthropic", "bad"))
    async with gw.anthropic() as client:
        raw = await client.messages.with_raw_response.create(
            model="m", max_tokens=100, messages=MESSAGES
        )
    message = await raw.parse()
    assert raw.status_code == 200
    assert [block.text for block in message.content] == [SECOND_ANSWER]
    assert raw.headers["x-prism-provider"] == "second"
    _assert_failed_over(raw.headers, recorder, "transient", reason)
    _assert_billed_to_second(
        ledger, raw.headers, message.usage.input_tokens, message.usage.output_tokens
    )


def _assert_failed_over(headers: Any, recorder: Any, outcome: str, reason: str) -> None:
    log = headers["x-prism-attempt-log"]
    match = ATTEMPT_LOG.fullmatch(log)
    assert match is not None and match.group(1) == outcome, log
    # The header carries the outcome; the reason is what observers of the attempt see.
    assert [(a.binding.id, str(a.verdict.outcome)) for a in recorder.attempts] == [
        ("first/a", outcome),
        ("second/b", "ok"),
    ]
    assert recorder.attempts[0].verdict.reason == reason
    [(_, settlement)] = recorder.settled
    assert settlement.outcome == "ok"
    assert settlement.served.binding.id == "second/b"


def _assert_billed_to_second(ledger: Ledger, headers: Any, inp: int, out: int) -> dict[str, Any]:
    row = ledger.only_row(headers["x-prism-request-id"])
    assert (row["provider"], row["upstream_model"], row["outcome"]) == ("second", "b", "ok")
    assert (row["input_tokens"], row["output_tokens"]) == (inp, out)
    assert (row["estimated"], row["usage_suspect"]) == (0, 0)
    assert row["attempts"] == 2
    cost = expected_cost(PRICE_SECOND, inp, out)
    assert Ledger.cost(row) == cost > 0
    assert Decimal(headers["x-prism-cost"]) == cost
    return row


# --- 2. usage that cannot be true ---------------------------------------------------------


async def ask(gw: Any, wire: str, stream: bool, include_usage: bool, max_tokens: int | None):
    """One call through the SDK; returns (status, headers, answer text, caller-visible usages)."""
    if wire == "openai":
        extra: dict[str, Any] = {} if max_tokens is None else {"max_tokens": max_tokens}
        if include_usage:
            extra["stream_options"] = {"include_usage": True}
        async with gw.openai() as client:
            raw = await client.chat.completions.with_raw_response.create(
                model="m", messages=MESSAGES, stream=stream, **extra
            )
            if not stream:
                completion = raw.parse()
                return (
                    raw.status_code,
                    raw.headers,
                    completion.choices[0].message.content,
                    [completion.usage],
                )
            texts, usages = [], []
            async for chunk in raw.parse():
                if chunk.usage is not None:
                    usages.append(chunk.usage)
                for choice in chunk.choices:
                    texts.append(choice.delta.content or "")
            return raw.status_code, raw.headers, "".join(texts), usages
    async with gw.anthropic() as client:
        raw = await client.messages.with_raw_response.create(
            model="m", max_tokens=max_tokens or 1000, messages=MESSAGES, stream=stream
        )
        parsed = await raw.parse()
        if not stream:
            return raw.status_code, raw.headers, parsed.content[0].text, [parsed.usage]
        texts, usages = [], []
        async for event in parsed:
            if event.type == "content_block_delta":
                texts.append(event.delta.text)
            elif event.type in ("message_start", "message_delta"):
                usages.append(getattr(event, "usage", None) or event.message.usage)
        return raw.status_code, raw.headers, "".join(texts), usages


def _lie(wire: str, output: Any) -> dict[str, Any]:
    return {"completion_tokens" if wire == "openai" else "output_tokens": output}


def _check_upstream_was_asked_for_usage(prism_fake: Any, wire: str, stream: bool) -> None:
    if wire == "openai" and stream:
        # Whatever the caller asked, Prism asks the upstream for the usage chunk.
        body = prism_fake.requests("liar")[-1].body
        assert body["stream_options"] == {"include_usage": True}


def _check_caller_usage(usages: list[Any], wire: str, stream: bool, include_usage: bool) -> None:
    if wire == "openai" and stream and not include_usage:
        assert usages == []  # not asked for, so not shown, even though Prism read it
    else:
        assert usages


@pytest.mark.parametrize(
    "output",
    [
        pytest.param("lots", id="string"),
        pytest.param(-5, id="negative"),
        pytest.param(10**15, id="10e15-int"),
        pytest.param(1e15, id="1e15-float"),
        pytest.param(12.5, id="fraction"),
    ],
)
@pytest.mark.parametrize(("wire", "stream", "include_usage"), MODES)
async def test_usage_that_is_not_a_sane_count_is_billed_at_the_estimate_and_flagged(
    prism_fake, billed, ledger, wire, stream, include_usage, output
):
    prism_fake.script("liar", [Fault(text=TEXT, usage=_lie(wire, output))])
    gw = await billed(one_line(prism_fake, wire, "liar"))
    status, headers, text, usages = await ask(gw, wire, stream, include_usage, None)
    assert status == 200
    assert text == TEXT
    _check_caller_usage(usages, wire, stream, include_usage)
    _check_upstream_was_asked_for_usage(prism_fake, wire, stream)
    _assert_billed_at_the_estimate(ledger, headers, wire, stream)


@pytest.mark.parametrize("reported", [60, 5000])
@pytest.mark.parametrize(("wire", "stream", "include_usage"), MODES)
async def test_output_above_max_tokens_is_billed_at_the_estimate_and_flagged(
    prism_fake, billed, ledger, wire, stream, include_usage, reported
):
    # 60 is within what TEXT could plausibly be (10 x its estimate + 16): only the cap catches it.
    prism_fake.script("liar", [Fault(text=TEXT, usage=_lie(wire, reported))])
    gw = await billed(one_line(prism_fake, wire, "liar"))
    status, headers, text, _ = await ask(gw, wire, stream, include_usage, 50)
    assert (status, text) == (200, TEXT)
    _check_upstream_was_asked_for_usage(prism_fake, wire, stream)
    _assert_billed_at_the_estimate(ledger, headers, wire, stream)


@pytest.mark.parametrize(("wire", "stream", "include_usage"), MODES)
async def test_output_far_above_the_delivered_text_is_billed_at_the_estimate_and_flagged(
    prism_fake, billed, ledger, wire, stream, include_usage
):
    # No max_tokens to break (Anthropic's is the SDK call's 1000): only the text bounds it.
    prism_fake.script("liar", [Fault(text=TEXT, usage=_lie(wire, 900))])
    gw = await billed(one_line(prism_fake, wire, "liar"))
    status, headers, text, _ = await ask(gw, wire, stream, include_usage, None)
    assert (status, text) == (200, TEXT)
    _assert_billed_at_the_estimate(ledger, headers, wire, stream)


def _assert_billed_at_the_estimate(ledger: Ledger, headers: Any, wire: str, stream: bool) -> None:
    row = ledger.only_row(headers["x-prism-request-id"])
    assert (row["outcome"], row["provider"]) == ("ok", "only")
    assert (row["usage_suspect"], row["estimated"]) == (1, 1)
    # Prism's estimate from the delivered text, about four characters a token: the
    # text chunks a stream forwards unparsed are counted exactly all the same.
    assert row["output_tokens"] == TEXT_ESTIMATE
    # The prompt: the upstream's report (when only the output was a lie) or the estimate.
    assert row["input_tokens"] in (2, PROMPT_ESTIMATE)
    cost = expected_cost(PRICE_SECOND, row["input_tokens"], row["output_tokens"])
    assert Ledger.cost(row) == cost
    assert 0 < cost < Decimal("0.001")
    if not stream:
        assert Decimal(headers["x-prism-cost"]) == cost


@pytest.mark.parametrize(("wire", "stream", "include_usage"), MODES)
async def test_an_honest_report_is_billed_as_reported_and_not_flagged(
    prism_fake, billed, ledger, wire, stream, include_usage
):
    # The answer's 10 tokens exactly fill max_tokens = 10: at the cap is not above it.
    prism_fake.script("liar", [Fault(text=TEXT)])
    gw = await billed(one_line(prism_fake, wire, "liar"))
    status, headers, text, usages = await ask(gw, wire, stream, include_usage, PIECES)
    assert (status, text) == (200, TEXT)
    _check_caller_usage(usages, wire, stream, include_usage)
    _check_upstream_was_asked_for_usage(prism_fake, wire, stream)
    row = ledger.only_row(headers["x-prism-request-id"])
    assert (row["usage_suspect"], row["estimated"]) == (0, 0)
    assert (row["input_tokens"], row["output_tokens"]) == (2, PIECES)
    assert Ledger.cost(row) == expected_cost(PRICE_SECOND, 2, PIECES)


# --- 3. stream events that are not JSON -----------------------------------------------------

BAD_EVENTS = [
    pytest.param(b'{"choices": [oops', b"oops", id="not-json"),
    pytest.param(b'{"x": "\xff\xfe"}', b"\xff\xfe", id="not-utf8"),
    # A content chunk cut short: it looks like the plain chunks Prism forwards unparsed.
    pytest.param(
        b'{"id":"c","choices":[{"index":0,"delta":{"content":"cut-lie"},'
        b'"logprobs":null,"finish_reason":null}',
        b"cut-lie",
        id="cut-chunk",
    ),
    # A plain content chunk, well formed but for its text's bytes.
    pytest.param(
        b'{"id":"c","choices":[{"index":0,"delta":{"content":"bad-\xff"},'
        b'"logprobs":null,"finish_reason":null}]}',
        b"bad-\xff",
        id="plain-chunk-not-utf8",
    ),
    # Nested deeper than any parser here follows.
    pytest.param(b'{"deep":' + b"[" * 100_000 + b"]" * 100_000 + b"}", b"[[[[[[[[", id="too-deep"),
]


async def stream_raw(gw: Any, wire: str) -> tuple[int, Any, bytes]:
    """The raw bytes a streaming caller receives (status, headers, body)."""
    if wire == "openai":
        url = gw.base_url + "/chat/completions"
        body: dict[str, Any] = {"model": "m", "messages": MESSAGES, "stream": True}
        headers: dict[str, str] = {}
    else:
        url = gw.url + "/v1/messages"
        body = {"model": "m", "max_tokens": 100, "messages": MESSAGES, "stream": True}
        headers = ANTHROPIC_HEADERS
    async with aiohttp.ClientSession() as session:
        async with session.post(url, json=body, headers=headers) as response:
            return response.status, response.headers, await response.read()


def sse_events(raw: bytes) -> list[tuple[str | None, bytes]]:
    """(event name, data) of each event with data; comments are skipped."""
    events = []
    for block in raw.split(b"\n\n"):
        name = None
        data = []
        for line in block.split(b"\n"):
            if line.startswith(b"event: "):
                name = line[7:].decode()
            elif line.startswith(b"data: "):
                data.append(line[6:])
        if data:
            events.append((name, b"\n".join(data)))
    return events


def upstream_models(wire: str, events: list[tuple[str | None, bytes]]) -> list[str]:
    """The upstream model each event names (every OpenAI chunk, Anthropic's message_start)."""
    models = []
    for _, data in events:
        if data == b"[DONE]":
            continue
        payload = orjson.loads(data)
        if wire == "openai" and "choices" in payload:
            models.append(payload["model"])
        elif wire == "anthropic" and payload["type"] == "message_start":
            models.append(payload["message"]["model"])
    return models


def answer_text(wire: str, events: list[tuple[str | None, bytes]]) -> str:
    """The text of an answer, checking on the way that every event is JSON."""
    texts = []
    for _, data in events:
        if data == b"[DONE]":
            continue
        payload = orjson.loads(data)
        if wire == "openai":
            for choice in payload.get("choices") or ():
                texts.append(choice["delta"].get("content") or "")
        elif payload["type"] == "content_block_delta":
            texts.append(payload["delta"]["text"])
    return "".join(texts)


@pytest.mark.parametrize(("bad", "marker"), BAD_EVENTS)
@pytest.mark.parametrize("wire", ["openai", "anthropic"])
async def test_a_bad_event_before_content_fails_over_and_never_reaches_the_caller(
    prism_fake, billed, ledger, recorder, wire, bad, marker
):
    prism_fake.script("bad", [Fault(bad_event=bad, bad_event_at=0)])
    gw = await billed(two_lines(prism_fake, wire, "bad"))
    status, headers, raw = await stream_raw(gw, wire)
    assert status == 200
    assert marker not in raw
    events = sse_events(raw)
    assert answer_text(wire, events) == SECOND_ANSWER
    # Nothing the first line sent before its bad event (its role chunk, its message_start).
    models = upstream_models(wire, events)
    assert set(models) == {"b"}
    if wire == "anthropic":
        assert models == ["b"]
    if wire == "openai":
        assert events[-1] == (None, b"[DONE]")
    else:
        assert events[-1][0] == "message_stop"
    assert headers["x-prism-provider"] == "second"
    _assert_failed_over(
        headers, recorder, "broken_stream", "upstream sent an event that is not JSON"
    )
    row = ledger.only_row(headers["x-prism-request-id"])
    assert (row["provider"], row["outcome"], row["estimated"]) == ("second", "ok", 0)
    # The second line's own report: 8 words answered to a 2-word prompt, at its price.
    assert (row["input_tokens"], row["output_tokens"]) == (2, len(SECOND_ANSWER.split()))
    assert Ledger.cost(row) == expected_cost(PRICE_SECOND, 2, len(SECOND_ANSWER.split()))


@pytest.mark.parametrize(("bad", "marker"), BAD_EVENTS)
@pytest.mark.parametrize("wire", ["openai", "anthropic"])
async def test_a_bad_event_after_content_ends_the_stream_with_an_error(
    prism_fake, billed, ledger, wire, bad, marker
):
    prism_fake.script("bad", [Fault(bad_event=bad, bad_event_at=2)])
    gw = await billed(two_lines(prism_fake, wire, "bad"))
    status, headers, raw = await stream_raw(gw, wire)
    assert status == 200
    assert marker not in raw
    events = sse_events(raw)
    # What came before the bad event was delivered; nothing of another line was spliced in.
    assert answer_text(wire, events[:-1]) == "Hello from"  # the first line's first two pieces
    assert set(upstream_models(wire, events[:-1])) == {"a"}
    name, data = events[-1]
    error = orjson.loads(data)
    if wire == "openai":
        assert name is None
        assert error["error"]["code"] == "upstream_stream_broken"
        assert b"[DONE]" not in raw
    else:
        assert name == "error"
        assert error["type"] == "error"
        assert b"message_stop" not in raw
    # Found wanting as an event, not as a relay that fell over on it.
    assert "upstream sent an event that is not JSON" in error["error"]["message"]
    assert prism_fake.hits("healthy") == 0
    row = ledger.only_row(headers["x-prism-request-id"])
    assert (row["outcome"], row["provider"], row["error_code"]) == (
        "error",
        "first",
        "upstream_stream_broken",
    )
    # Billed at the first line's price for what it produced before breaking, as estimated.
    assert row["estimated"] == 1
    assert row["output_tokens"] >= 1
    assert Ledger.cost(row) == expected_cost(PRICE_FIRST, row["input_tokens"], row["output_tokens"])


# --- 4. an empty completion served as such --------------------------------------------------


@pytest.mark.parametrize(("wire", "stream", "include_usage"), MODES)
async def test_an_empty_completion_returned_is_settled_as_empty(
    prism_fake, billed, ledger, caplog, wire, stream, include_usage
):
    prism_fake.script("liar", [Fault(empty_length=True)])
    gw = await billed(one_line(prism_fake, wire, "liar"))
    with caplog.at_level(logging.INFO, logger="prism.calls"):
        status, headers, text, _ = await _ask_empty(gw, wire, stream, include_usage)
    assert (status, text) == (200, "")
    assert headers["x-prism-outcome"] == "empty"
    request_id = headers["x-prism-request-id"]
    row = ledger.only_row(request_id)
    assert (row["outcome"], row["provider"], row["status"]) == ("empty", "only", 200)
    [line] = [r.getMessage() for r in caplog.records if r.name == "prism.calls"]
    assert line.startswith(request_id)
    assert " outcome=empty " in line


async def _ask_empty(gw: Any, wire: str, stream: bool, include_usage: bool):
    if wire == "anthropic" and not stream:
        async with gw.anthropic() as client:
            raw = await client.messages.with_raw_response.create(
                model="m", max_tokens=1000, messages=MESSAGES
            )
            message = await raw.parse()
            return raw.status_code, raw.headers, "".join(b.text for b in message.content), []
    status, headers, text, usages = await ask(gw, wire, stream, include_usage, None)
    return status, headers, text or "", usages
