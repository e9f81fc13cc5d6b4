"""Shared pieces for the breaker's tests: an injected clock, a small HTTP kit, and
what the unit tests of its parts build a breaker from (a catalog, calls, a store)."""

from __future__ import annotations

import asyncio
import types
from collections.abc import Awaitable, Callable, Sequence
from typing import Any

import aiohttp
import attrs
import pytest
from prism_breaker import Breaker, Settings, SqliteStore

from prism_proxy import (
    Attempt,
    AuditEntry,
    BindingRecord,
    BindingReport,
    Call,
    Endpoint,
    Fleet,
    FleetView,
    Outcome,
    Override,
    Route,
    StoredTransition,
    Verdict,
)
from prism_proxy.catalog import Catalog, load_catalog

MESSAGES = [{"role": "user", "content": "hello"}]
ADMIN_TOKEN = "breaker-admin-token"


class FakeTime:
    """The gateway's injected clock; retry pauses advance it instead of sleeping."""

    def __init__(self) -> None:
        self.now = 1000.0

    def clock(self) -> float:
        return self.now

    async def sleep(self, seconds: float) -> None:
        self.now += seconds

    def advance(self, seconds: float) -> None:
        self.now += seconds


@attrs.frozen
class Answer:
    status: int
    headers: dict[str, str]
    body: Any

    @property
    def log(self) -> list[str]:
        raw = self.headers.get("x-prism-attempt-log", "")
        return raw.split("; ") if raw else []

    @property
    def steps(self) -> list[str]:
        """The attempt log without the elapsed milliseconds, which vary from run to run."""
        return [e.rsplit(" ", 1)[0] if e.endswith("ms") else e for e in self.log]

    @property
    def provider(self) -> str | None:
        return self.headers.get("x-prism-provider")


@attrs.define
class Kit:
    """Talks to a gateway under test the way a caller and an operator would."""

    fake: Any

    def catalog(self, *names: str, **model: Any) -> dict[str, Any]:
        return {
            "providers": {n: {"kind": "openai", "base_url": self.fake.base_url(n)} for n in names},
            "models": {
                "m": {"chain": [{"provider": n, "model": f"up-{n}"} for n in names], **model}
            },
        }

    async def chat(self, gw: Any, model: str = "m", **body: Any) -> Answer:
        payload = {"model": model, "messages": MESSAGES, **body}
        async with aiohttp.ClientSession() as session:
            async with session.post(gw.base_url + "/chat/completions", json=payload) as response:
                raw = await response.read()
                data: Any = raw
                if response.content_type == "application/json":
                    data = await response.json()
                return Answer(response.status, dict(response.headers), data)

    async def health(self, gw: Any, token: str | None = None) -> dict[str, Any]:
        headers = {"Authorization": f"Bearer {token}"} if token else {}
        async with aiohttp.ClientSession() as session:
            async with session.get(gw.url + "/prism/health", headers=headers) as response:
                assert response.status == 200
                result: dict[str, Any] = await response.json()
                return result

    async def binding(self, gw: Any, binding_id: str) -> dict[str, Any]:
        for entry in (await self.health(gw))["bindings"]:
            if entry["binding"] == binding_id:
                return entry
        raise AssertionError(f"{binding_id} not in /prism/health")

    async def admin(
        self, gw: Any, method: str, path: str, json: Any = None, token: str | None = ADMIN_TOKEN
    ) -> tuple[int, Any]:
        headers = {"Authorization": f"Bearer {token}"} if token else {}
        async with aiohttp.ClientSession() as session:
            async with session.request(
                method, gw.url + path, json=json, headers=headers
            ) as response:
                return response.status, await response.json()

    async def eventually(self, check: Callable[[], Awaitable[bool]], timeout: float = 5.0) -> None:
        """Wait (bounded) for something the background writer or refresher does."""
        async with asyncio.timeout(timeout):
            while not await check():
                await asyncio.sleep(0.02)


@pytest.fixture
def fake_time() -> FakeTime:
    return FakeTime()


@pytest.fixture
def kit(prism_fake: Any) -> Kit:
    return Kit(prism_fake)


@pytest.fixture
def admin_env(monkeypatch: pytest.MonkeyPatch) -> dict[str, str]:
    monkeypatch.setenv("BREAKER_TEST_ADMIN", ADMIN_TOKEN)
    return {"admin_token_env": "BREAKER_TEST_ADMIN"}


# -- unit tests of the breaker's parts: no server, the clock driven by hand ------------


def unit_catalog(*names: str) -> Catalog:
    """One model ``m`` whose chain is ``<name>/up-<name>`` for each name, in order."""
    return load_catalog(
        None,
        data={
            "providers": {
                n: {"kind": "openai", "base_url": f"http://127.0.0.1:9/{n}"} for n in names
            },
            "models": {"m": {"chain": [{"provider": n, "model": f"up-{n}"} for n in names]}},
        },
        kinds=["openai"],
    )


