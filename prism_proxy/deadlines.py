"""Attempt deadlines: one loop timer for all the deadlines due in the same tenth of a second.

``asyncio.timeout`` arms a loop timer when its block starts and cancels it
when the block ends.  On uvloop that is a libuv handle made, started,
stopped and closed, plus the context manager's two coroutines: several
microseconds per attempt, when almost every attempt ends long before its
deadline.  Here the deadlines that fall due in the same slice of
:data:`RESOLUTION_S` share one timer, armed once for the slice and left to
fire: a deadline is kept up to that much late, never early.

The time and the timers are the generation's :class:`~prism_proxy.clock.Clock`
(a test's manual clock expires them when it is advanced).
"""

from __future__ import annotations

import asyncio
import math
from types import TracebackType
from typing import Any

from .clock import Clock, LoopClock

__all__ = ["RESOLUTION_S", "Deadline", "Deadlines"]

#: How late a deadline may be kept; deadlines due within one such slice share a timer.
RESOLUTION_S = 0.1


class Deadline:
    """A block's deadline: a context manager that ends the block as ``asyncio.timeout`` does.

    When the deadline passes, the task running the block is cancelled and
    the block ends with TimeoutError; any other cancellation (the caller
    gone, a shutdown) goes through unchanged.
    """

    __slots__ = ("_members", "_task", "expired")

    def __init__(self, task: asyncio.Task[Any], members: set[Deadline]) -> None:
        self._task = task
        self._members = members
        #: The deadline passed while the block ran.
        self.expired = False

    def __enter__(self) -> Deadline:
        self._members.add(self)
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        traceback: TracebackType | None,
    ) -> None:
        self._members.discard(self)
        # As asyncio.timeout: our own cancellation, and no other pending, becomes a timeout.
        if self.expired and self._task.uncancel() == 0 and exc_type is asyncio.CancelledError:
            raise TimeoutError from exc

    def _expire(self) -> None:
        self.expired = True
        self._task.cancel()


class Deadlines:
    """Deadlines for the blocks of many tasks, sharing one timer per slice of time."""

    __slots__ = ("_clock", "_now", "_slices")

    def __init__(self, clock: Clock | None = None) -> None:
        self._clock = clock if clock is not None else LoopClock()
        self._now = self._clock.now
        #: The blocks running with a deadline in each slice (``deadline / RESOLUTION_S``,
        #: rounded up).  A slice's set stays until its timer fires, so that each
        #: slice is armed once however often it empties and fills again.
        self._slices: dict[int, set[Deadline]] = {}

    def within(self, seconds: float) -> Deadline:
        """A deadline ``seconds`` from now for a block of the current task (``with``)."""
        task = asyncio.current_task()
        if task is None:
            raise RuntimeError("a deadline is kept by cancelling a task: call it from one")
        due = math.ceil((self._now() + seconds) / RESOLUTION_S)
        members = self._slices.get(due)
        if members is None:
            members = self._slices[due] = set()
            self._clock.call_at(due * RESOLUTION_S, self._expire, due)
        return Deadline(task, members)

    def _expire(self, due: int) -> None:
        for deadline in self._slices.pop(due, ()):
            deadline._expire()

    @property
    def pending(self) -> int:
        """Blocks running with a deadline not yet passed."""
        return sum(map(len, self._slices.values()))
