"""Plays generated scenarios through real gateways and records what each binding showed.

One fake upstream serves every scenario in turn (its conditions are reset
between them); each scenario gets its own ``prism serve`` (the breaker as it
ships, so every binding starts with no history). Once per scenario second the
recorder reads the gateway's ``/prism/health`` and keeps, per binding, the
raw signals the breaker's predictor computes its features from.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any

import aiohttp
import attrs
from prism_breaker.predictor import Signals, signals_from_health

from .gatewayconf import write_gateway_config
from .procs import Processes, free_port
from .runner import Weather
from .scenario import Scenario
from .traffic import Call, drive_traffic

__all__ = ["Recording", "record", "record_many", "recording_from_json", "recording_json"]


@attrs.define
class Recording:
    """One scenario as the gateway saw it: per binding, the signals and state each second."""

    template: str
    scenario: Scenario
    #: binding → [(signals, state)], one per scenario second (times in scenario seconds).
    bindings: dict[str, list[tuple[Signals, str]]]
    calls: list[Call]


async def _poll(
    gateway: str,
    session: aiohttp.ClientSession,
    now: Callable[[], float],
    scenario: Scenario,
    out: dict[str, list[tuple[Signals, str]]],
) -> None:
    second = 0
    while True:
        # On the second, not every second after the last read: reads take time too.
        wait = (second - now()) * scenario.time_scale
        if wait > 0:
            await asyncio.sleep(wait)
        t = now()
        with contextlib.suppress(aiohttp.ClientError, ValueError):
            async with session.get(f"{gateway}/prism/health") as response:
                if response.status == 200:
                    for entry in (await response.json()).get("bindings", []):
                        out.setdefault(entry["binding"], []).append(
                            (signals_from_health(entry, t), entry["state"])
                        )
        second = max(second + 1, int(now()) + 1)


async def record(
    template: str, scenario: Scenario, fake: str, directory: Path, control: aiohttp.ClientSession
) -> Recording:
    """Run one scenario (its first variant) against the running fake ``fake``."""
    variant = scenario.variants[0]
    processes = Processes(directory / "logs")
    calls: list[Call] = []
    bindings: dict[str, list[tuple[Signals, str]]] = {}
    try:
        port = free_port()
        ini = write_gateway_config(
            scenario, variant, directory, fake_url=fake, port=port, replica=0, redis_url=None
        )
        # Many gateways start one after another on a shared machine: be patient with each.
        url = await processes.gateway("gateway0", ini, port, timeout_s=90.0)
        loop = asyncio.get_running_loop()
        weather = Weather(scenario, fake, control)
        await weather.step(0.0)
        start = loop.time()

        def now() -> float:
            return (loop.time() - start) / scenario.time_scale

        background = [
            asyncio.create_task(weather.follow(now)),
            asyncio.create_task(_poll(url, control, now, scenario, bindings)),
        ]
        try:
            await drive_traffic(scenario, [url], now, calls)
        finally:
            for task in background:
                task.cancel()
            results = await asyncio.gather(*background, return_exceptions=True)
        for result in results:
            if isinstance(result, BaseException) and not isinstance(result, asyncio.CancelledError):
                raise result
        await weather.finish()
    finally:
        await processes.close()
    return Recording(template, scenario, bindings, calls)


async def record_many(
    scenarios: Sequence[tuple[str, Scenario]],
    directory: Path,
    progress: Callable[[str], None] = lambda _: None,
) -> list[Recording]:
    """Record every scenario in turn, one fake upstream for all of them."""
    fake_processes = Processes(directory / "logs")
    recordings = []
    try:
        fake = await fake_processes.fake_upstream()
        async with aiohttp.ClientSession() as control:
            for i, (template, scenario) in enumerate(scenarios):
                recording = await record(template, scenario, fake, directory / f"s{i:03d}", control)
                recordings.append(recording)
                progress(f"{i + 1}/{len(scenarios)} {scenario.name}")
    finally:
        await fake_processes.close()
    return recordings


def recording_from_json(data: Mapping[str, Any], template: str, scenario: Scenario) -> Recording:
    """A recording read back, for the scenario it was made from (regenerated from its seed)."""
    faults = json.loads(json.dumps([attrs.asdict(f) for f in scenario.faults]))
    if (
        data.get("scenario") != scenario.name
        or data.get("template") != template
        or data.get("faults") != faults
    ):
        raise ValueError(
            f"recorded {data.get('scenario')!r} is not the regenerated {scenario.name!r} "
            "(other options, or another version of the generator)"
        )
    bindings = {
        binding: [(Signals(**signals), state) for signals, state in rows]
        for binding, rows in data["bindings"].items()
    }
    return Recording(template, scenario, bindings, [])


def recording_json(recording: Recording) -> dict[str, Any]:
    """What a recording keeps on disk (``DIR/recordings.json``), for a re-training later."""
    return {
        "template": recording.template,
        "scenario": recording.scenario.name,
        "faults": [attrs.asdict(f) for f in recording.scenario.faults],
        "bindings": {
            binding: [[attrs.asdict(signals), state] for signals, state in rows]
            for binding, rows in recording.bindings.items()
        },
    }
