"""The OpenAI-compatible path end to end: the official SDK against the real server."""

from __future__ import annotations

import asyncio
import logging
from typing import Any

import aiohttp
import openai
import pytest
from prism_fake_upstream import Fault

from prism_proxy import hookimpl

MESSAGES = [{"role": "user", "content": "hello there"}]


async def test_chat_served_with_prism_headers(
    prism_fake, prism_gateway, catalog, recorder, prism_clock
):
    gw = await prism_gateway(catalog, clock=prism_clock)  # the retries' pauses take no time
    raw = await gw.openai().chat.completions.with_raw_response.create(
        model="chat-a", messages=MESSAGES
    )
    completion = raw.parse()
    assert (
        completion.choices[0].message.content
        == "Hello from up-alpha. This is the fake upstream answering."
    )
    assert raw.headers["x-prism-provider"] == "alpha"
    assert raw.headers["x-prism-model"] == "up-alpha"
    # The failing binding is retried (retries = 2 by default), then the next one serves.
    assert raw.headers["x-prism-attempts"] == "4"
    log = [entry.split()[:3] for entry in raw.headers["x-prism-attempt-log"].split("; ")]
    assert log == [["beta/up-beta", "transient", "500"]] * 3 + [["alpha/up-alpha", "ok", "200"]]
    request_id = raw.headers["x-prism-request-id"]
    assert request_id.startswith("req_")
    [settlement] = recorder.settlements_for(request_id)
    assert settlement.outcome == "ok"
    assert settlement.served.binding.id == "alpha/up-alpha"
    assert settlement.usage.output_tokens == completion.usage.completion_tokens
    # The upstream saw its own model name.
    assert prism_fake.requests("ok")[-1].body["model"] == "up-alpha"
    assert prism_fake.hits("err500") == 3


async def test_request_ids_sort_by_when_calls_arrived(prism_gateway, catalog, monkeypatch):
    """``req_`` + milliseconds + 64 random bits: a ledger's index on them grows at its end."""
    import time

    gw = await prism_gateway(catalog)
    client = gw.openai()
    now_ms = [1_796_000_000_000]
    monkeypatch.setattr(time, "time_ns", lambda: now_ms[0] * 1_000_000)
    ids = []
    for step in (0, 1, 0, 0, 250):
        now_ms[0] += step
        raw = await client.chat.completions.with_raw_response.create(
            model="chat-a", messages=MESSAGES
        )
        ids.append(raw.headers["x-prism-request-id"])
    assert all(len(i) == len("req_") + 28 and int(i[4:], 16) >= 0 for i in ids)
    assert ids[0][4:16] == f"{1_796_000_000_000:012x}"
    assert ids[0] < min(ids[1:4]) and max(ids[1:4]) < ids[4]
    assert len({i[:16] for i in ids[1:4]}) == 1  # one millisecond
    assert len(set(ids)) == len(ids)  # the same millisecond, told apart by the random part


async def test_streaming_chat_relays_chunks_and_hides_usage_unless_asked(
    prism_fake, prism_gateway, catalog, recorder
):
    gw = await prism_gateway(catalog)
    client = gw.openai()
    stream = await client.chat.completions.create(model="chat-a", messages=MESSAGES, stream=True)
    chunks = [chunk async for chunk in stream]
    content = [
        c.choices[0].delta.content for c in chunks if c.choices and c.choices[0].delta.content
    ]
    assert len(content) > 3
    assert "".join(content) == "Hello from up-alpha. This is the fake upstream answering."
    assert all(not c.usage for c in chunks)
    # Prism asked the upstream for usage anyway, to bill the call.
    assert prism_fake.requests("ok")[-1].body["stream_options"] == {"include_usage": True}
    assert recorder.settled[-1][1].usage.output_tokens > 0
    assert recorder.settled[-1][1].usage.estimated is False

    stream = await client.chat.completions.create(
        model="chat-a", messages=MESSAGES, stream=True, stream_options={"include_usage": True}
    )
    chunks = [chunk async for chunk in stream]
    assert chunks[-1].choices == []
    assert chunks[-1].usage.completion_tokens == len(content)


