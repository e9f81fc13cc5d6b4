"""The gateway's clock: the time, pauses and timers, one object a test can replace.

Attempt deadlines, the chain's budget, the pause between retries and the
stream watchdog all read the generation's :class:`Clock` rather than the
event loop's, so a test that injects a :class:`ManualClock` moves every one
of them at once, without waiting: a 30 s stall is one ``advance(30)``.

The real clock is :class:`LoopClock`: ``time.monotonic`` (the time the
asyncio loop keeps, and uvloop's, to the millisecond), ``asyncio.sleep`` and
the running loop's timers; its ``now`` and ``sleep`` are those functions
themselves, so reading the time on the hot path costs what it cost before
there was a clock to inject.
"""

from __future__ import annotations

import asyncio
import heapq
import itertools
import time
from collections.abc import Awaitable, Callable
from typing import Protocol, TypeVarTuple, runtime_checkable

__all__ = ["Clock", "LoopClock", "ManualClock", "Timer", "split_clock"]

Ts = TypeVarTuple("Ts")


class Timer(Protocol):
    """A callback armed with :meth:`Clock.call_at`, until it runs or is cancelled."""

    def cancel(self) -> None: ...


@runtime_checkable
class Clock(Protocol):
    """Monotonic time in seconds, a pause, and timers on that time.

    ``call_at(when, callback, *args)`` runs ``callback(*args)`` once
    ``now()`` has reached ``when`` (never before; a callback due already
    runs soon, as ``loop.call_at`` does).  Callbacks run on the event loop,
    without an awaiting caller: one that raises is the loop's to report.
    """

    def now(self) -> float: ...

    def sleep(self, seconds: float, /) -> Awaitable[None]: ...

    def call_at(
        self, when: float, callback: Callable[[*Ts], object], /, *args: *Ts
    ) -> Timer: ...


class LoopClock:
    """The real clock: ``time.monotonic``, ``asyncio.sleep`` and the running loop's timers."""

    __slots__ = ()

    # The builtins themselves, not methods wrapping them: ``clock.now`` is what
    # every call stamps its times with.
    now = staticmethod(time.monotonic)
    sleep = staticmethod(asyncio.sleep)

    def call_at(
        self, when: float, callback: Callable[[*Ts], object], *args: *Ts
    ) -> asyncio.TimerHandle:
        # loop.time() is time.monotonic() on asyncio's loops and on uvloop's.
        return asyncio.get_running_loop().call_at(when, callback, *args)

    def __repr__(self) -> str:
        return "LoopClock()"


class ManualTimer:
    """A :class:`ManualClock`'s timer."""

    __slots__ = ("args", "callback", "cancelled", "when")

    def __init__(self, when: float, callback: Callable[..., object], args: tuple[object, ...]):
        self.when = when
        self.callback = callback
        self.args = args
        self.cancelled = False

    def cancel(self) -> None:
        self.cancelled = True

    def _run(self) -> None:
        if not self.cancelled:
            self.cancelled = True  # runs once
            self.callback(*self.args)


class ManualClock:
    """Virtual time for tests: it moves only when the test (or a pause) moves it.

    :meth:`advance` moves it, running each timer due on the way at its own
    time, in order.  :meth:`sleep` passes at once: it advances the clock by
    its length (the pause between retries takes no real time) and is
    recorded in :attr:`slept`.  Give the same clock to the gateway
    (``prism_gateway(..., clock=clock)``) and to the fake upstream
    (``fake.clock = clock``), and a stall, a slow token or a deadline
    happens when the test says, however loaded the machine is.  Timers run
    inside :meth:`advance`, so one that raises fails the test that moved
    the clock instead of going to the loop's exception handler.
    """

    def __init__(self, start: float = 1000.0) -> None:
        self._now = start
        self._timers: list[tuple[float, int, ManualTimer]] = []
        self._order = itertools.count()
        #: The length of every pause taken, in order.
        self.slept: list[float] = []

    def now(self) -> float:
        return self._now

    def call_at(
        self, when: float, callback: Callable[[*Ts], object], *args: *Ts
    ) -> ManualTimer:
        timer = ManualTimer(when, callback, args)
        if when <= self._now:
            asyncio.get_running_loop().call_soon(timer._run)  # as loop.call_at does
        else:
            heapq.heappush(self._timers, (when, next(self._order), timer))
        return timer

    async def sleep(self, seconds: float) -> None:
        self.slept.append(seconds)
        self.advance(max(0.0, seconds))
        await asyncio.sleep(0)  # a pause yields, as asyncio.sleep(0) does

    def advance(self, seconds: float) -> None:
        """Move the time on by ``seconds``, running the timers due meanwhile at their time."""
        if seconds < 0:
            raise ValueError(f"time only moves forward (advance({seconds}))")
        until = self._now + seconds
        timers = self._timers
        while timers and timers[0][0] <= until:
            when, _, timer = heapq.heappop(timers)
            if timer.cancelled:
                continue
            self._now = max(self._now, when)
            timer._run()
        self._now = until

    @property
    def pending(self) -> list[float]:
        """When each timer not yet run nor cancelled is due, soonest first."""
        return sorted(when for when, _, timer in self._timers if not timer.cancelled)


def split_clock(
    clock: Clock | Callable[[], float] | None,
    sleep: Callable[[float], Awaitable[None]] | None = None,
) -> tuple[Clock, Callable[[], float], Callable[[float], Awaitable[None]]]:
    """The timers, the time calls are stamped with, and the pause between retries.

    A :class:`Clock` gives all three (an explicit ``sleep`` still replaces
    its pauses: a test recording them).  A bare callable is the older way
    to inject the time: it stamps calls and budgets, while deadlines and the
    stream watchdog keep to the real loop (their timers could not follow it).
    """
    if isinstance(clock, Clock):
        return clock, clock.now, sleep if sleep is not None else clock.sleep
    real = LoopClock()
    now = clock if clock is not None else real.now
    return real, now, sleep if sleep is not None else real.sleep
