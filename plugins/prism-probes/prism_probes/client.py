"""One call to a gateway's model API, timed and read as a caller would."""

from __future__ import annotations

import time
from typing import Any

import aiohttp
import orjson

from .fixtures import Answer

__all__ = ["call_gateway"]

_PATHS = {"chat": "/v1/chat/completions", "embeddings": "/v1/embeddings"}


async def call_gateway(
    session: aiohttp.ClientSession,
    base_url: str,
    headers: dict[str, str],
    endpoint: str,
    model: str,
    body: dict[str, Any],
    *,
    stream: bool,
    timeout_s: float,
) -> Answer:
    payload = {**body, "model": model}
    if stream:
        payload["stream"] = True
    else:
        payload.pop("stream_options", None)
    started = time.perf_counter()
    answer = Answer(status=0)
    try:
        async with session.post(
            base_url.rstrip("/") + _PATHS[endpoint],
            json=payload,
            headers=headers,
            timeout=aiohttp.ClientTimeout(total=timeout_s),
        ) as response:
            answer.status = response.status
            if response.status != 200:
                answer.error = _error(await response.read()) or f"HTTP {response.status}"
            elif stream:
                await _read_stream(response, answer, started)
            else:
                _read_whole(orjson.loads(await response.read()), answer)
                answer.ttft_ms = (time.perf_counter() - started) * 1000
    except (aiohttp.ClientError, TimeoutError, orjson.JSONDecodeError) as exc:
        answer.error = f"{type(exc).__name__}: {exc}"[:200]
    answer.total_ms = (time.perf_counter() - started) * 1000
    return answer


def _error(raw: bytes) -> str | None:
    try:
        error = orjson.loads(raw).get("error") or {}
    except (orjson.JSONDecodeError, AttributeError):
        return None
    code = error.get("code") or error.get("type")
    return str(code) if code else None


async def _read_stream(response: aiohttp.ClientResponse, answer: Answer, started: float) -> None:
    calls: dict[int, dict[str, Any]] = {}
    async for raw in response.content:
        line = raw.strip()
        if not line.startswith(b"data:"):
            continue
        data = line[5:].strip()
        if data == b"[DONE]":
            break
        chunk = orjson.loads(data)
        if chunk.get("usage"):
            answer.usage = chunk["usage"]
        for choice in chunk.get("choices") or ():
            delta = choice.get("delta") or {}
            if delta.get("content"):
                if answer.ttft_ms is None:
                    answer.ttft_ms = (time.perf_counter() - started) * 1000
                answer.text += delta["content"]
            for call in delta.get("tool_calls") or ():
                if answer.ttft_ms is None:
                    answer.ttft_ms = (time.perf_counter() - started) * 1000
                entry = calls.setdefault(call.get("index", 0), {"function": {"arguments": ""}})
                function = call.get("function") or {}
                if function.get("name"):
                    entry["function"]["name"] = function["name"]
                entry["function"]["arguments"] += function.get("arguments") or ""
            if choice.get("finish_reason"):
                answer.finish_reason = choice["finish_reason"]
    answer.tool_calls = [calls[i] for i in sorted(calls)]


def _read_whole(body: Any, answer: Answer) -> None:
    if isinstance(body.get("data"), list):  # embeddings
        first = body["data"][0] if body["data"] else {}
        answer.embedding = first.get("embedding") if isinstance(first, dict) else None
        answer.usage = body.get("usage")
        return
    choice = (body.get("choices") or [{}])[0]
    message = choice.get("message") or {}
    answer.text = message.get("content") or ""
    answer.tool_calls = list(message.get("tool_calls") or ())
    answer.finish_reason = choice.get("finish_reason")
    answer.usage = body.get("usage")
