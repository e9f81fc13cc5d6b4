"""Tests of the fake upstream itself, over real HTTP."""

from __future__ import annotations

import asyncio
import base64
import json
import struct
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import Any

import aiohttp
import anthropic
import attrs
import openai
import orjson
import pytest
from aiohttp import web
from anthropic.types import Message, MessageParam, ToolParam
from openai.types.chat import ChatCompletionFunctionToolParam, ChatCompletionMessageParam
from prism_fake_upstream import FakeUpstream, Fault, Recorded
from prism_fake_upstream.answers import tool_arguments
from prism_fake_upstream.faults import fault_for_scenario_name, fault_from_json
from prism_fake_upstream.recording import MAX_RECORDED, ScenarioLog

MESSAGES: list[ChatCompletionMessageParam] = [{"role": "user", "content": "say something nice"}]
CHAT: dict[str, Any] = {"model": "m1", "messages": MESSAGES}
DEFAULT_TEXT = "Hello from m1. This is the fake upstream answering."


@pytest.fixture
async def fake() -> AsyncIterator[FakeUpstream]:
    async with FakeUpstream() as running:
        yield running


@pytest.fixture
async def http() -> AsyncIterator[aiohttp.ClientSession]:
    async with aiohttp.ClientSession() as session:
        yield session


def sdk(fake: FakeUpstream, scenario: str) -> openai.AsyncOpenAI:
    # No retries: each test wants to see exactly the fake's answer.
    return openai.AsyncOpenAI(base_url=fake.base_url(scenario), api_key="x", max_retries=0)


async def wait_for(predicate: Callable[[], bool], timeout: float = 1.0) -> None:
    deadline = time.monotonic() + timeout
    while not predicate():
        if time.monotonic() > deadline:
            raise AssertionError("condition not reached in time")
        await asyncio.sleep(0.01)


async def read_events(resp: aiohttp.ClientResponse) -> list[bytes]:
    """SSE data payloads of a response, in order."""
    events = []
    async for line in resp.content:
        if line.startswith(b"data: "):
            events.append(line[len(b"data: ") :].rstrip(b"\n"))
    return events


# --- official SDK -----------------------------------------------------------


async def test_sdk_chat_completion(fake: FakeUpstream) -> None:
    async with sdk(fake, "ok") as client:
        completion = await client.chat.completions.create(
            model="m1", messages=[{"role": "user", "content": "say something nice"}]
        )
    assert completion.object == "chat.completion"
    assert completion.id.startswith("chatcmpl-")
    assert completion.model == "m1"
    choice = completion.choices[0]
    assert choice.message.role == "assistant"
    assert choice.message.content == DEFAULT_TEXT
    assert choice.finish_reason == "stop"
    assert completion.usage is not None
    assert completion.usage.prompt_tokens == 3
    assert completion.usage.completion_tokens == len(DEFAULT_TEXT.split())
    assert completion.usage.total_tokens == 3 + len(DEFAULT_TEXT.split())


@pytest.mark.parametrize("include_usage", [True, False, None])
async def test_sdk_stream_text_and_usage(fake: FakeUpstream, include_usage: bool | None) -> None:
    text = "  Spaces  are\tkept exactly, even trailing ones.  "
    fake.script("ok", [Fault(text=text)])
    extra: dict[str, Any] = {}
    if include_usage is not None:
        extra["stream_options"] = {"include_usage": include_usage}
    async with sdk(fake, "ok") as client:
        stream = await client.chat.completions.create(
            model="m1",
            messages=[{"role": "user", "content": [{"type": "text", "text": "two words"}]}],
            stream=True,
            **extra,
        )
        chunks = [chunk async for chunk in stream]

    assert {c.id for c in chunks} == {chunks[0].id}
    assert all(c.object == "chat.completion.chunk" and c.model == "m1" for c in chunks)
    content_chunks = [c for c in chunks if c.choices and c.choices[0].delta.content]
    assert "".join(c.choices[0].delta.content or "" for c in content_chunks) == text
    assert len(content_chunks) == len(text.split())
    assert chunks[0].choices[0].delta.role == "assistant"

    usage_chunks = [c for c in chunks if c.usage is not None]
    if include_usage:
        assert usage_chunks == [chunks[-1]]
        assert chunks[-1].choices == []
        assert chunks[-1].usage is not None
        assert chunks[-1].usage.prompt_tokens == 2
        assert chunks[-1].usage.completion_tokens == len(text.split())
        assert chunks[-2].choices[0].finish_reason == "stop"
    else:
        assert usage_chunks == []
        assert all(c.choices for c in chunks)
        assert chunks[-1].choices[0].finish_reason == "stop"


async def test_raw_stream_wire_format(fake: FakeUpstream, http: aiohttp.ClientSession) -> None:
    body = {**CHAT, "stream": True, "stream_options": {"include_usage": True}}
    async with http.post(fake.base_url("ok") + "/chat/completions", json=body) as resp:
        assert resp.status == 200
        assert resp.headers["Content-Type"].startswith("text/event-stream")
        raw = await resp.read()
    # Every event is exactly one "data: ..." line followed by a blank line.
    events = raw.split(b"\n\n")
    assert events[-1] == b"" and events[-2] == b"data: [DONE]"
    chunks = [orjson.loads(e.removeprefix(b"data: ")) for e in events[:-2]]
    assert all("usage" in c for c in chunks)
    assert all(c["usage"] is None for c in chunks[:-1])
    assert chunks[-1]["choices"] == [] and chunks[-1]["usage"]["total_tokens"] > 0

    async with http.post(
        fake.base_url("ok") + "/chat/completions", json={**CHAT, "stream": True}
    ) as resp:
        chunks = [orjson.loads(e) for e in await read_events(resp) if e != b"[DONE]"]
    assert all("usage" not in c for c in chunks)


async def test_sdk_embeddings(fake: FakeUpstream, http: aiohttp.ClientSession) -> None:
    async with sdk(fake, "ok") as client:
        # The SDK asks for base64 by default and decodes it itself.
        result = await client.embeddings.create(model="e1", input=["first text", "second"])
        again = await client.embeddings.create(model="e1", input="first text")
    assert result.object == "list" and result.model == "e1"
    assert [d.index for d in result.data] == [0, 1]
    assert all(d.object == "embedding" and len(d.embedding) == 8 for d in result.data)
    assert result.data[0].embedding != result.data[1].embedding
    assert again.data[0].embedding == result.data[0].embedding
    assert result.usage.prompt_tokens == 3 and result.usage.total_tokens == 3

    url = fake.base_url("ok") + "/embeddings"
    async with http.post(url, json={"model": "e1", "input": "first text"}) as resp:
        floats = (await resp.json())["data"][0]["embedding"]
    assert floats == result.data[0].embedding
    async with http.post(
        url, json={"model": "e1", "input": "first text", "encoding_format": "base64"}
    ) as resp:
        b64 = (await resp.json())["data"][0]["embedding"]
    assert list(struct.unpack("<8f", base64.b64decode(b64))) == floats


@pytest.mark.parametrize(
    ("input_", "count", "tokens"),
    [([1, 2, 3], 1, 3), ([[1, 2], [3]], 2, 3), (["a"], 1, 1)],
)
async def test_embedding_input_shapes(
    fake: FakeUpstream, http: aiohttp.ClientSession, input_: Any, count: int, tokens: int
) -> None:
    body = {"model": "e1", "input": input_, "dimensions": 5}
    async with http.post(fake.base_url("ok") + "/embeddings", json=body) as resp:
        assert resp.status == 200
        data = await resp.json()
    assert len(data["data"]) == count
    assert all(len(d["embedding"]) == 5 for d in data["data"])
    assert data["usage"] == {"prompt_tokens": tokens, "total_tokens": tokens}


async def test_bad_requests_are_openai_shaped(
    fake: FakeUpstream, http: aiohttp.ClientSession
) -> None:
    async with http.post(
        fake.base_url("ok") + "/embeddings", json={"model": "e", "input": [True]}
    ) as r:
        assert r.status == 400
        assert (await r.json())["error"]["param"] == "input"
    async with http.post(fake.base_url("ok") + "/chat/completions", data=b"{not json") as r:
        assert r.status == 400
        assert (await r.json())["error"]["type"] == "invalid_request_error"
    async with http.get(fake.base_url("ok") + "/nope") as r:
        assert r.status == 404
        assert set((await r.json())["error"]) == {"message", "type", "param", "code"}


