"""Tests of the fake upstream itself, over real HTTP."""

from __future__ import annotations

import asyncio
import base64
import struct
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import Any

import aiohttp
import openai
import orjson
import pytest
from aiohttp import web
from openai.types.chat import ChatCompletionMessageParam
from prism_fake_upstream import FakeUpstream, Fault, Recorded
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


def test_scenario_names() -> None:
    assert fault_for_scenario_name("ok") == Fault()
    assert fault_for_scenario_name("whatever") == Fault()
    assert fault_for_scenario_name("err418").status == 418
    assert fault_for_scenario_name("stall").stall_s == 3600
    assert fault_for_scenario_name("slowfirst").first_token_delay_s == 3600
    assert fault_for_scenario_name("slow").token_delay_s == 0.05
    assert fault_for_scenario_name("die3").die_after_chunks == 3
    assert fault_for_scenario_name("empty").empty_length


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
    )
    assert fault_from_json(fault.to_json()) == fault
    assert fault_from_json({}) == Fault()
    assert fault_from_json({"body": "raw"}).body == b"raw"
    for bad in ({"status": "500"}, {"stall_s": -1}, {"headers": {"a": 1}}, {"nope": 1}, [1]):
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
