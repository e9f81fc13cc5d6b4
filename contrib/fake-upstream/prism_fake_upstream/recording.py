"""Per-scenario bookkeeping: scripts, recorded requests and counters."""

from __future__ import annotations

import contextlib
from collections import deque
from collections.abc import Iterable, Mapping
from typing import Any

import attrs
from aiohttp import web

from .clock import FakeClock
from .conditions import Condition, Gate
from .faults import Fault, fault_for_scenario_name

__all__ = ["MAX_RECORDED", "REGISTRY_KEY", "Recorded", "Registry", "ScenarioLog"]

# Bounds memory in long benchmarks; counters stay exact regardless.
MAX_RECORDED = 10_000


@attrs.frozen
class Recorded:
    """One request as the fake received it."""

    scenario: str
    method: str
    path: str
    headers: Mapping[str, str]
    body: Any
    received_at: float
    #: The client's (host, port): requests sharing it came over one pooled connection.
    peer: tuple[str, int] | None = None


@attrs.define
class ScenarioLog:
    """Everything the fake remembers about one scenario."""

    script: deque[Fault] = attrs.field(factory=deque)
    #: The latest requests, as many as the registry keeps (the counters count them all).
    records: deque[Recorded] = attrs.field(factory=lambda: deque(maxlen=MAX_RECORDED))
    hits_by_endpoint: dict[str, int] = attrs.field(factory=dict)
    hits: int = 0
    dropped: int = 0

    def record(self, rec: Recorded) -> None:
        self.hits += 1
        self.hits_by_endpoint[rec.path] = self.hits_by_endpoint.get(rec.path, 0) + 1
        self.records.append(rec)

    def hits_for(self, endpoint_suffix: str | None) -> int:
        if endpoint_suffix is None:
            return self.hits
        return sum(n for ep, n in self.hits_by_endpoint.items() if ep.endswith(endpoint_suffix))


@attrs.define
class Registry:
    """All scenarios served by one fake; lives on the app so handlers can reach it."""

    logs: dict[str, ScenarioLog] = attrs.field(factory=dict)
    #: Requests kept per scenario for inspection. A benchmark keeps none: every
    #: kept request is objects the collector walks, and a fake pausing for its
    #: collector stalls every call in flight through the proxy under test.
    max_recorded: int = MAX_RECORDED
    #: The time pauses wait for and requests are stamped with (None: real time).
    clock: FakeClock | None = None
    # Scenario names are parsed once; they never change meaning.
    _name_faults: dict[str, Fault] = attrs.field(factory=dict, alias="_name_faults")
    #: Standing conditions (conditions.py): each request the script leaves gets a draw.
    conditions: dict[str, Condition] = attrs.field(factory=dict)
    #: Per scenario, who is being answered and who waits (a condition's max_concurrency).
    gates: dict[str, Gate] = attrs.field(factory=dict)

    def log(self, scenario: str) -> ScenarioLog:
        log = self.logs.get(scenario)
        if log is None:
            log = self.logs[scenario] = ScenarioLog(records=deque(maxlen=self.max_recorded))
        return log

    def peek(self, scenario: str) -> ScenarioLog | None:
        return self.logs.get(scenario)

    def set_script(self, scenario: str, faults: Iterable[Fault]) -> None:
        self.log(scenario).script = deque(faults)

    def next_fault(self, scenario: str, log: ScenarioLog) -> Fault:
        if log.script:
            return log.script.popleft()
        if (condition := self.conditions.get(scenario)) is not None:
            return condition.draw()
        fault = self._name_faults.get(scenario)
        if fault is None:
            fault = self._name_faults[scenario] = fault_for_scenario_name(scenario)
        return fault

    def turn(self, scenario: str) -> contextlib.AbstractAsyncContextManager[None]:
        """A turn to answer under the scenario's condition's ``max_concurrency``, if any."""
        condition = self.conditions.get(scenario)
        limit = None if condition is None else condition.max_concurrency
        gate = self.gates.get(scenario)
        if gate is None:
            if limit is None:
                # Never limited: nothing to count (most fakes, and every benchmark's).
                return contextlib.nullcontext()
            gate = self.gates[scenario] = Gate()
        return gate.hold(limit)

    def reset(self) -> None:
        # Replace rather than clear: requests still in flight keep their old
        # log, so nothing they do after the reset leaks into the fresh counts.
        self.logs = {}
        self.conditions.clear()
        self.gates = {}


REGISTRY_KEY = web.AppKey("prism_fake_upstream.registry", Registry)
