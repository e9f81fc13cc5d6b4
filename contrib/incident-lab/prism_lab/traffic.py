"""Client traffic: real HTTP calls to the gateways, each one recorded as the caller saw it."""

from __future__ import annotations

import asyncio
import json
import random
from collections.abc import Callable, Mapping, Sequence
from typing import Any

import aiohttp
import attrs

from .scenario import Scenario, Traffic

__all__ = ["DEFAULT_ORG", "Call", "drive_traffic", "organisations"]

#: The organisation of entries that name none, when others do (authentication is then on).
DEFAULT_ORG = "lab"

_WORDS = ("alpha", "beta", "gamma", "delta", "omega", "sigma", "kappa", "theta")


@attrs.define
class Call:
    """One client call; times in scenario seconds from the run's start."""

    model: str
    stream: bool
    start_s: float
    #: Who called: the traffic entry's organisation, region and wire.
    org: str | None = None
    region: str | None = None
    wire: str = "openai"
    end_s: float = 0.0
    status: int = 0
    #: The binding that served (``provider/model`` from the response headers).
    binding: str | None = None
    #: The region of the line that served (the gateway's ``x-prism-region``).
    served_region: str | None = None
    outcome: str = ""
    first_token_s: float | None = None
    ok: bool = False
    fallback: bool = False
    degraded: bool = False
    error: str = ""
    attempt_log: str = ""


def _prompt(rng: random.Random, low: int, high: int) -> str:
    return " ".join(rng.choice(_WORDS) for _ in range(rng.randint(low, high)))


def _has_content(event: dict[str, Any], wire: str) -> bool:
    if wire == "anthropic":
        delta = event.get("delta") or {}
        return event.get("type") == "content_block_delta" and bool(delta.get("text"))
    return any((choice.get("delta") or {}).get("content") for choice in event.get("choices", []))


async def _stream_body(
    response: aiohttp.ClientResponse, call: Call, now: Callable[[], float]
) -> None:
    done = False
    async for raw in response.content:
        line = raw.strip()
        if not line.startswith(b"data:"):
            continue
        data = line[5:].strip()
        if data == b"[DONE]":
            done = True
            continue
        event = json.loads(data)
        if "error" in event:
            error = event["error"]
            call.error = str(error.get("code") or error.get("type") or "stream error")
            return
        if event.get("type") == "message_stop":
            done = True
        if call.first_token_s is None and _has_content(event, call.wire):
            call.first_token_s = now() - call.start_s
    if not done:
        end = "message_stop" if call.wire == "anthropic" else "[DONE]"
        call.error = f"stream ended without {end}"


async def one_call(
    session: aiohttp.ClientSession,
    url: str,
    call: Call,
    body: dict[str, object],
    primary: str,
    now: Callable[[], float],
    headers: Mapping[str, str] | None = None,
) -> Call:
    path = "/v1/messages" if call.wire == "anthropic" else "/v1/chat/completions"
    try:
        async with session.post(f"{url}{path}", json=body, headers=headers) as response:
            call.status = response.status
            headers = response.headers
            provider, model = headers.get("x-prism-provider"), headers.get("x-prism-model")
            call.binding = f"{provider}/{model}" if provider and model else None
            call.outcome = headers.get("x-prism-outcome", "")
            call.served_region = headers.get("x-prism-region")
            call.attempt_log = headers.get("x-prism-attempt-log", "")
            if response.status != 200:
                payload = await response.read()
                call.error = f"{response.status} {payload[:200].decode(errors='replace')}"
            elif call.stream:
                await _stream_body(response, call, now)
            else:
                await response.read()
                call.first_token_s = now() - call.start_s
    except (aiohttp.ClientError, TimeoutError, ValueError) as exc:
        call.error = f"{type(exc).__name__}: {exc}"
    call.end_s = now()
    call.degraded = call.status == 200 and call.outcome in ("degraded", "empty")
    call.ok = call.status == 200 and not call.error and not call.degraded
    call.fallback = call.ok and call.binding is not None and call.binding != primary
    return call