async def test_sdk_models(fake: FakeUpstream) -> None:
    async with sdk(fake, "ok") as client:
        ids = [m.id async for m in client.models.list()]
        model = await client.models.retrieve(ids[0])
        with pytest.raises(openai.NotFoundError):
            await client.models.retrieve("no-such-model")
    assert "fake-model" in ids and model.id == ids[0]


# --- scenarios by name ------------------------------------------------------


async def test_err500_raises_internal_server_error(fake: FakeUpstream) -> None:
    async with sdk(fake, "err500") as client:
        with pytest.raises(openai.InternalServerError) as info:
            await client.chat.completions.create(model="m1", messages=MESSAGES)
    assert info.value.status_code == 500
    assert info.value.body == {
        "message": "The server had an error while processing your request. Sorry about that!",
        "type": "server_error",
        "param": None,
        "code": None,
    }


@pytest.mark.parametrize(
    ("scenario", "exc", "err_type", "code"),
    [
        ("err429", openai.RateLimitError, "requests", "rate_limit_exceeded"),
        ("err401", openai.AuthenticationError, "invalid_request_error", "invalid_api_key"),
        ("err400", openai.BadRequestError, "invalid_request_error", None),
        ("err503", openai.InternalServerError, "server_error", None),
    ],
)
async def test_error_scenarios(
    fake: FakeUpstream,
    scenario: str,
    exc: type[openai.APIStatusError],
    err_type: str,
    code: str | None,
) -> None:
    async with sdk(fake, scenario) as client:
        with pytest.raises(exc) as info:
            await client.chat.completions.create(model="m1", messages=MESSAGES, stream=True)
    assert info.value.type == err_type
    assert info.value.code == code


async def test_unknown_names_are_healthy_and_independent(fake: FakeUpstream) -> None:
    async with sdk(fake, "alpha") as alpha, sdk(fake, "beta") as beta:
        a = await alpha.chat.completions.create(model="m1", messages=MESSAGES)
        await beta.chat.completions.create(model="m1", messages=MESSAGES)
        await beta.embeddings.create(model="e", input="x")
    assert a.choices[0].message.content == DEFAULT_TEXT
    assert fake.hits("alpha") == 1
    assert fake.hits("beta") == 2
    assert fake.hits("beta", "chat/completions") == 1
    assert fake.hits("beta", "embeddings") == 1


@pytest.mark.parametrize("stream", [False, True])
async def test_empty_gives_finish_reason_length(fake: FakeUpstream, stream: bool) -> None:
    async with sdk(fake, "empty") as client:
        if stream:
            stream_ = await client.chat.completions.create(
                model="m1", messages=MESSAGES, stream=True
            )
            chunks = [c async for c in stream_]
            assert "".join(c.choices[0].delta.content or "" for c in chunks) == ""
            assert chunks[-1].choices[0].finish_reason == "length"
        else:
            completion = await client.chat.completions.create(model="m1", messages=MESSAGES)
            assert completion.choices[0].message.content == ""
            assert completion.choices[0].finish_reason == "length"
            assert completion.usage is not None and completion.usage.completion_tokens == 0


async def test_die2_stream_breaks_after_two_chunks(
    fake: FakeUpstream, http: aiohttp.ClientSession
) -> None:
    contents: list[str] = []
    events: list[bytes] = []
    with pytest.raises(aiohttp.ClientPayloadError):
        async with http.post(
            fake.base_url("die2") + "/chat/completions", json={**CHAT, "stream": True}
        ) as resp:
            assert resp.status == 200
            async for line in resp.content:
                if not line.startswith(b"data: "):
                    continue
                events.append(line)
                delta = orjson.loads(line[len(b"data: ") :])["choices"][0]["delta"]
                if delta.get("content"):
                    contents.append(delta["content"])
    assert contents == ["Hello", " from"]
    assert not any(b"[DONE]" in e or b'finish_reason":"stop' in e for e in events)
    assert fake.dropped("die2") == 0


async def test_die_without_stream_closes_connection(
    fake: FakeUpstream, http: aiohttp.ClientSession
) -> None:
    with pytest.raises(aiohttp.ServerDisconnectedError):
        async with http.post(fake.base_url("die0") + "/chat/completions", json=CHAT) as resp:
            await resp.read()


async def test_slow_spaces_tokens(fake: FakeUpstream, http: aiohttp.ClientSession) -> None:
    fake.script("slow", [Fault(token_delay_s=0.05, text="one two three four five")])
    start = time.monotonic()
    async with http.post(
        fake.base_url("slow") + "/chat/completions", json={**CHAT, "stream": True}
    ) as r:
        await r.read()
    assert time.monotonic() - start >= 4 * 0.05


async def test_first_token_delay_sends_headers_first(
    fake: FakeUpstream, http: aiohttp.ClientSession
) -> None:
    fake.script("slowfirst", [Fault(first_token_delay_s=0.3)])
    start = time.monotonic()
    async with http.post(
        fake.base_url("slowfirst") + "/chat/completions", json={**CHAT, "stream": True}
    ) as resp:
        headers_at = time.monotonic() - start
        first = await resp.content.readline()
        first_at = time.monotonic() - start
        await resp.read()
    assert first.startswith(b"data: ")
    assert headers_at < 0.2 <= first_at


@attrs.define
class StepTimer:
    when: float
    callback: Callable[..., object]
    args: tuple[Any, ...]
    cancelled: bool = False

    def cancel(self) -> None:
        self.cancelled = True


class StepClock:
    """A clock the test moves by hand: what ``fake.clock`` takes."""

    def __init__(self) -> None:
        self.time = 50.0
        self.timers: list[StepTimer] = []

    def now(self) -> float:
        return self.time

    def call_at(self, when: float, callback: Callable[..., object], *args: Any) -> StepTimer:
        self.timers.append(StepTimer(when, callback, args))
        return self.timers[-1]

    @property
    def due(self) -> list[float]:
        return [t.when for t in self.timers if not t.cancelled]

    def advance(self, seconds: float) -> None:
        self.time += seconds
        for timer in [t for t in self.timers if t.when <= self.time]:
            self.timers.remove(timer)
            if not timer.cancelled:
                timer.callback(*timer.args)


async def test_a_clock_given_to_the_fake_times_its_pauses(
    fake: FakeUpstream, http: aiohttp.ClientSession
) -> None:
    clock = StepClock()
    fake.clock = clock
    fake.script("slow", [Fault(stall_s=30, first_token_delay_s=30)])
    async with asyncio.timeout(5):  # thirty-second pauses, in no real time
        answer = asyncio.ensure_future(
            http.post(fake.base_url("slow") + "/chat/completions", json={**CHAT, "stream": True})
        )
        await wait_for(lambda: clock.due == [80.0], timeout=1.0)
        clock.advance(29)
        assert not answer.done() and clock.due == [80.0]
        clock.advance(1)  # the stall is over: headers, then the first token's pause
        async with await answer as resp:
            await wait_for(lambda: clock.due == [110.0], timeout=1.0)
            clock.advance(30)
            body = await resp.read()
    assert body.endswith(b"data: [DONE]\n\n")
    assert fake.requests("slow")[0].received_at == 50.0
    fake.clock = None


def test_scenario_names() -> None:
    assert fault_for_scenario_name("ok") == Fault()
    assert fault_for_scenario_name("whatever") == Fault()
    assert fault_for_scenario_name("err418").status == 418
    assert fault_for_scenario_name("stall").stall_s == 3600
    assert fault_for_scenario_name("slowfirst").first_token_delay_s == 3600
    assert fault_for_scenario_name("slow").token_delay_s == 0.05
    assert fault_for_scenario_name("die3").die_after_chunks == 3
    assert fault_for_scenario_name("empty").empty_length
    trickle = fault_for_scenario_name("trickle")
    assert (trickle.first_token_delay_s, trickle.token_delay_s) == (0.5, 0.5)
    assert trickle.text is not None and len(trickle.text.split()) == 60
    assert fault_for_scenario_name("trickle3x20") == Fault(
        first_token_delay_s=0.02, token_delay_s=0.02, text="tok1 tok2 tok3"
    )