async def test_stream_headers_name_the_serving_binding(
    prism_fake, prism_gateway, catalog, prism_clock
):
    gw = await prism_gateway(catalog, clock=prism_clock)
    async with aiohttp.ClientSession() as session:
        async with session.post(
            gw.base_url + "/chat/completions",
            json={"model": "chat-a", "messages": MESSAGES, "stream": True},
        ) as response:
            assert response.status == 200
            assert response.headers["content-type"].startswith("text/event-stream")
            assert response.headers["x-prism-provider"] == "alpha"
            assert response.headers["x-prism-attempts"] == "4"
            text = await response.text()
    assert text.endswith("data: [DONE]\n\n")


async def test_embeddings(prism_fake, prism_gateway, catalog):
    gw = await prism_gateway(catalog)
    raw = await gw.openai().embeddings.with_raw_response.create(
        model="embed-a", input=["one", "two"]
    )
    result = raw.parse()
    assert [item.index for item in result.data] == [0, 1]
    assert len(result.data[0].embedding) > 0
    assert result.data[0].embedding != result.data[1].embedding
    assert raw.headers["x-prism-provider"] == "alpha"
    assert raw.headers["x-prism-model"] == "text-embed"


async def test_model_list_and_retrieve(prism_fake, prism_gateway, catalog):
    gw = await prism_gateway(catalog)
    client = gw.openai()
    models = [model.id async for model in client.models.list()]
    assert models == ["chat-a", "embed-a"]
    assert (await client.models.retrieve("chat-a")).id == "chat-a"
    with pytest.raises(openai.NotFoundError):
        await client.models.retrieve("nope")


async def test_every_binding_failing_gives_503_with_the_record(
    prism_fake, prism_gateway, catalog, recorder
):
    prism_fake.script("ok", [Fault(status=502)])
    gw = await prism_gateway(catalog, config={"retries": 0})
    with pytest.raises(openai.APIStatusError) as info:
        await gw.openai().chat.completions.create(model="chat-a", messages=MESSAGES)
    err = info.value
    assert err.status_code == 503
    assert err.code == "upstream_unavailable"
    headers = err.response.headers
    assert headers["x-prism-provider"] == "alpha"
    assert headers["x-prism-attempts"] == "2"
    assert "alpha/up-alpha transient 502" in headers["x-prism-attempt-log"]
    body = err.body
    assert [a["binding"] for a in body["attempts"]] == ["beta/up-beta", "alpha/up-alpha"]
    assert [a["status"] for a in body["attempts"]] == [500, 502]
    [settlement] = recorder.settlements_for(headers["x-prism-request-id"])
    assert settlement.outcome == "error" and settlement.served is None


async def test_embeddings_failure_code_is_prefixed(prism_fake, prism_gateway, catalog):
    prism_fake.script("ok", [Fault(status=500)])
    gw = await prism_gateway(catalog, config={"retries": 0})
    with pytest.raises(openai.APIStatusError) as info:
        await gw.openai().embeddings.create(model="embed-a", input="x")
    assert info.value.code == "runtime_embeddings_failed:upstream_unavailable"


async def test_request_error_is_returned_unchanged_without_failover(
    prism_fake, prism_gateway, catalog
):
    body = {
        "error": {
            "message": "This model's maximum context length is 8192 tokens.",
            "type": "invalid_request_error",
            "param": "messages",
            "code": "context_length_exceeded",
        }
    }
    prism_fake.script("err500", [Fault(status=400, body=body)])
    gw = await prism_gateway(catalog)
    with pytest.raises(openai.BadRequestError) as info:
        await gw.openai().chat.completions.create(model="chat-a", messages=MESSAGES)
    assert info.value.body == body["error"]
    assert info.value.response.headers["x-prism-attempts"] == "1"
    assert prism_fake.hits("ok") == 0


