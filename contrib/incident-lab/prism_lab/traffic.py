"""Client traffic: real HTTP calls to the gateways, each one recorded as the caller saw it."""

from __future__ import annotations

import asyncio
import json
import random
from collections.abc import Callable, Sequence

import aiohttp
import attrs

from .scenario import Scenario

__all__ = ["Call", "drive_traffic"]

_WORDS = ("alpha", "beta", "gamma", "delta", "omega", "sigma", "kappa", "theta")


@attrs.define
class Call:
    """One client call; times in scenario seconds from the run's start."""

    model: str
    stream: bool
    start_s: float
    end_s: float = 0.0
    status: int = 0
    #: The binding that served (``provider/model`` from the response headers).
    binding: str | None = None
    outcome: str = ""
    first_token_s: float | None = None
    ok: bool = False
    fallback: bool = False
    degraded: bool = False
    error: str = ""
    attempt_log: str = ""


def _prompt(rng: random.Random, low: int, high: int) -> str:
    return " ".join(rng.choice(_WORDS) for _ in range(rng.randint(low, high)))


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
            call.error = str(event["error"].get("code") or "stream error")
            return
        if call.first_token_s is None and any(
            (choice.get("delta") or {}).get("content") for choice in event.get("choices", [])
        ):
            call.first_token_s = now() - call.start_s
    if not done:
        call.error = "stream ended without [DONE]"


async def one_call(
    session: aiohttp.ClientSession,
    url: str,
    call: Call,
    body: dict[str, object],
    primary: str,
    now: Callable[[], float],
) -> Call:
    try:
        async with session.post(f"{url}/v1/chat/completions", json=body) as response:
            call.status = response.status
            headers = response.headers
            provider, model = headers.get("x-prism-provider"), headers.get("x-prism-model")
            call.binding = f"{provider}/{model}" if provider and model else None
            call.outcome = headers.get("x-prism-outcome", "")
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


async def drive_traffic(
    scenario: Scenario,
    urls: Sequence[str],
    now: Callable[[], float],
    calls: list[Call],
) -> None:
    """Open-loop arrivals (Poisson, seeded) for the scenario's duration; waits for every call."""
    traffic = scenario.traffic
    rng = random.Random(scenario.seed)
    scale = scenario.time_scale
    connector = aiohttp.TCPConnector(limit=0)
    timeout = aiohttp.ClientTimeout(total=max(30.0, 300 * scale))
    tasks: set[asyncio.Task[Call]] = set()
    async with aiohttp.ClientSession(connector=connector, timeout=timeout) as session:
        total_rate = sum(traffic.rate.values())
        models = list(traffic.rate)
        weights = [traffic.rate[m] for m in models]
        t = rng.expovariate(total_rate)
        n = 0
        while t < scenario.duration_s:
            delay = (t - now()) * scale
            if delay > 0:
                await asyncio.sleep(delay)
            model = rng.choices(models, weights)[0]
            stream = rng.random() < traffic.stream_share
            body: dict[str, object] = {
                "model": model,
                "messages": [{"role": "user", "content": _prompt(rng, *traffic.prompt_words)}],
                "max_tokens": traffic.max_tokens,
                "stream": stream,
            }
            if stream:
                body["stream_options"] = {"include_usage": True}
            call = Call(model=model, stream=stream, start_s=now())
            calls.append(call)
            task = asyncio.create_task(
                one_call(session, urls[n % len(urls)], call, body, scenario.primary(model), now)
            )
            tasks.add(task)
            task.add_done_callback(tasks.discard)
            n += 1
            t += rng.expovariate(total_rate)
        if tasks:
            await asyncio.wait(set(tasks))
