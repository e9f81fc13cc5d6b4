"""prism-breaker's state on Redis: records, overrides and audit, and the fleet's evidence.

Keys, under ``<prefix>:breaker:``:

- ``bindings`` (hash): binding id -> its record (JSON), written only by a
  transition made on top of the stored revision (:data:`~.scripts.RECORD`);
- ``overrides`` (hash): override id -> override (JSON), while active;
- ``audit`` (list, newest first, ``audit_max`` rows) and ``audit_id``;
- ``version`` (counter, bumped by every write) and ``born`` (set once state
  exists: its absence after an outage means Redis lost everything);
- ``window:<binding>:<epoch>``, ``latency:<binding>``, ``trial_ok:<binding>``:
  the fleet's evidence (:data:`~.scripts.EXCHANGE`);
- ``trial:<binding>`` and ``trial:<binding>:next``: trial slot leases.

Every write also publishes on ``<prefix>:events`` so the other gateways read
at once instead of at their next poll.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

import attrs
import orjson

from prism_proxy import (
    AuditEntry,
    BindingRecord,
    BindingReport,
    Fleet,
    FleetView,
    Override,
    StoredTransition,
)

from .connection import SharedRedis
from .scripts import ADD_OVERRIDE, END_OVERRIDE, EXCHANGE, RECORD, REPUBLISH

__all__ = ["AUDIT_MAX", "RedisBreakerStore"]

#: Audit rows kept in Redis (the oldest go first); export them if you need more.
AUDIT_MAX = 100_000
#: Audit rows read per round trip while filtering by subject.
_AUDIT_PAGE = 1000


def _json(value: Any) -> str:
    return orjson.dumps(attrs.asdict(value) if attrs.has(type(value)) else value).decode()


class RedisBreakerStore:
    """A :class:`prism_proxy.BreakerStore` on Redis that is also its own ``fleet``."""

    def __init__(self, shared: SharedRedis) -> None:
        self.shared = shared
        self.fleet: Fleet | None = self
        self.interval_s = shared.settings.sync_s
        self.description = f"redis {shared.settings.where}"
        base = f"{shared.prefix}:breaker:"
        self.base = base
        self.k_bindings = base + "bindings"
        self.k_overrides = base + "overrides"
        self.k_audit = base + "audit"
        self.k_audit_id = base + "audit_id"
        self.k_version = base + "version"
        self.k_born = base + "born"
        self._version: str | None = None
        self._opened = False

    @property
    def healthy(self) -> bool:
        return self.shared.healthy

    def _client(self) -> Any:
        return self.shared.connect()

    # -- lifecycle (the gateway's link is opened by SharedRedis; the CLI's here) --

    async def open(self) -> None:
        if self.shared.client is None:
            self.shared.connect()
            self._opened = True

    async def close(self) -> None:
        if self._opened:
            self._opened = False
            await self.shared.disconnect()

    # -- BreakerStore ------------------------------------------------------------

    async def load_bindings(self) -> list[BindingRecord]:
        with self.shared.guard("breaker_read"):
            rows = await self._client().hgetall(self.k_bindings)
        return [BindingRecord(**orjson.loads(raw)) for raw in rows.values()]

    async def record_transitions(
        self, transitions: Sequence[StoredTransition]
    ) -> Sequence[BindingRecord]:
        if not transitions:
            return ()
        args: list[Any] = [self.shared.channel, AUDIT_MAX]
        for t in transitions:
            args += [
                t.record.binding,
                t.record.revision,
                t.audit.from_state or "",
                _json(t.record),
                _json(t.audit),
            ]
        with self.shared.guard("breaker_write"):
            beaten = await self._client().eval(RECORD, 5, *self._write_keys(self.k_bindings), *args)
        return [BindingRecord(**orjson.loads(raw)) for raw in beaten or ()]

    async def active_overrides(self) -> list[Override]:
        with self.shared.guard("breaker_read"):
            rows = await self._client().hgetall(self.k_overrides)
        return sorted(
            (Override(**orjson.loads(raw)) for raw in rows.values()), key=lambda o: o.created_at
        )

    async def add_override(self, override: Override, audit: AuditEntry) -> None:
        args = [self.shared.channel, AUDIT_MAX, override.id, _json(override), _json(audit)]
        with self.shared.guard("breaker_write"):
            await self._client().eval(ADD_OVERRIDE, 5, *self._write_keys(self.k_overrides), *args)

    async def end_override(self, override_id: str, audit: AuditEntry) -> Override | None:
        args = [self.shared.channel, AUDIT_MAX, override_id, _json(audit)]
        with self.shared.guard("breaker_write"):
            raw = await self._client().eval(
                END_OVERRIDE, 5, *self._write_keys(self.k_overrides), *args
            )
        return None if raw is None else Override(**orjson.loads(raw))

    async def audit(
        self, *, subjects: Sequence[str] | None = None, limit: int = 100
    ) -> list[AuditEntry]:
        wanted = None if subjects is None else set(subjects)
        out: list[AuditEntry] = []
        start = 0
        while len(out) < limit and start < AUDIT_MAX:
            with self.shared.guard("breaker_read"):
                rows = await self._client().lrange(self.k_audit, start, start + _AUDIT_PAGE - 1)
            if not rows:
                break
            for row in rows:
                entry_id, _, body = row.partition("|")
                entry = AuditEntry(**{**orjson.loads(body), "id": int(entry_id)})
                if wanted is None or entry.subject in wanted:
                    out.append(entry)
                    if len(out) == limit:
                        break
            start += _AUDIT_PAGE
        return out

    async def changed(self) -> bool:
        with self.shared.guard("breaker_poll"):
            version = await self._client().get(self.k_version)
        before, self._version = self._version, version
        return before is not None and version != before

    def _write_keys(self, target: str) -> list[str]:
        return [target, self.k_audit, self.k_audit_id, self.k_version, self.k_born]

    # -- Fleet -------------------------------------------------------------------

    async def exchange(
        self,
        reports: Sequence[BindingReport],
        *,
        now: float,
        window_s: float,
        latency_window_s: float,
    ) -> list[FleetView]:
        if not reports:
            return []
        wall = now
        with self.shared.guard("breaker_exchange"):
            async with self._client().pipeline(transaction=False) as pipe:
                for report in reports:
                    keys, args = self._exchange_args(report, wall, window_s, latency_window_s)
                    pipe.eval(EXCHANGE, len(keys), *keys, *args)
                replies = await pipe.execute()
        return [
            _view(report.binding, reply) for report, reply in zip(reports, replies, strict=True)
        ]

    def _exchange_args(
        self, report: BindingReport, wall: float, window_s: float, latency_window_s: float
    ) -> tuple[list[str], list[Any]]:
        b = report.binding
        keys = [
            f"{self.base}window:{b}:{report.epoch}",
            f"{self.base}latency:{b}",
            f"{self.base}trial_ok:{b}",
        ]
        args: list[Any] = [
            self.shared.me,
            int(wall),
            window_s,
            latency_window_s,
            "" if report.trial_revision is None else report.trial_revision,
            report.trial_successes,
            len(report.latency),
        ]
        for kind, (samples, median) in report.latency.items():
            args += [kind, samples, repr(round(median, 3))]
        for second, calls, failures in report.window:
            args += [second, calls, failures]
        return keys, args

    async def take_trial(
        self, binding: str, token: int, *, max_in_flight: int, lease_s: float, spacing_s: float
    ) -> bool:
        return await self.shared.take_lease(
            "trial_lease",
            f"{self.base}trial:{binding}",
            self._member(token),
            limit=max_in_flight,
            lease_s=lease_s,
            spacing_s=spacing_s,
        )

    def end_trial(self, binding: str, token: int) -> None:
        self.shared.release("trial_release", f"{self.base}trial:{binding}", self._member(token))

    def _member(self, token: int) -> str:
        return f"{self.shared.me}:{token}"

    async def republish(
        self, records: Sequence[BindingRecord], overrides: Sequence[Override]
    ) -> None:
        args: list[Any] = [self.shared.channel, len(records)]
        for r in records:
            args += [r.binding, _json(r)]
        for o in overrides:
            args += [o.id, _json(o)]
        keys = [self.k_bindings, self.k_overrides, self.k_version, self.k_born]
        with self.shared.guard("breaker_write"):
            await self._client().eval(REPUBLISH, len(keys), *keys, *args)

    def watch(self, changed: Callable[[], None], back: Callable[[], None]) -> None:
        self.shared.watch(changed, back)


def _view(binding: str, reply: list[Any]) -> FleetView:
    latency: dict[str, list[tuple[int, float]]] = {}
    for i in range(3, len(reply), 3):
        latency.setdefault(str(reply[i]), []).append((int(reply[i + 1]), float(reply[i + 2])))
    return FleetView(
        binding=binding,
        calls=int(reply[0]),
        failures=int(reply[1]),
        latency=latency,
        trial_successes=int(reply[2]),
    )