async def test_trickle_sends_one_token_per_interval(
    fake: FakeUpstream, http: aiohttp.ClientSession
) -> None:
    start = time.monotonic()
    arrivals: list[tuple[float, bytes]] = []
    async with http.post(
        fake.base_url("trickle4x100") + "/chat/completions", json={**CHAT, "stream": True}
    ) as resp:
        headers_at = time.monotonic() - start
        async for line in resp.content:
            if line.startswith(b"data: "):
                arrivals.append((time.monotonic() - start, line[6:].strip()))
    events = [payload for _, payload in arrivals]
    assert events[-1] == b"[DONE]"
    chunks = [json.loads(e) for e in events[:-1]]
    texts = [c["choices"][0]["delta"].get("content") for c in chunks if c["choices"]]
    assert "".join(t for t in texts if t) == "tok1 tok2 tok3 tok4"
    # The role chunk and tok1 come 100 ms after the headers, then 100 ms a token.
    token_times = [at for at, e in arrivals if b"tok" in e]
    assert len(token_times) == 4
    for i, at in enumerate(token_times, 1):
        assert at >= i * 0.1 - 0.01  # sent one by one, none early
    assert headers_at < token_times[0] - 0.05  # the headers at once
    assert token_times[-1] < 2.0


# --- scripts ----------------------------------------------------------------


async def test_script_consumed_in_order_then_name_decides(
    fake: FakeUpstream, http: aiohttp.ClientSession
) -> None:
    fake.script("beta", [Fault(status=503), Fault(status=503), Fault()])
    fake.script("err500", [Fault(text="scripted")])
    statuses = []
    for _ in range(4):
        async with http.post(fake.base_url("beta") + "/chat/completions", json=CHAT) as resp:
            statuses.append(resp.status)
    assert statuses == [503, 503, 200, 200]

    async with http.post(fake.base_url("err500") + "/chat/completions", json=CHAT) as resp:
        assert (await resp.json())["choices"][0]["message"]["content"] == "scripted"
    async with http.post(fake.base_url("err500") + "/chat/completions", json=CHAT) as resp:
        assert resp.status == 500

    # A new script replaces the old one rather than appending to it.
    fake.script("beta", [Fault(status=502), Fault(status=502)])
    fake.script("beta", [Fault(status=429)])
    async with http.post(fake.base_url("beta") + "/chat/completions", json=CHAT) as resp:
        assert resp.status == 429
    async with http.post(fake.base_url("beta") + "/chat/completions", json=CHAT) as resp:
        assert resp.status == 200


async def test_retry_after_and_body_override(
    fake: FakeUpstream, http: aiohttp.ClientSession
) -> None:
    fake.script(
        "gamma",
        [
            Fault(status=429, headers={"Retry-After": "7"}),
            Fault(status=502, body=b"<html>bad</html>", headers={"Content-Type": "text/html"}),
            Fault(status=200, body={"custom": True}),
        ],
    )
    url = fake.base_url("gamma") + "/chat/completions"
    async with http.post(url, json=CHAT) as resp:
        assert resp.status == 429
        assert resp.headers["Retry-After"] == "7"
        assert (await resp.json())["error"]["code"] == "rate_limit_exceeded"
    async with http.post(url, json=CHAT) as resp:
        assert resp.status == 502
        assert resp.headers["Content-Type"] == "text/html"
        assert await resp.read() == b"<html>bad</html>"
    async with http.post(url, json=CHAT) as resp:
        assert await resp.json() == {"custom": True}


async def test_stream_error_event(fake: FakeUpstream, http: aiohttp.ClientSession) -> None:
    boom = {"message": "boom", "type": "server_error"}
    fake.script("delta", [Fault(die_after_chunks=1, stream_error=boom)])
    async with http.post(
        fake.base_url("delta") + "/chat/completions", json={**CHAT, "stream": True}
    ) as resp:
        events = await read_events(resp)  # ends cleanly: no exception
    assert orjson.loads(events[1])["choices"][0]["delta"]["content"] == "Hello"
    assert orjson.loads(events[-1]) == {"error": {"message": "boom", "type": "server_error"}}
    assert b"[DONE]" not in events


async def test_max_tokens_truncates(fake: FakeUpstream) -> None:
    async with sdk(fake, "ok") as client:
        completion = await client.chat.completions.create(
            model="m1", messages=MESSAGES, max_tokens=2
        )
    assert completion.choices[0].message.content == "Hello from"
    assert completion.choices[0].finish_reason == "length"


# --- records and counters ---------------------------------------------------


async def test_hits_and_requests(fake: FakeUpstream) -> None:
    before = time.monotonic()
    async with sdk(fake, "rec") as client:
        await client.chat.completions.create(model="m1", messages=MESSAGES)
        await client.embeddings.create(model="e", input="x", encoding_format="float")
        await client.models.list()
    assert fake.hits("rec") == 3
    assert fake.hits("rec", "completions") == 1
    assert fake.hits("never") == 0 and fake.requests("never") == []

    recs = fake.requests("rec")
    assert [(r.method, r.path) for r in recs] == [
        ("POST", "chat/completions"),
        ("POST", "embeddings"),
        ("GET", "models"),
    ]
    assert all(isinstance(r, Recorded) and r.scenario == "rec" for r in recs)
    assert recs[0].body == CHAT
    assert recs[2].body is None
    assert recs[0].headers["authorization"] == "Bearer x"
    assert before <= recs[0].received_at <= recs[1].received_at <= recs[2].received_at

    fake.reset()
    assert fake.hits("rec") == 0 and fake.requests("rec") == []


def test_records_are_bounded_but_hits_exact() -> None:
    log = ScenarioLog()
    for i in range(MAX_RECORDED + 5):
        log.record(Recorded("s", "GET", "models", {}, i, 0.0))
    assert log.hits == MAX_RECORDED + 5
    assert len(log.records) == MAX_RECORDED
    assert log.records[0].body == 5


async def test_a_fake_keeping_no_requests_still_counts_them() -> None:
    """``--max-recorded 0``, as the benchmarks run it: hits exact, nothing kept."""
    async with FakeUpstream(max_recorded=0) as bench_fake, aiohttp.ClientSession() as session:
        for _ in range(3):
            async with session.post(
                f"{bench_fake.base_url('kept')}/chat/completions", json=CHAT
            ) as response:
                assert response.status == 200
        assert bench_fake.hits("kept") == 3
        assert bench_fake.requests("kept") == []


def test_the_command_line_refuses_a_negative_max_recorded(capsys) -> None:
    from prism_fake_upstream.cli import main

    with pytest.raises(SystemExit):
        main(["--max-recorded", "-1"])
    assert "--max-recorded" in capsys.readouterr().err


async def _send_and_hang_up(url: str, path: str, body: dict[str, Any], after: float) -> None:
    """Send a request on a raw socket and close it without waiting for the answer."""
    host, port = url.removeprefix("http://").split(":")
    _reader, writer = await asyncio.open_connection(host, int(port))
    payload = orjson.dumps(body)
    writer.write(
        f"POST {path} HTTP/1.1\r\nHost: {host}\r\nContent-Type: application/json\r\n"
        f"Content-Length: {len(payload)}\r\n\r\n".encode()
        + payload
    )
    await writer.drain()
    await asyncio.sleep(after)
    writer.close()
    await writer.wait_closed()


async def test_dropped_during_stall(fake: FakeUpstream) -> None:
    fake.script("hold", [Fault(stall_s=5)])
    await _send_and_hang_up(fake.url, "/s/hold/v1/chat/completions", CHAT, after=0.1)
    await wait_for(lambda: fake.dropped("hold") == 1, timeout=1.0)
    assert fake.hits("hold") == 1


async def test_dropped_during_stream(fake: FakeUpstream) -> None:
    fake.script("trickle", [Fault(token_delay_s=0.2)])
    await _send_and_hang_up(
        fake.url, "/s/trickle/v1/chat/completions", {**CHAT, "stream": True}, after=0.1
    )
    await wait_for(lambda: fake.dropped("trickle") == 1, timeout=1.0)


async def test_completed_requests_are_not_dropped(fake: FakeUpstream) -> None:
    async with sdk(fake, "ok") as client:
        stream = await client.chat.completions.create(model="m1", messages=MESSAGES, stream=True)
        _ = [c async for c in stream]
    await asyncio.sleep(0.05)
    assert fake.dropped("ok") == 0