async def test_client_disconnect_cancels_the_upstream_stream(prism_fake, prism_gateway, recorder):
    prism_fake.script("slowstream", [Fault(token_delay_s=0.3, text=" ".join(["word"] * 40))])
    catalog = {
        "providers": {"p": {"kind": "openai", "base_url": prism_fake.base_url("slowstream")}},
        "models": {"m": {"chain": [{"provider": "p", "model": "x"}]}},
    }
    gw = await prism_gateway(catalog)
    async with aiohttp.ClientSession() as session:
        response = await session.post(
            gw.base_url + "/chat/completions",
            json={"model": "m", "messages": MESSAGES, "stream": True},
        )
        await response.content.readline()  # the first event arrived: the stream is live
        response.close()  # the caller walks away
    for _ in range(50):
        if prism_fake.dropped("slowstream") == 1:
            break
        await asyncio.sleep(0.05)
    assert prism_fake.dropped("slowstream") == 1
    for _ in range(50):
        if recorder.settled:
            break
        await asyncio.sleep(0.02)
    [(_, settlement)] = recorder.settled
    assert settlement.outcome == "aborted"
    assert settlement.served.binding.id == "p/x"


async def test_a_caller_gone_as_its_stream_starts_is_settled_aborted_not_a_failure(
    prism_fake, prism_gateway, recorder, prism_plugin, caplog
):
    class HangUp:
        """Closes the caller's connection as the serving attempt is judged: the relay
        then starts the answer on a transport already closing, before aiohttp has
        seen the connection go and cancelled the handler (the race a load test's
        last requests hit)."""

        @hookimpl
        def prism_on_attempt(self, call: Any, attempt: Any) -> None:
            transport = call.request.transport
            if transport is not None:
                transport.close()

    prism_plugin(HangUp(), "test-hang-up")
    catalog = {
        "providers": {"p": {"kind": "openai", "base_url": prism_fake.base_url("ok")}},
        "models": {"m": {"chain": [{"provider": "p", "model": "x"}]}},
    }
    gw = await prism_gateway(catalog)
    async with aiohttp.ClientSession() as session:
        with pytest.raises(aiohttp.ClientError):
            async with session.post(
                gw.base_url + "/chat/completions",
                json={"model": "m", "messages": MESSAGES, "stream": True},
            ) as response:
                await response.read()
    for _ in range(100):
        if recorder.settled:
            break
        await asyncio.sleep(0.02)
    [(_, settlement)] = recorder.settled
    assert (settlement.outcome, settlement.status) == ("aborted", 499)
    assert settlement.error_code == "client_closed"
    assert settlement.served.binding.id == "p/x"  # what was delivered is still billable
    assert not [
        r for r in caplog.records if r.name.startswith("prism") and r.levelno >= logging.ERROR
    ]


async def test_client_disconnect_during_a_stalled_upstream_cancels_it(
    prism_fake, prism_gateway, recorder
):
    prism_fake.script("stalled", [Fault(stall_s=30)])
    catalog = {
        "providers": {"p": {"kind": "openai", "base_url": prism_fake.base_url("stalled")}},
        "models": {"m": {"chain": [{"provider": "p", "model": "x"}]}},
    }
    gw = await prism_gateway(catalog)
    async with aiohttp.ClientSession() as session:
        task = asyncio.ensure_future(
            session.post(
                gw.base_url + "/chat/completions", json={"model": "m", "messages": MESSAGES}
            )
        )
        for _ in range(100):
            if prism_fake.hits("stalled"):
                break
            await asyncio.sleep(0.02)
        task.cancel()
    for _ in range(100):
        if prism_fake.dropped("stalled") and recorder.settled:
            break
        await asyncio.sleep(0.02)
    assert prism_fake.dropped("stalled") == 1
    [(call, settlement)] = recorder.settled
    assert settlement.outcome == "aborted"
    assert [a.outcome for a in call.attempts] == ["cancelled"]


async def test_settle_runs_exactly_once_per_call(
    prism_fake, prism_gateway, catalog, recorder, prism_clock
):
    gw = await prism_gateway(catalog, clock=prism_clock)
    client = gw.openai()
    await client.chat.completions.create(model="chat-a", messages=MESSAGES)
    stream = await client.chat.completions.create(model="chat-a", messages=MESSAGES, stream=True)
    async for _ in stream:
        pass
    await client.embeddings.create(model="embed-a", input="x")
    with pytest.raises(openai.NotFoundError):
        await client.chat.completions.create(model="nope", messages=MESSAGES)
    ids = [call.request_id for call, _ in recorder.settled]
    assert len(ids) == 4
    assert len(set(ids)) == 4
