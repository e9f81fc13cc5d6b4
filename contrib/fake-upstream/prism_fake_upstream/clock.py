"""The clock a test may give the fake, so that its pauses keep the test's time."""

from __future__ import annotations

from collections.abc import Callable
from typing import Protocol, TypeVarTuple

__all__ = ["FakeClock", "Timer"]

Ts = TypeVarTuple("Ts")


class Timer(Protocol):
    """What ``call_at`` returns (an asyncio ``TimerHandle`` is one)."""

    def cancel(self) -> None: ...


class FakeClock(Protocol):
    """Time in seconds and timers on it: what the fake's pauses wait for.

    Prism's ``ManualClock`` is one: given to the gateway and to the fake, a
    stall, a slow token or a late body end takes no real time, and happens
    when the test advances the clock.
    """

    def now(self) -> float: ...

    def call_at(
        self, when: float, callback: Callable[[*Ts], object], /, *args: *Ts
    ) -> Timer: ...