async def test_app_runs_under_foreign_runner() -> None:
    # Someone else's runner will not cancel handlers on disconnect; drops
    # must still be noticed.
    fake = FakeUpstream()
    runner = web.AppRunner(fake.app)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    try:
        port = runner.addresses[0][1]
        fake.script("hold", [Fault(stall_s=5)])
        await _send_and_hang_up(
            f"http://127.0.0.1:{port}", "/s/hold/v1/chat/completions", CHAT, after=0.05
        )
        await wait_for(lambda: fake.dropped("hold") == 1, timeout=1.0)
    finally:
        await runner.cleanup()


# --- control API ------------------------------------------------------------


async def test_control_api_round_trip(fake: FakeUpstream, http: aiohttp.ClientSession) -> None:
    faults = [
        Fault(status=503, headers={"Retry-After": "1"}),
        Fault(status=418, body='{"teapot": true}'),
        Fault(body={"custom": 1}),
        Fault(),
    ]
    async with http.post(fake.url + "/_fake/script/ctl", json=[f.to_json() for f in faults]) as r:
        assert r.status == 204

    url = fake.base_url("ctl") + "/chat/completions"
    async with http.post(url, json=CHAT) as r:
        assert (r.status, r.headers["Retry-After"]) == (503, "1")
    async with http.post(url, json=CHAT) as r:
        assert (r.status, await r.json()) == (418, {"teapot": True})
    async with http.post(url, json=CHAT) as r:
        assert await r.json() == {"custom": 1}
    async with http.post(url, json=CHAT) as r:
        assert r.status == 200

    async with http.get(fake.url + "/_fake/hits/ctl") as r:
        assert await r.json() == {"hits": 4, "dropped": 0}
    async with http.get(fake.url + "/_fake/hits/unknown") as r:
        assert await r.json() == {"hits": 0, "dropped": 0}

    async with http.post(fake.url + "/_fake/script/ctl", json=[{"stall": 3}]) as r:
        assert r.status == 400
    async with http.post(fake.url + "/_fake/script/ctl", json={"status": 500}) as r:
        assert r.status == 400

    async with http.post(fake.url + "/_fake/reset") as r:
        assert r.status == 204
    async with http.get(fake.url + "/_fake/hits/ctl") as r:
        assert await r.json() == {"hits": 0, "dropped": 0}


def test_fault_json_round_trip_and_validation() -> None:
    fault = Fault(
        status=429,
        headers={"Retry-After": "2"},
        stall_s=0.5,
        die_after_chunks=3,
        text="hi",
        stream_error={"message": "x"},
        thinking="",
        redacted_thinking="opaque",
    )
    assert fault_from_json(fault.to_json()) == fault
    assert fault_from_json({}) == Fault()
    assert fault_from_json({"body": "raw"}).body == b"raw"
    for bad in (
        {"status": "500"},
        {"stall_s": -1},
        {"headers": {"a": 1}},
        {"nope": 1},
        {"thinking": 1},
        [1],
    ):
        with pytest.raises(ValueError):
            fault_from_json(bad)


# --- lifecycle --------------------------------------------------------------


async def test_start_stop_and_urls() -> None:
    fake = FakeUpstream()
    with pytest.raises(RuntimeError):
        _ = fake.url
    await fake.start(host="127.0.0.1", port=0)
    try:
        assert fake.url.startswith("http://127.0.0.1:")
        assert fake.base_url("ok") == fake.url + "/s/ok/v1"
        assert isinstance(fake.app, web.Application)
    finally:
        await fake.stop()
    await fake.stop()  # idempotent


async def test_stop_does_not_wait_for_stalled_clients() -> None:
    fake = FakeUpstream()
    await fake.start()
    request: Awaitable[Any]
    async with aiohttp.ClientSession() as http:
        request = asyncio.ensure_future(
            http.post(fake.base_url("stall") + "/chat/completions", json=CHAT)
        )
        await wait_for(lambda: fake.hits("stall") == 1)
        start = time.monotonic()
        await fake.stop()
        assert time.monotonic() - start < 2
        with pytest.raises(aiohttp.ClientError):
            await request


# --- OpenAI tool calls ------------------------------------------------------

WEATHER_FUNCTION: ChatCompletionFunctionToolParam = {
    "type": "function",
    "function": {
        "name": "get_weather",
        "description": "Current weather in a city",
        "parameters": {
            "type": "object",
            "properties": {"location": {"type": "string"}, "unit": {"type": "string"}},
            "required": ["location"],
        },
    },
}
OTHER_FUNCTION: ChatCompletionFunctionToolParam = {
    "type": "function",
    "function": {"name": "get_time", "parameters": {"type": "object", "properties": {}}},
}
TOOL_INPUT = {"location": "Paris"}


async def test_openai_tool_call(fake: FakeUpstream) -> None:
    async with sdk(fake, "ok") as client:
        completion = await client.chat.completions.create(
            model="m1", messages=MESSAGES, tools=[WEATHER_FUNCTION, OTHER_FUNCTION]
        )
    choice = completion.choices[0]
    assert choice.finish_reason == "tool_calls"
    assert choice.message.content is None
    calls = choice.message.tool_calls
    assert calls is not None and len(calls) == 1
    call = calls[0]
    assert call.type == "function" and call.id.startswith("call_")
    assert call.function.name == "get_weather"
    assert orjson.loads(call.function.arguments) == TOOL_INPUT
    assert completion.usage is not None and completion.usage.completion_tokens == 2


async def test_openai_tool_call_stream(fake: FakeUpstream) -> None:
    async with sdk(fake, "ok") as client:
        stream = await client.chat.completions.create(
            model="m1",
            messages=MESSAGES,
            tools=[WEATHER_FUNCTION, OTHER_FUNCTION],
            tool_choice={"type": "function", "function": {"name": "get_time"}},
            stream=True,
        )
        chunks = [c async for c in stream]
        stream = await client.chat.completions.create(
            model="m1", messages=MESSAGES, tools=[WEATHER_FUNCTION], stream=True
        )
        weather = [c async for c in stream]

    # The named tool is called; it has no required parameters.
    first = chunks[0].choices[0].delta
    assert first.role == "assistant" and first.tool_calls is not None
    assert first.tool_calls[0].function is not None
    assert first.tool_calls[0].function.name == "get_time"
    assert chunks[-1].choices[0].finish_reason == "tool_calls"

    head = weather[0].choices[0].delta.tool_calls
    assert head is not None and head[0].index == 0
    assert head[0].id is not None and head[0].id.startswith("call_")
    assert head[0].type == "function"
    assert head[0].function is not None
    assert (head[0].function.name, head[0].function.arguments) == ("get_weather", "")
    fragments = []
    for chunk in weather[1:-1]:
        delta = chunk.choices[0].delta
        assert delta.role is None and delta.content is None and delta.tool_calls is not None
        (part,) = delta.tool_calls
        assert part.index == 0 and part.id is None and part.function is not None
        assert part.function.name is None
        fragments.append(part.function.arguments or "")
    assert len(fragments) > 1
    assert orjson.loads("".join(fragments)) == TOOL_INPUT
    assert weather[-1].choices[0].finish_reason == "tool_calls"
    assert weather[-1].choices[0].delta.tool_calls is None


async def test_openai_tool_round_trip_and_tool_choice_none(fake: FakeUpstream) -> None:
    async with sdk(fake, "ok") as client:
        first = await client.chat.completions.create(
            model="m1", messages=MESSAGES, tools=[WEATHER_FUNCTION]
        )
        calls = first.choices[0].message.tool_calls
        assert calls is not None
        call = calls[0]
        assert call.type == "function"
        history: list[ChatCompletionMessageParam] = [
            *MESSAGES,
            {
                "role": "assistant",
                "content": None,
                "tool_calls": [
                    {
                        "id": call.id,
                        "type": "function",
                        "function": {
                            "name": call.function.name,
                            "arguments": call.function.arguments,
                        },
                    }
                ],
            },
            {"role": "tool", "tool_call_id": call.id, "content": "18 degrees and sunny"},
        ]
        second = await client.chat.completions.create(
            model="m1", messages=history, tools=[WEATHER_FUNCTION]
        )
        declined = await client.chat.completions.create(
            model="m1", messages=MESSAGES, tools=[WEATHER_FUNCTION], tool_choice="none"
        )
    assert second.choices[0].message.content == "The tool said: 18 degrees and sunny"
    assert second.choices[0].finish_reason == "stop"
    assert second.choices[0].message.tool_calls is None
    assert declined.choices[0].message.content == DEFAULT_TEXT


