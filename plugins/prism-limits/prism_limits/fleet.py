"""The fleet's counters in Redis: every limit of a call checked and reserved in one script.

The scripts do what :class:`prism_limits.counting.LocalCounters` does, on
keys every gateway shares, with Redis's clock: a call's limits cost one round
trip at admission whatever their number, and one (not awaited by the caller)
at settlement.  Amounts travel as integer strings and are written with
``HINCRBY``, so money stays exact (Lua compares them as doubles, exact below
2^53 nano-units: nine million currency units, above the largest budget).

Keys, under the shared prefix: ``limits:<counter>`` (a window's per-second
amounts, the in-flight leases, or a budget's ``spent``, ``reserved`` and one
``r:<call>`` field per reservation), ``limits:<counter>:leases`` (when each
budget reservation expires), ``limits:budget-counters`` (the budget counters
rebuilt from the ledger, scored by when they expire: what a rebase drops) and
``limits:gateways`` (who admitted lately), and, per budget counter,
``:recent`` (the costs settled lately, by request id) and ``:counted`` (the
recent calls the ledger read that rebuilt it already counted).

A budget's ``spent`` is rebuilt from the ledger (the truth) whenever the
fleet does not hold it.  A *rebase* drops every ``spent`` so that each is
rebuilt on its next use: at each gateway's start (a gateway that stopped
may have settled calls the ledger has and Redis never got), when Redis
answers again after an outage (what was settled meanwhile is in the ledger,
not in Redis), and on demand (``prism limits rebase``).  Reservations of
calls in flight are kept: they are given back at settlement as always.

A rebuild under traffic is exact: a call settling while the ledger is read
may be in the read's total or not yet (its row commits a moment later).  So
each settlement remembers its cost by request id for ``RECENT_S`` seconds,
the ledger read names the recent calls it counted (one snapshot), and the
rebuilt counter is the read's total plus the remembered costs of the calls
it did not count; a settlement arriving after a rebuild that counted it adds
nothing.
"""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import logging
from collections.abc import (
    AsyncIterator,
    Awaitable,
    Callable,
    Collection,
    Iterator,
    Mapping,
    Sequence,
)
from typing import Any

import attrs

from prism_proxy import SharedState

from .counting import RECENT_S, Ask, Decision, Held, LocalCounters
from .limits import Kind
from .scripts import ADMIT, LOOK, REBASE, REBUILT, RENEW, SETTLE

__all__ = ["SEEN_MS", "WATCH_S", "FleetCounters", "Standing"]

log = logging.getLogger("prism.limits")

#: A gateway that admitted nothing for this long no longer counts in the fleet.
SEEN_MS = 30_000
#: How often a gateway looks whether shared state went away or came back (a flag in
#: memory: cheap), so that it rebases soon after Redis answers again.
WATCH_S = 0.1
#: Admissions whose answer was lost, given back when Redis answers again: at most this many.
_UNSURE_MAX = 10_000


_KIND_CODES = {Kind.WINDOW: "w", Kind.PARALLEL: "p", Kind.BUDGET: "b"}
#: The per-call scripts by their SHA-1, as EVALSHA names them.
_DIGESTS: Mapping[str, str] = {
    script: hashlib.sha1(script.encode()).hexdigest() for script in (ADMIT, SETTLE)
}
#: A budget counter outlives its period by a day (a late settlement still finds it).
_GRACE_S = 86_400
_RECENT_MS = RECENT_S * 1000


@attrs.frozen
class Standing:
    """What one limit's counter holds now in the fleet's counters."""

    #: Requests or tokens in the last 60 seconds, calls in flight, or a budget's
    #: settled spend (None: a budget counter the fleet does not hold: the ledger has it).
    used: int | None
    #: A budget's reservations by calls in flight (nano-units), not in ``used``.
    reserved: int = 0
    #: A window's seconds until its oldest amount leaves it (None: nothing in it).
    frees_in_s: float | None = None