def unit_breaker(
    fake_time: FakeTime,
    *names: str,
    store: Any = None,
    random: Callable[[], float] = lambda: 0.0,
    **settings: Any,
) -> Breaker:
    """A breaker over ``unit_catalog(*names)`` on the injected clock (store: SQLite in memory)."""
    return Breaker(
        Settings(**settings),
        unit_catalog(*names),
        fake_time.clock,
        store if store is not None else SqliteStore(":memory:"),
        random=random,
    )


def unit_call(traffic: str = "customer") -> Call:
    # The breaker reads neither the request nor the generation beyond its number.
    return Call(
        request_id="req_x",
        endpoint=Endpoint.CHAT,
        received_at=0.0,
        request=None,
        generation=types.SimpleNamespace(number=1),
        traffic=traffic,
    )


def route_of(breaker: Breaker) -> Route:
    return Route(bindings=tuple(breaker.catalog.models["m"].chain))


def attempt(
    breaker: Breaker, call: Call, binding_id: str, outcome: Outcome, status: int | None = None
) -> Attempt:
    """One attempt of ``call`` on ``binding_id``, started and classified as ``outcome``."""
    admission = breaker.admission
    a = call.new_attempt(breaker.catalog.bindings[binding_id], breaker.clock())
    admission.attempt_start(call, a)
    a.status = status
    a.verdict = Verdict(outcome, f"upstream {status}" if status else "")
    admission.on_attempt(call, a)
    return a


def isolate(breaker: Breaker, binding_id: str) -> None:
    """A permanent failure: isolated at once, for ``isolation_s``."""
    attempt(breaker, unit_call(), binding_id, Outcome.PERMANENT, 401)


@attrs.define
class RecordingFleet:
    """A :class:`prism_proxy.Fleet` that records what it is told and answers ``views``."""

    views: dict[str, FleetView] = attrs.field(factory=dict)
    reports: list[list[BindingReport]] = attrs.field(factory=list)
    republished: list[tuple[list[BindingRecord], list[Override]]] = attrs.field(factory=list)
    fail: bool = False
    healthy: bool = True
    interval_s: float = 3600.0
    callbacks: tuple[Callable[[], None], Callable[[], None]] | None = None
    republished_event: asyncio.Event = attrs.field(factory=asyncio.Event)

    async def exchange(
        self,
        reports: Sequence[BindingReport],
        *,
        now: float,
        window_s: float,
        latency_window_s: float,
    ) -> list[FleetView]:
        if self.fail:
            raise ConnectionError("the shared engine is away")
        self.reports.append(list(reports))
        return [self.views.get(r.binding, FleetView(r.binding)) for r in reports]

    async def take_trial(
        self, binding: str, token: int, *, max_in_flight: int, lease_s: float, spacing_s: float
    ) -> bool:
        return True

    def end_trial(self, binding: str, token: int) -> None:
        pass

    async def republish(
        self, records: Sequence[BindingRecord], overrides: Sequence[Override]
    ) -> None:
        self.republished.append((list(records), list(overrides)))
        self.republished_event.set()

    def watch(self, changed: Callable[[], None], back: Callable[[], None]) -> None:
        self.callbacks = (changed, back)


@attrs.define
class RecordingStore:
    """A :class:`prism_proxy.BreakerStore` in memory that records every write.

    ``fail_writes`` makes that many writes fail; ``beaten`` is what the next
    write answers (records another gateway wrote first).
    """

    fleet: Fleet | None = None
    description: str = "recording store"
    records: list[BindingRecord] = attrs.field(factory=list)
    written: list[StoredTransition] = attrs.field(factory=list)
    overrides: dict[str, Override] = attrs.field(factory=dict)
    audit_rows: list[AuditEntry] = attrs.field(factory=list)
    beaten: list[BindingRecord] = attrs.field(factory=list)
    fail_writes: int = 0
    others_wrote: bool = False

    async def open(self) -> None:
        pass

    async def close(self) -> None:
        pass

    async def load_bindings(self) -> list[BindingRecord]:
        return list(self.records)

    async def record_transitions(
        self, transitions: Sequence[StoredTransition]
    ) -> Sequence[BindingRecord]:
        if self.fail_writes:
            self.fail_writes -= 1
            raise OSError("disk full")
        self.written.extend(transitions)
        beaten, self.beaten = self.beaten, []
        return beaten

    async def active_overrides(self) -> list[Override]:
        return list(self.overrides.values())

    async def add_override(self, override: Override, audit: AuditEntry) -> None:
        self.overrides[override.id] = override
        self.audit_rows.append(audit)

    async def end_override(self, override_id: str, audit: AuditEntry) -> Override | None:
        self.audit_rows.append(audit)
        return self.overrides.pop(override_id, None)

    async def audit(
        self, *, subjects: Sequence[str] | None = None, limit: int = 100
    ) -> list[AuditEntry]:
        return self.audit_rows[::-1][:limit]

    async def changed(self) -> bool:
        changed, self.others_wrote = self.others_wrote, False
        return changed