def test_tool_arguments_rule() -> None:
    schema = {
        "type": "object",
        "properties": {
            "city": {"type": "string"},
            "days": {"type": "integer"},
            "unit": {"type": "string", "enum": ["celsius", "fahrenheit"]},
            "detailed": {"type": "boolean"},
            "tags": {"type": "array", "items": {"type": "string"}},
            "where": {
                "type": "object",
                "properties": {"lat": {"type": "number"}, "note": {"type": "string"}},
                "required": ["lat"],
            },
            "maybe": {"type": ["null", "string"]},
            "optional": {"type": "string"},
        },
        "required": ["city", "days", "unit", "detailed", "tags", "where", "maybe"],
    }
    assert tool_arguments(schema) == {
        "city": "Paris",
        "days": 1,
        "unit": "celsius",
        "detailed": True,
        "tags": [],
        "where": {"lat": 1},
        "maybe": "Paris",
    }
    assert tool_arguments({"type": "object", "properties": {"a": {}}}) == {}
    assert tool_arguments(None) == {}


# --- Anthropic Messages -----------------------------------------------------

A_MESSAGES: list[MessageParam] = [{"role": "user", "content": "say something nice"}]
A_BODY: dict[str, Any] = {"model": "m1", "max_tokens": 100, "messages": A_MESSAGES}
WEATHER_TOOL: ToolParam = {
    "name": "get_weather",
    "description": "Current weather in a city",
    "input_schema": {
        "type": "object",
        "properties": {"location": {"type": "string"}, "unit": {"type": "string"}},
        "required": ["location"],
    },
}
TIME_TOOL: ToolParam = {"name": "get_time", "input_schema": {"type": "object"}}


def claude(fake: FakeUpstream, scenario: str) -> anthropic.AsyncAnthropic:
    # The SDK appends /v1/messages itself: base_url stops at /s/{scenario}.
    return anthropic.AsyncAnthropic(
        base_url=fake.anthropic_base_url(scenario), api_key="x", max_retries=0
    )


async def read_sse(resp: aiohttp.ClientResponse) -> list[tuple[str, dict[str, Any]]]:
    """(event name, data) of every Anthropic SSE event; checks each is well formed."""
    raw = await resp.read()
    assert raw.endswith(b"\n\n")
    events = []
    for block in raw[:-2].split(b"\n\n"):
        name_line, data_line = block.split(b"\n")
        name = name_line.removeprefix(b"event: ").decode()
        data = orjson.loads(data_line.removeprefix(b"data: "))
        assert data["type"] == name
        events.append((name, data))
    return events


async def test_anthropic_sdk_message(fake: FakeUpstream) -> None:
    assert fake.anthropic_base_url("ok") == fake.url + "/s/ok"
    async with claude(fake, "ok") as client:
        message = await client.messages.create(
            model="m1",
            max_tokens=100,
            system="be kind",
            messages=A_MESSAGES,
            stop_sequences=["END"],
            metadata={"user_id": "u1"},
            # Not a keyword of this SDK version; the fake accepts and records it.
            extra_body={"temperature": 0.5},
        )
    assert message.type == "message" and message.role == "assistant"
    assert message.id.startswith("msg_")
    assert message.model == "m1"
    assert len(message.content) == 1
    block = message.content[0]
    assert block.type == "text" and block.text == DEFAULT_TEXT
    assert message.stop_reason == "end_turn" and message.stop_sequence is None
    assert message.usage.input_tokens == 5  # "be kind" + "say something nice"
    assert message.usage.output_tokens == len(DEFAULT_TEXT.split())
    assert message.usage.cache_creation_input_tokens == 0
    assert message.usage.cache_read_input_tokens == 0

    (rec,) = fake.requests("ok")
    assert rec.path == "messages" and rec.method == "POST"
    assert rec.body["system"] == "be kind" and rec.body["max_tokens"] == 100
    assert rec.body["temperature"] == 0.5 and rec.body["metadata"] == {"user_id": "u1"}
    # anthropic 2.x sends api_key as a Bearer token; older SDKs and curl
    # examples use x-api-key (recorded too, see the raw test below).
    assert rec.headers.get("x-api-key") == "x" or rec.headers["authorization"] == "Bearer x"
    assert rec.headers["anthropic-version"]
    assert fake.hits("ok", "messages") == 1


async def test_anthropic_raw_message_shape(fake: FakeUpstream, http: aiohttp.ClientSession) -> None:
    body = {**A_BODY, "system": [{"type": "text", "text": "be kind"}]}
    headers = {"x-api-key": "sk-ant-x", "anthropic-version": "2023-06-01"}
    async with http.post(fake.url + "/s/ok/v1/messages", json=body, headers=headers) as resp:
        assert resp.status == 200
        assert resp.headers["Content-Type"] == "application/json"
        assert resp.headers["request-id"].startswith("req_")
        data = await resp.json()
    assert data == {
        "id": data["id"],
        "type": "message",
        "role": "assistant",
        "model": "m1",
        "content": [{"type": "text", "text": DEFAULT_TEXT}],
        "stop_reason": "end_turn",
        "stop_sequence": None,
        "usage": {
            "input_tokens": 5,
            "output_tokens": len(DEFAULT_TEXT.split()),
            "cache_creation_input_tokens": 0,
            "cache_read_input_tokens": 0,
        },
    }
    (rec,) = fake.requests("ok")
    assert rec.headers["x-api-key"] == "sk-ant-x"
    assert rec.headers["anthropic-version"] == "2023-06-01"

    # Neither header is required.
    async with http.post(fake.url + "/s/ok/v1/messages", json=A_BODY) as resp:
        assert resp.status == 200


async def test_anthropic_sdk_stream(fake: FakeUpstream) -> None:
    text = "  Spaces  are\tkept exactly, even trailing ones.  "
    fake.script("ok", [Fault(text=text)])
    async with (
        claude(fake, "ok") as client,
        client.messages.stream(model="m1", max_tokens=100, messages=A_MESSAGES) as stream,
    ):
        pieces = [t async for t in stream.text_stream]
        final = await stream.get_final_message()
    assert "".join(pieces) == text
    assert len(pieces) == len(text.split())
    assert final.content[0].type == "text" and final.content[0].text == text
    assert final.stop_reason == "end_turn"
    assert final.usage.input_tokens == 3
    assert final.usage.output_tokens == len(text.split())


async def test_anthropic_raw_stream_wire_format(
    fake: FakeUpstream, http: aiohttp.ClientSession
) -> None:
    body = {**A_BODY, "stream": True}
    async with http.post(fake.url + "/s/ok/v1/messages", json=body) as resp:
        assert resp.status == 200
        assert resp.headers["Content-Type"].startswith("text/event-stream")
        events = await read_sse(resp)
    words = len(DEFAULT_TEXT.split())
    names = [name for name, _ in events]
    assert names == [
        "message_start",
        "content_block_start",
        "ping",
        *["content_block_delta"] * words,
        "content_block_stop",
        "message_delta",
        "message_stop",
    ]
    start = events[0][1]["message"]
    assert start["id"].startswith("msg_") and start["model"] == "m1"
    assert (start["content"], start["stop_reason"], start["stop_sequence"]) == ([], None, None)
    assert start["usage"] == {
        "input_tokens": 3,
        "output_tokens": 1,
        "cache_creation_input_tokens": 0,
        "cache_read_input_tokens": 0,
    }
    assert events[1][1] == {
        "type": "content_block_start",
        "index": 0,
        "content_block": {"type": "text", "text": ""},
    }
    deltas = [data for name, data in events if name == "content_block_delta"]
    assert all(d["index"] == 0 and d["delta"]["type"] == "text_delta" for d in deltas)
    assert "".join(d["delta"]["text"] for d in deltas) == DEFAULT_TEXT
    assert events[-3][1] == {"type": "content_block_stop", "index": 0}
    assert events[-2][1] == {
        "type": "message_delta",
        "delta": {"stop_reason": "end_turn", "stop_sequence": None},
        "usage": {"output_tokens": words},
    }