class FleetCounters:
    """The counters every gateway sharing ``link`` (Redis) counts in.

    ``local`` is this process's own engine, which the limiter counts in while
    Redis does not answer: its budget counters are forgotten once Redis
    answers again (they would miss what the fleet spends until the next
    outage), after the calls it admitted meanwhile have settled.
    """

    def __init__(
        self, link: SharedState, lease_s: float, local: LocalCounters | None = None
    ) -> None:
        self.link = link
        self.lease_s = lease_s
        self.local = local
        self.base = f"{link.prefix}:limits:"
        #: This gateway's calls holding leases, by call: renewed while they run.
        self.held: dict[str, Held] = {}
        #: Shared state went away since the last rebase: rebase when it answers again.
        self.lost = False
        #: Times this gateway rebased because shared state answered again (tests, logs).
        self.returns = 0
        #: Admissions sent as Redis stopped answering: they may have landed though their
        #: answer was lost, holding a slot and a reservation for nobody; given back on return.
        self.unsure: list[Held] = []
        #: Calls admitted locally during the outage were still in flight at the return:
        #: rebase again once they settled (their cost reaches the ledger, not Redis).
        self.settling = False
        self._background: set[asyncio.Task[None]] = set()
        #: Settlements of this turn of the event loop, written together (settle_soon).
        self._pending: list[
            tuple[Held, int, int, Sequence[str], Callable[[list[int]], None] | None]
        ] = []

    @property
    def lease_s(self) -> float:
        return self._lease_s

    @lease_s.setter
    def lease_s(self, value: float) -> None:
        # Each generation sets it: a reload may change it for the counters it keeps.
        self._lease_s = value
        self.lease_ms = int(value * 1000)

    async def lifecycle(self) -> AsyncIterator[None]:
        await self._rebase_at_start()
        renewal = asyncio.ensure_future(self._renew_forever())
        watch = asyncio.ensure_future(self._watch_forever())
        try:
            yield
        finally:
            for task in (renewal, watch):
                task.cancel()
                with contextlib.suppress(asyncio.CancelledError):
                    await task
            await self.settled()

    def spawn(self, work: Awaitable[None]) -> None:
        """Run ``work`` (a settlement nobody waits for) until it ends, shutdown included."""
        task = asyncio.ensure_future(work)
        self._background.add(task)
        task.add_done_callback(self._background.discard)

    async def settled(self) -> None:
        """Wait for the settlements written so far (tests, shutdown)."""
        while self._background:
            await asyncio.gather(*self._background, return_exceptions=True)

    def usable(self) -> bool:
        """Does shared state answer?  A False answer is remembered: rebase on its return."""
        if self.link.healthy:
            return True
        self.lost = True
        return False

    # -- outages -------------------------------------------------------------

    @contextlib.contextmanager
    def _guard(self, kind: str) -> Iterator[None]:
        """The link's guard; a round trip that found Redis away marks an outage."""
        try:
            with self.link.guard(kind):
                yield
        except BaseException:
            if not self.link.healthy:
                self.lost = True
            raise

    async def _rebase_at_start(self) -> None:
        # A gateway of the fleet that stopped may have settled calls whose cost reached
        # the ledger and never Redis: whoever starts rebuilds every budget from the ledger.
        try:
            dropped = await self.rebase()
        except Exception as exc:
            self.lost = True  # not now: as soon as Redis answers
            log.info("limits: no rebase at start, shared state did not answer (%s)", _name(exc))
            return
        log.info(
            "limits: rebased at start: %d budget counters in shared state are rebuilt from "
            "the ledger on their next use",
            dropped,
        )

    async def _watch_forever(self) -> None:
        while True:
            await asyncio.sleep(WATCH_S)
            try:
                await self.watch()
            except Exception:  # never the end of the watch: the next look tries again
                log.exception("limits: looking at shared state failed")

    async def watch(self) -> None:
        """One look at the link: rebase once shared state answers again after an outage."""
        if not self.usable():
            return
        if self.lost:
            await self._returned()
        elif self.settling and not _reserving(self.local):
            # The calls admitted locally during the outage have settled; the ledger has
            # their cost, which the rebase at the return could not see yet.
            self.settling = False
            if await self._rebase_after_outage("the calls admitted during the outage settled"):
                self._forget_local()

    async def _returned(self) -> None:
        self.lost = False
        unsure, self.unsure = self.unsure, []
        try:
            for held in unsure:
                # No window amount to correct (second 0 is never a window's field): this
                # gives back a slot and a reservation that may have landed for nobody.
                await self.settle(held, 0, 0, ())
        except Exception as exc:
            if self.lost:  # gone again: all of them at its next return
                self.unsure = unsure + self.unsure
                return
            # Redis answers but refused: their leases run out by themselves.
            log.debug("limits: could not give back unsure admissions (%s)", _name(exc))
        pending = _reserving(self.local)
        if not await self._rebase_after_outage("shared state answers again"):
            return
        self.returns += 1
        if pending:
            self.settling = True
        else:
            self._forget_local()

    async def _rebase_after_outage(self, why: str) -> bool:
        try:
            dropped = await self.rebase()
        except Exception as exc:
            if self.link.healthy:
                # Redis answers but refused the script: retrying every tick would not help.
                log.warning("limits: rebase after an outage failed (%s)", _name(exc))
            return False
        log.warning(
            "limits: %s: %d budget counters in shared state are rebuilt from the ledger on "
            "their next use (what was settled during the outage is in the ledger, not in Redis)",
            why,
            dropped,
        )
        return True

    def _forget_local(self) -> None:
        if self.local is not None:
            self.local.forget_budgets()

    # -- the counters --------------------------------------------------------

    async def _renew_forever(self) -> None:
        while True:
            await asyncio.sleep(self.lease_s / 3)
            if self.held and self.link.healthy:
                try:
                    await self.renew(list(self.held.values()))
                except Exception as exc:
                    log.debug("limits: renewal failed (%s)", _name(exc))

    def key(self, counter: str) -> str:
        return self.base + counter

    async def admit(self, asks: Sequence[Ask], member: str) -> tuple[Decision, int]:
        """The decision, and the second (Redis's clock) the window amounts went in."""
        keys: list[str] = []
        packed: list[str] = []
        for ask in asks:
            key = self.key(ask.counter)
            keys += (key, key + ":leases")
            limit = ask.limit
            packed.append(
                f"{_KIND_CODES[limit.kind]} {ask.effective} {ask.amount} "
                f"{int(limit.soft)} {ask.reset_at or 0}"
            )
        keys.append(self.base + "gateways")
        args = (member, self.lease_ms, self.link.me, len(asks), SEEN_MS, " ".join(packed))
        try:
            with self._guard("limits_admit"):
                answer: list[Any] = await self._script(ADMIT, keys, args)
        except Exception:
            if not self.link.healthy and len(self.unsure) < _UNSURE_MAX:
                self.unsure.append(Held(list(asks), member, 0, self))
            raise
        status, gateways = int(answer[0]), int(answer[1])
        if status == 2:
            missing = tuple(asks[int(index) - 1].counter for index in answer[2])
            return Decision((), missing=missing, gateways=gateways), 0
        raw = answer[2]
        readings = tuple(
            (int(raw[i]), _seconds(int(raw[i + 1])), False) for i in range(0, len(raw), 2)
        )
        if status == 1:
            return Decision(readings, refused=int(answer[3]) - 1, gateways=gateways), 0
        return Decision(readings, gateways=gateways), int(answer[3])

    async def _script(self, script: str, keys: Sequence[str], args: Sequence[str | int]) -> Any:
        """Run ``script`` by its digest (Redis keeps it compiled; the text is sent only
        when Redis does not know it yet: after a restart or SCRIPT FLUSH)."""
        client = self.link.connect()
        digest = _DIGESTS[script]
        try:
            return await client.evalsha(digest, len(keys), *keys, *args)
        except Exception as exc:
            # redis-py's NoScriptError, named rather than imported: the engine's client
            # is the shared-state provider's business.
            if type(exc).__name__ != "NoScriptError":
                raise
            return await client.eval(script, len(keys), *keys, *args)

    async def rebuilt(
        self, counter: str, spent: int, counted: Collection[str], reset_at: int | None
    ) -> None:
        """Set a budget counter from a ledger read (``spent``, which counts the calls
        ``counted`` among the recent ones), unless another gateway did first."""
        key = self.key(counter)
        keys = [key, self.base + "budget-counters", key + ":recent", key + ":counted"]
        expire = 0 if reset_at is None else reset_at + _GRACE_S
        args = (spent, expire, _RECENT_MS, " ".join(counted))
        with self._guard("limits_rebuild"):
            await self.link.connect().eval(REBUILT, len(keys), *keys, *args)

    def _settle_command(
        self, held: Held, tokens: int, cost: int, spend_counters: Sequence[str]
    ) -> tuple[list[str], tuple[str | int, ...]]:
        keys: list[str] = []
        packed: list[str] = []
        base = self.base
        for ask in held.asks:
            key = base + ask.counter
            keys += (key, key + ":leases")
            code = _KIND_CODES[ask.limit.kind]
            if code == "w":
                code = "t" if ask.limit.metric == "tpm" else "r"
            packed.append(f"{code} {ask.amount}")
        for counter in spend_counters:
            key = base + counter
            keys += (key, key + ":recent", key + ":counted")
        args = (
            held.member,
            held.second,
            tokens,
            cost,
            len(held.asks),
            _RECENT_MS,
            " ".join(packed),
        )
        return keys, args

    async def settle(
        self, held: Held, tokens: int, cost: int, spend_counters: Sequence[str]
    ) -> list[int]:
        keys, args = self._settle_command(held, tokens, cost, spend_counters)
        with self._guard("limits_settle"):
            spent: list[Any] = await self._script(SETTLE, keys, args)
        return [int(value) for value in spent]

    def settle_soon(
        self,
        held: Held,
        tokens: int,
        cost: int,
        spend_counters: Sequence[str],
        done: Callable[[list[int]], None] | None = None,
    ) -> None:
        """Settle ``held`` in the background, in one pipeline with the other settlements
        of this turn of the event loop (one round trip for them all, no task each);
        ``done`` gets each budget's spend after."""
        pending = self._pending
        pending.append((held, tokens, cost, spend_counters, done))
        if len(pending) == 1:
            self.spawn(self._write_pending())

    async def _write_pending(self) -> None:
        batch, self._pending = self._pending, []
        if not batch:
            return
        commands = [self._settle_command(*entry[:4]) for entry in batch]
        digest = _DIGESTS[SETTLE]
        try:
            with self._guard("limits_settle"):
                client = self.link.connect()
                if len(commands) == 1:
                    keys, args = commands[0]
                    answers: list[Any] = [await self._script(SETTLE, keys, args)]
                else:
                    pipe = client.pipeline(transaction=False)
                    for keys, args in commands:
                        pipe.evalsha(digest, len(keys), *keys, *args)
                    answers = await pipe.execute(raise_on_error=False)
                    for index, answer in enumerate(answers):
                        # Redis forgot the script (restarted, SCRIPT FLUSH): sent in full.
                        if type(answer).__name__ == "NoScriptError":
                            keys, args = commands[index]
                            answers[index] = await self._script(SETTLE, keys, args)
        except Exception as exc:
            # Their reservations run out with their leases; the ledger has their cost,
            # and the counters are rebuilt from it.
            log.warning(
                "limits: could not settle %d calls in shared state (%s)", len(batch), _name(exc)
            )
            return
        for (held, _, _, _, done), answer in zip(batch, answers, strict=True):
            if isinstance(answer, BaseException):
                log.warning(
                    "limits: could not settle %s in shared state (%s)", held.member, _name(answer)
                )
            elif done is not None:
                done([int(value) for value in answer])

    async def renew(self, held: Sequence[Held]) -> None:
        """Keep the leases of calls still in flight (a dead gateway's run out)."""
        keys: list[str] = []
        members: list[str] = []
        for call in held:
            for ask in call.asks:
                kind = ask.limit.kind
                if kind is Kind.PARALLEL:
                    keys.append(self.key(ask.counter))
                elif kind is Kind.BUDGET:
                    keys.append(self.key(ask.counter) + ":leases")
                else:
                    continue
                members.append(call.member)
        if keys:
            with self._guard("limits_renew"):
                await self.link.connect().eval(RENEW, len(keys), *keys, self.lease_ms, *members)

    async def rebase(self) -> int:
        """Drop every budget counter's spend: each is rebuilt from the ledger on its next
        use.  Returns how many were dropped."""
        with self._guard("limits_rebase"):
            count: int = await self.link.connect().eval(REBASE, 1, self.base + "budget-counters")
        return int(count)

    async def standing(self, asks: Sequence[Ask]) -> tuple[list[Standing], int]:
        """What each limit's counter holds now, and how many gateways admitted lately
        (one read-only round trip)."""
        keys: list[str] = []
        args: list[str | int] = [len(asks), SEEN_MS]
        for ask in asks:
            key = self.key(ask.counter)
            keys += (key, key + ":leases")
            args.append(_KIND_CODES[ask.limit.kind])
        keys.append(self.base + "gateways")
        with self._guard("limits_read"):
            raw: list[Any] = await self.link.connect().eval(LOOK, len(keys), *keys, *args)
        second, gateways = int(raw[0]), int(raw[1])
        found: list[Standing] = []
        for index, ask in enumerate(asks):
            used, extra = int(raw[2 + 2 * index]), int(raw[3 + 2 * index])
            kind = ask.limit.kind
            if kind is Kind.WINDOW:
                frees = None if extra < 0 else float(max(extra + 60 - second, 0))
                found.append(Standing(used, frees_in_s=frees))
            elif kind is Kind.PARALLEL:
                found.append(Standing(used))
            else:
                found.append(Standing(None if used < 0 else used, reserved=extra))
        return found, gateways

    async def readings(self, asks: Sequence[Ask]) -> list[int | None]:
        """What each limit holds now (None: a budget nobody counted yet)."""
        standings, _ = await self.standing(asks)
        return [None if found.used is None else found.used + found.reserved for found in standings]


def _reserving(local: LocalCounters | None) -> bool:
    return local is not None and local.reserving()


def _name(exc: BaseException) -> str:
    return type(exc).__name__


def _seconds(ms: int) -> float:
    return float("inf") if ms < 0 else max(ms, 0) / 1000