def _body(rng: random.Random, traffic: Traffic, model: str, stream: bool) -> dict[str, object]:
    body: dict[str, object] = {
        "model": model,
        "messages": [{"role": "user", "content": _prompt(rng, *traffic.prompt_words)}],
        "max_tokens": traffic.max_tokens,
        "stream": stream,
    }
    if stream and traffic.wire == "openai":
        body["stream_options"] = {"include_usage": True}
    return body


def _org(traffic: Traffic, keys: Mapping[str, str]) -> str | None:
    return traffic.org if traffic.org is not None else (DEFAULT_ORG if keys else None)


def _headers(traffic: Traffic, keys: Mapping[str, str]) -> dict[str, str]:
    """The caller's key (as its wire's SDK sends it) and region; none of it is logged."""
    headers: dict[str, str] = {}
    org = _org(traffic, keys)
    if org is not None:
        if traffic.wire == "anthropic":
            headers["x-api-key"] = keys[org]
        else:
            headers["authorization"] = f"Bearer {keys[org]}"
    if traffic.wire == "anthropic":
        headers["anthropic-version"] = "2023-06-01"
    if traffic.region is not None:
        headers["x-prism-regions"] = traffic.region
    return headers


def organisations(scenario: Scenario) -> list[str]:
    """The organisations the gateway needs keys for (none: run without authentication)."""
    named = {t.org for t in scenario.traffic if t.org is not None}
    if named and any(t.org is None for t in scenario.traffic):
        named.add(DEFAULT_ORG)
    return sorted(named)


async def drive_traffic(
    scenario: Scenario,
    urls: Sequence[str],
    now: Callable[[], float],
    calls: list[Call],
    keys: Mapping[str, str] | None = None,
) -> None:
    """Open-loop arrivals (Poisson, seeded) for the scenario's duration; waits for every call.

    Every (entry, model) is one stream of arrivals; a scheduled rate is drawn by
    thinning at its highest rate. Without schedules no thinning draw is made, so
    a constant-rate scenario keeps the arrivals it always had for its seed.
    """
    keys = keys or {}
    rng = random.Random(scenario.seed)
    scale = scenario.time_scale
    connector = aiohttp.TCPConnector(limit=0)
    timeout = aiohttp.ClientTimeout(total=max(30.0, 300 * scale))
    tasks: set[asyncio.Task[Call]] = set()
    streams = [(i, t, m) for i, t in enumerate(scenario.traffic) for m in t.rate]
    peaks = [traffic.rate[model] for _, traffic, model in streams]
    thinning = any(traffic.schedule for traffic in scenario.traffic)
    headers = [_headers(traffic, keys) for traffic in scenario.traffic]
    async with aiohttp.ClientSession(connector=connector, timeout=timeout) as session:
        total_rate = sum(peaks)
        t = rng.expovariate(total_rate)
        n = 0
        while t < scenario.duration_s:
            if thinning:
                rates = [traffic.rate_at(model, t) for _, traffic, model in streams]
                if rng.random() * total_rate >= sum(rates):
                    t += rng.expovariate(total_rate)
                    continue
            else:
                rates = peaks
            delay = (t - now()) * scale
            if delay > 0:
                await asyncio.sleep(delay)
            entry, traffic, model = rng.choices(streams, rates)[0]
            stream = rng.random() < traffic.stream_share
            body = _body(rng, traffic, model, stream)
            call = Call(model, stream, now(), _org(traffic, keys), traffic.region, traffic.wire)
            calls.append(call)
            task = asyncio.create_task(
                one_call(
                    session,
                    urls[n % len(urls)],
                    call,
                    body,
                    scenario.primary(model),
                    now,
                    headers[entry],
                )
            )
            tasks.add(task)
            task.add_done_callback(tasks.discard)
            n += 1
            t += rng.expovariate(total_rate)
        if tasks:
            await asyncio.wait(set(tasks))