@pytest.mark.parametrize("stream", [False, True])
async def test_anthropic_tool_use(fake: FakeUpstream, stream: bool) -> None:
    message: Message
    async with claude(fake, "ok") as client:
        if stream:
            async with client.messages.stream(
                model="m1", max_tokens=100, messages=A_MESSAGES, tools=[WEATHER_TOOL, TIME_TOOL]
            ) as s:
                events = [e async for e in s]
                message = await s.get_final_message()
            json_parts = [
                e.delta.partial_json
                for e in events
                if e.type == "content_block_delta" and e.delta.type == "input_json_delta"
            ]
            assert len(json_parts) > 1
            assert orjson.loads("".join(json_parts)) == TOOL_INPUT
        else:
            message = await client.messages.create(
                model="m1", max_tokens=100, messages=A_MESSAGES, tools=[WEATHER_TOOL, TIME_TOOL]
            )
    assert message.stop_reason == "tool_use"
    (block,) = message.content
    assert block.type == "tool_use"
    assert block.id.startswith("toolu_") and block.name == "get_weather"
    assert block.input == TOOL_INPUT
    assert message.usage.output_tokens == 2


async def test_anthropic_raw_tool_stream(fake: FakeUpstream, http: aiohttp.ClientSession) -> None:
    body = {
        **A_BODY,
        "stream": True,
        "tools": [WEATHER_TOOL, TIME_TOOL],
        "tool_choice": {"type": "tool", "name": "get_time"},
    }
    async with http.post(fake.url + "/s/ok/v1/messages", json=body) as resp:
        events = await read_sse(resp)
    block = events[1][1]["content_block"]
    assert block == {"type": "tool_use", "id": block["id"], "name": "get_time", "input": {}}
    assert events[3][1]["delta"] == {"type": "input_json_delta", "partial_json": "{}"}
    assert events[-2][1]["delta"]["stop_reason"] == "tool_use"


async def test_anthropic_thinking_blocks(fake: FakeUpstream, http: aiohttp.ClientSession) -> None:
    thinking = Fault(thinking="Two and two.", redacted_thinking="ZW5jcnlwdGVk", text="Four.")
    fake.script("ok", [thinking, thinking])
    async with claude(fake, "ok") as client:
        message = await client.messages.create(model="m1", max_tokens=100, messages=A_MESSAGES)
    redacted, thought, text = message.content
    assert (redacted.type, redacted.data) == ("redacted_thinking", "ZW5jcnlwdGVk")
    assert (thought.type, thought.thinking) == ("thinking", "Two and two.")
    assert base64.b64decode(thought.signature)
    assert (text.type, text.text) == ("text", "Four.")
    assert message.usage.output_tokens == 3 + 1  # the thinking's word tokens count

    # Streamed as the API streams them: the redacted block whole in its start,
    # the thinking as deltas, then its signature, each block at its own index.
    async with http.post(fake.url + "/s/ok/v1/messages", json={**A_BODY, "stream": True}) as resp:
        events = await read_sse(resp)
    inner = [data.get("delta") or data.get("content_block") or {} for _, data in events]
    shape = [
        (name, data.get("index"), part.get("type"))
        for (name, data), part in zip(events, inner, strict=True)
    ]
    assert shape == [
        ("message_start", None, None),
        ("content_block_start", 0, "redacted_thinking"),
        ("ping", None, None),
        ("content_block_stop", 0, None),
        ("content_block_start", 1, "thinking"),
        *[("content_block_delta", 1, "thinking_delta")] * 3,
        ("content_block_delta", 1, "signature_delta"),
        ("content_block_stop", 1, None),
        ("content_block_start", 2, "text"),
        ("content_block_delta", 2, "text_delta"),
        ("content_block_stop", 2, None),
        ("message_delta", None, None),
        ("message_stop", None, None),
    ]
    assert events[1][1]["content_block"]["data"] == "ZW5jcnlwdGVk"
    assert "".join(d["delta"].get("thinking", "") for _, d in events[5:8]) == "Two and two."
    assert events[-2][1]["usage"] == {"output_tokens": 4}


async def test_anthropic_tool_round_trip_and_tool_choice_none(fake: FakeUpstream) -> None:
    async with claude(fake, "ok") as client:
        first = await client.messages.create(
            model="m1", max_tokens=100, messages=A_MESSAGES, tools=[WEATHER_TOOL]
        )
        block = first.content[0]
        assert block.type == "tool_use"
        history: list[MessageParam] = [
            *A_MESSAGES,
            {
                "role": "assistant",
                "content": [
                    {"type": "tool_use", "id": block.id, "name": block.name, "input": block.input}
                ],
            },
            {
                "role": "user",
                "content": [
                    {
                        "type": "tool_result",
                        "tool_use_id": block.id,
                        "content": [{"type": "text", "text": "18 degrees and sunny"}],
                    }
                ],
            },
        ]
        second = await client.messages.create(
            model="m1", max_tokens=100, messages=history, tools=[WEATHER_TOOL]
        )
        declined = await client.messages.create(
            model="m1",
            max_tokens=100,
            messages=A_MESSAGES,
            tools=[WEATHER_TOOL],
            tool_choice={"type": "none"},
        )
    assert second.stop_reason == "end_turn"
    assert [b.type for b in second.content] == ["text"]
    assert second.content[0].type == "text"
    assert second.content[0].text == "The tool said: 18 degrees and sunny"
    assert second.usage.input_tokens == 3 + 4  # the tool result's words count too
    assert declined.stop_reason == "end_turn"
    assert declined.content[0].type == "text" and declined.content[0].text == DEFAULT_TEXT


@pytest.mark.parametrize(
    ("scenario", "exc", "err_type"),
    [
        ("err400", anthropic.BadRequestError, "invalid_request_error"),
        ("err401", anthropic.AuthenticationError, "authentication_error"),
        ("err403", anthropic.PermissionDeniedError, "permission_error"),
        ("err404", anthropic.NotFoundError, "not_found_error"),
        ("err413", anthropic.APIStatusError, "request_too_large"),
        ("err429", anthropic.RateLimitError, "rate_limit_error"),
        ("err500", anthropic.InternalServerError, "api_error"),
        ("err529", anthropic.InternalServerError, "overloaded_error"),
    ],
)
async def test_anthropic_error_scenarios(
    fake: FakeUpstream, scenario: str, exc: type[anthropic.APIStatusError], err_type: str
) -> None:
    async with claude(fake, scenario) as client:
        with pytest.raises(exc) as info:
            await client.messages.create(model="m1", max_tokens=10, messages=A_MESSAGES)
    assert info.value.status_code == int(scenario.removeprefix("err"))
    body = info.value.body
    assert isinstance(body, dict)
    assert body["type"] == "error" and body["error"]["type"] == err_type
    assert isinstance(body["error"]["message"], str)
    assert body["request_id"].startswith("req_")
    assert info.value.request_id == body["request_id"]


async def test_anthropic_err529_stream_and_retry_after(fake: FakeUpstream) -> None:
    fake.script("zeta", [Fault(status=429, headers={"Retry-After": "7"})])
    async with claude(fake, "err529") as client:
        with pytest.raises(anthropic.InternalServerError) as info:
            async with client.messages.stream(model="m1", max_tokens=10, messages=A_MESSAGES):
                pass
    assert info.value.status_code == 529
    assert info.value.message.startswith("Error code: 529")
    async with claude(fake, "zeta") as client:
        with pytest.raises(anthropic.RateLimitError) as limited:
            await client.messages.create(model="m1", max_tokens=10, messages=A_MESSAGES)
    assert limited.value.response.headers["retry-after"] == "7"
    assert isinstance(limited.value.body, dict)
    assert limited.value.body["error"]["type"] == "rate_limit_error"


async def test_anthropic_die2_breaks_the_stream(
    fake: FakeUpstream, http: aiohttp.ClientSession
) -> None:
    pieces: list[str] = []
    async with claude(fake, "die2") as client:
        with pytest.raises(Exception) as info:  # the transport's own error type
            async with client.messages.stream(
                model="m1", max_tokens=100, messages=A_MESSAGES
            ) as stream:
                async for text in stream.text_stream:
                    pieces.append(text)
        assert not isinstance(info.value, anthropic.APIStatusError)
        with pytest.raises(anthropic.APIConnectionError):
            await client.messages.create(model="m1", max_tokens=100, messages=A_MESSAGES)
    assert pieces == ["Hello", " from"]

    lines: list[bytes] = []
    with pytest.raises(aiohttp.ClientPayloadError):
        async with http.post(
            fake.url + "/s/die2/v1/messages", json={**A_BODY, "stream": True}
        ) as resp:
            assert resp.status == 200
            async for line in resp.content:
                lines.append(line)
    names = [line.removeprefix(b"event: ").strip() for line in lines if line.startswith(b"event")]
    assert (
        names == [b"message_start", b"content_block_start", b"ping"] + [b"content_block_delta"] * 2
    )


@pytest.mark.parametrize("stream", [False, True])
async def test_anthropic_empty_is_max_tokens_without_content(
    fake: FakeUpstream, stream: bool
) -> None:
    message: Message
    async with claude(fake, "empty") as client:
        if stream:
            async with client.messages.stream(model="m1", max_tokens=100, messages=A_MESSAGES) as s:
                events = [e.type async for e in s]
                message = await s.get_final_message()
            assert "content_block_start" not in events
        else:
            message = await client.messages.create(model="m1", max_tokens=100, messages=A_MESSAGES)
    assert message.stop_reason == "max_tokens"
    assert message.content == []
    assert message.usage.output_tokens == 0


async def test_anthropic_max_tokens_truncates(fake: FakeUpstream) -> None:
    async with claude(fake, "ok") as client:
        message = await client.messages.create(model="m1", max_tokens=2, messages=A_MESSAGES)
        async with client.messages.stream(model="m1", max_tokens=3, messages=A_MESSAGES) as s:
            streamed = await s.get_final_text()
            final = await s.get_final_message()
    assert message.content[0].type == "text" and message.content[0].text == "Hello from"
    assert message.stop_reason == "max_tokens" and message.usage.output_tokens == 2
    assert streamed == "Hello from m1."
    assert final.stop_reason == "max_tokens" and final.usage.output_tokens == 3


@pytest.mark.parametrize(
    ("body", "message"),
    [
        ({"model": "m1", "messages": A_MESSAGES}, "max_tokens: Field required"),
        ({"max_tokens": 5, "messages": A_MESSAGES}, "model: Field required"),
        ({"model": "m1", "max_tokens": 5}, "messages: Field required"),
        ({"model": "m1", "max_tokens": 0, "messages": A_MESSAGES}, "max_tokens: Input should"),
        ({"model": "m1", "max_tokens": 5, "messages": []}, "messages: at least one"),
    ],
)
async def test_anthropic_bad_requests(
    fake: FakeUpstream, http: aiohttp.ClientSession, body: dict[str, Any], message: str
) -> None:
    async with http.post(fake.url + "/s/ok/v1/messages", json=body) as resp:
        assert resp.status == 400
        data = await resp.json()
    assert data["type"] == "error"
    assert data["error"]["type"] == "invalid_request_error"
    assert data["error"]["message"].startswith(message)
    assert fake.hits("ok", "messages") == 1  # bad requests are recorded too


async def test_anthropic_stream_error_event(
    fake: FakeUpstream, http: aiohttp.ClientSession
) -> None:
    custom = {"type": "api_error", "message": "boom"}
    fake.script("eta", [Fault(stream_error={}), Fault(die_after_chunks=1, stream_error=custom)])
    async with claude(fake, "eta") as client:
        with pytest.raises(anthropic.APIStatusError) as info:
            async with client.messages.stream(model="m1", max_tokens=9, messages=A_MESSAGES) as s:
                _ = [e async for e in s]
    assert info.value.body == {
        "type": "error",
        "error": {"type": "overloaded_error", "message": "Overloaded"},
    }

    async with http.post(fake.url + "/s/eta/v1/messages", json={**A_BODY, "stream": True}) as r:
        events = await read_sse(r)  # ends cleanly: no exception
    assert [name for name, _ in events] == [
        "message_start",
        "content_block_start",
        "ping",
        "content_block_delta",
        "error",
    ]
    assert events[-1][1] == {"type": "error", "error": custom}


async def test_anthropic_custom_text_body_and_delays(
    fake: FakeUpstream, http: aiohttp.ClientSession
) -> None:
    fake.script(
        "theta",
        [
            Fault(text="scripted answer"),
            Fault(body={"custom": True}),
            Fault(first_token_delay_s=0.2, token_delay_s=0.02, text="a b c"),
        ],
    )
    url = fake.url + "/s/theta/v1/messages"
    async with http.post(url, json=A_BODY) as resp:
        assert (await resp.json())["content"] == [{"type": "text", "text": "scripted answer"}]
    async with http.post(url, json=A_BODY) as resp:
        assert (resp.status, await resp.json()) == (200, {"custom": True})

    start = time.monotonic()
    async with http.post(url, json={**A_BODY, "stream": True}) as resp:
        headers_at = time.monotonic() - start
        first = await resp.content.readline()
        first_at = time.monotonic() - start
        await resp.read()
        done_at = time.monotonic() - start
    assert first == b"event: message_start\n"
    assert headers_at < 0.15 <= first_at
    assert done_at >= 0.2 + 2 * 0.02


async def test_anthropic_dropped_during_stream(fake: FakeUpstream) -> None:
    fake.script("iota", [Fault(token_delay_s=0.2)])
    await _send_and_hang_up(fake.url, "/s/iota/v1/messages", {**A_BODY, "stream": True}, after=0.1)
    await wait_for(lambda: fake.dropped("iota") == 1, timeout=1.0)


async def test_anthropic_base_url_with_v1_gets_a_hint(fake: FakeUpstream) -> None:
    client = anthropic.AsyncAnthropic(base_url=fake.base_url("ok"), api_key="x", max_retries=0)
    async with client:
        with pytest.raises(anthropic.NotFoundError) as info:
            await client.messages.create(model="m1", max_tokens=10, messages=A_MESSAGES)
    assert "without /v1" in str(info.value)


# --- lying upstreams: usage overrides and bad stream events ------------------

WORDS = len(DEFAULT_TEXT.split())
# Beyond 64 bits on purpose: orjson cannot encode it, and a gateway's counters
# should not be able to hold it.
HUGE = 10**30


def sse_blocks(raw: bytes) -> list[bytes]:
    """The raw SSE events of a body, without their blank-line terminators."""
    assert raw.endswith(b"\n\n")
    return raw[:-2].split(b"\n\n")


def loads_exact(raw: bytes) -> Any:
    # The stdlib keeps integers beyond 64 bits; orjson would make them floats.
    return json.loads(raw)


@pytest.mark.parametrize("stream", [False, True])
async def test_openai_usage_override(
    fake: FakeUpstream, http: aiohttp.ClientSession, stream: bool
) -> None:
    lies = {"completion_tokens": HUGE, "prompt_tokens": "lots", "made_up": [-5, 1e308]}
    fake.script("liar", [Fault(usage=lies)] * 2)
    url = fake.base_url("liar") + "/chat/completions"
    body = {**CHAT, "stream": stream, "stream_options": {"include_usage": True}}
    async with http.post(url, json=body if stream else CHAT) as resp:
        raw = await resp.read()
    if stream:
        blocks = sse_blocks(raw)
        assert blocks[-1] == b"data: [DONE]"
        usage = loads_exact(blocks[-2].removeprefix(b"data: "))["usage"]
        assert all(b'"usage":null' in b for b in blocks[:-2])
    else:
        usage = loads_exact(raw)["usage"]
    assert str(HUGE).encode() in raw
    assert usage["completion_tokens"] == HUGE
    assert usage["prompt_tokens"] == "lots"
    assert usage["made_up"] == [-5, 1e308]
    # Only the overridden fields lie; the rest is still the honest count.
    assert usage["total_tokens"] == 3 + WORDS
    assert usage["completion_tokens_details"]["reasoning_tokens"] == 0

    # Without include_usage a stream still has no usage chunk to lie in.
    if stream:
        async with http.post(url, json={**CHAT, "stream": True}) as resp:
            raw = await resp.read()
        assert b"usage" not in raw and str(HUGE).encode() not in raw


async def test_openai_embeddings_usage_override(
    fake: FakeUpstream, http: aiohttp.ClientSession
) -> None:
    fake.script("liar", [Fault(usage={"prompt_tokens": -5, "total_tokens": 1e308})])
    async with http.post(
        fake.base_url("liar") + "/embeddings", json={"model": "e1", "input": "a b"}
    ) as resp:
        data = await resp.json()
    assert data["usage"] == {"prompt_tokens": -5, "total_tokens": 1e308}
    assert len(data["data"][0]["embedding"]) == 8


async def test_anthropic_usage_override(fake: FakeUpstream, http: aiohttp.ClientSession) -> None:
    lies = {"input_tokens": "lots", "output_tokens": -5, "made_up": HUGE}
    fake.script("liar", [Fault(usage=lies)] * 2)
    url = fake.url + "/s/liar/v1/messages"
    async with http.post(url, json=A_BODY) as resp:
        message = loads_exact(await resp.read())
    assert message["usage"] == {
        "input_tokens": "lots",
        "cache_creation_input_tokens": 0,
        "cache_read_input_tokens": 0,
        "output_tokens": -5,
        "made_up": HUGE,
    }

    async with http.post(url, json={**A_BODY, "stream": True}) as resp:
        blocks = sse_blocks(await resp.read())
    events = {}
    for block in blocks:
        name, data = block.split(b"\n")
        events[name.removeprefix(b"event: ").decode()] = loads_exact(data.removeprefix(b"data: "))
    # Each event lies about the fields it carries; a key neither carries
    # goes into message_delta, whose usage is the final one.
    assert events["message_start"]["message"]["usage"] == {
        "input_tokens": "lots",
        "cache_creation_input_tokens": 0,
        "cache_read_input_tokens": 0,
        "output_tokens": -5,
    }
    assert events["message_delta"]["usage"] == {"output_tokens": -5, "made_up": HUGE}
    assert "message_stop" in events


@pytest.mark.parametrize(
    ("bad", "at", "position"),
    [
        (b'{"choices": [oops', 0, 0),
        (b'{"x": "\xff\xfe"}', 2, 2),
        (b"not json at all", WORDS, WORDS),
        (b'{"choices": [oops', 100, WORDS),
    ],
)
async def test_openai_bad_event(
    fake: FakeUpstream, http: aiohttp.ClientSession, bad: bytes, at: int, position: int
) -> None:
    fake.script("bad", [Fault(bad_event=bad, bad_event_at=at)] * 2)
    url = fake.base_url("bad") + "/chat/completions"
    body = {**CHAT, "stream": True, "stream_options": {"include_usage": True}}
    async with http.post(url, json=body) as resp:
        blocks = sse_blocks(await resp.read())
    # After the role chunk and `position` content chunks.
    assert blocks.index(b"data: " + bad) == 1 + position
    blocks.remove(b"data: " + bad)
    chunks = [orjson.loads(b.removeprefix(b"data: ")) for b in blocks[:-1]]
    assert blocks[-1] == b"data: [DONE]"
    assert "".join(c["choices"][0]["delta"].get("content") or "" for c in chunks[:-1]) == (
        DEFAULT_TEXT
    )
    assert chunks[-2]["choices"][0]["finish_reason"] == "stop"
    assert chunks[-1]["usage"]["completion_tokens"] == WORDS

    # A non-streamed answer has no events to spoil.
    async with http.post(url, json=CHAT) as resp:
        assert (await resp.json())["choices"][0]["message"]["content"] == DEFAULT_TEXT


async def test_bad_event_with_delays_and_cut_streams(
    fake: FakeUpstream, http: aiohttp.ClientSession
) -> None:
    bad = b"data: {oops\n\n"
    fake.script(
        "bad",
        [
            Fault(bad_event=b"{oops", bad_event_at=2, token_delay_s=0.01),
            Fault(bad_event=b"{oops", bad_event_at=2, die_after_chunks=2),
            Fault(bad_event=b"{oops", bad_event_at=3, die_after_chunks=2),
            Fault(bad_event=b"{oops", stream_error={"message": "boom"}),
        ],
    )
    url = fake.base_url("bad") + "/chat/completions"
    async with http.post(url, json={**CHAT, "stream": True}) as resp:
        raw = await resp.read()
    assert sse_blocks(raw).index(b"data: {oops") == 3
    assert raw.endswith(b"data: [DONE]\n\n")

    for expected in (True, False):
        received = b""
        with pytest.raises(aiohttp.ClientPayloadError):
            async with http.post(url, json={**CHAT, "stream": True}) as resp:
                async for line in resp.content:
                    received += line
        assert received.endswith(bad) is expected
        assert received.count(b'"content":"') == 3  # the role chunk and two words

    async with http.post(url, json={**CHAT, "stream": True}) as resp:
        blocks = sse_blocks(await resp.read())
    assert blocks[1:] == [b"data: {oops", b'data: {"error":{"message":"boom"}}']


@pytest.mark.parametrize(("at", "position"), [(0, 0), (1, 1), (100, WORDS)])
async def test_anthropic_bad_event(
    fake: FakeUpstream, http: aiohttp.ClientSession, at: int, position: int
) -> None:
    bad = b'{"type": "content_block_delta", "delta": \xff'
    fake.script("bad", [Fault(bad_event=bad, bad_event_at=at)] * 2)
    url = fake.url + "/s/bad/v1/messages"
    async with http.post(url, json={**A_BODY, "stream": True}) as resp:
        blocks = sse_blocks(await resp.read())
    # After message_start, content_block_start, ping and `position` deltas;
    # a bare data line, with no event name.
    assert blocks.index(b"data: " + bad) == 3 + position
    blocks.remove(b"data: " + bad)
    names = [b.split(b"\n")[0].removeprefix(b"event: ").decode() for b in blocks]
    assert names == [
        "message_start",
        "content_block_start",
        "ping",
        *["content_block_delta"] * WORDS,
        "content_block_stop",
        "message_delta",
        "message_stop",
    ]

    async with http.post(url, json=A_BODY) as resp:
        assert (await resp.json())["content"] == [{"type": "text", "text": DEFAULT_TEXT}]


async def test_control_api_usage_and_bad_event(
    fake: FakeUpstream, http: aiohttp.ClientSession
) -> None:
    fault = Fault(usage={"completion_tokens": HUGE}, bad_event=b'{"choices": [oops', bad_event_at=1)
    async with http.post(fake.url + "/_fake/script/ctl", json=[fault.to_json()]) as r:
        assert r.status == 204
    body = {**CHAT, "stream": True, "stream_options": {"include_usage": True}}
    async with http.post(fake.base_url("ctl") + "/chat/completions", json=body) as resp:
        blocks = sse_blocks(await resp.read())
    assert blocks[2] == b'data: {"choices": [oops'
    assert loads_exact(blocks[-2].removeprefix(b"data: "))["usage"]["completion_tokens"] == HUGE

    for bad in ({"bad_event_at": -1}, {"bad_event": 5}, {"usage": [1]}):
        async with http.post(fake.url + "/_fake/script/ctl", json=[bad]) as r:
            assert r.status == 400


def test_usage_and_bad_event_json_round_trip_and_validation() -> None:
    fault = Fault(usage={"output_tokens": -5, "x": "lots"}, bad_event=b"{oops", bad_event_at=3)
    assert fault.to_json() == {
        "usage": {"output_tokens": -5, "x": "lots"},
        "bad_event": "{oops",
        "bad_event_at": 3,
    }
    assert fault_from_json(fault.to_json()) == fault
    assert fault_from_json(orjson.loads(orjson.dumps(fault.to_json()))) == fault
    assert Fault(bad_event="{é").bad_event == "{é".encode()

    source = {"output_tokens": 1}
    copied = Fault(usage=source)
    source["output_tokens"] = 2
    assert copied.usage == {"output_tokens": 1}

    with pytest.raises(ValueError, match="UTF-8"):
        Fault(bad_event=b"\xff").to_json()
    with pytest.raises(ValueError):
        Fault(bad_event_at=-1)
    for bad in (
        {"usage": "lots"},
        {"usage": [1]},
        {"bad_event": 5},
        {"bad_event": {"x": 1}},
        {"bad_event_at": "1"},
        {"bad_event_at": True},
        {"bad_event_at": None},
        {"bad_event_at": -1},
    ):
        with pytest.raises(ValueError):
            fault_from_json(bad)
