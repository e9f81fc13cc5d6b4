"""Attempt deadlines: shared timers, kept as asyncio.timeout keeps them (up to a slice late)."""

from __future__ import annotations

import asyncio
import time

import pytest

from prism_proxy.clock import ManualClock
from prism_proxy.deadlines import RESOLUTION_S, Deadlines


async def test_a_block_past_its_deadline_ends_with_timeout_error_never_early():
    deadlines = Deadlines()
    started = time.monotonic()
    with pytest.raises(TimeoutError):
        with deadlines.within(0.05) as deadline:
            await asyncio.sleep(10)
    elapsed = time.monotonic() - started
    assert deadline.expired
    assert 0.05 <= elapsed < 0.05 + RESOLUTION_S + 1.0
    assert deadlines.pending == 0


async def test_blocks_due_in_one_slice_all_expire_and_blocks_that_ended_are_left_alone():
    clock = ManualClock()
    deadlines = Deadlines(clock)
    later = asyncio.Event()

    async def block(blocked: bool) -> str:
        try:
            with deadlines.within(0.05):
                if blocked:
                    await asyncio.Event().wait()
        except TimeoutError:
            return "timed out"
        # Past the deadline, outside the block: nothing may cancel the task now.
        await later.wait()
        return "done"

    blocks = [asyncio.create_task(block(blocked)) for blocked in [True] * 50 + [False]]
    await asyncio.sleep(0)  # every block entered; the last one left at once
    assert deadlines.pending == 50
    assert clock.pending == [pytest.approx(clock.now() + RESOLUTION_S)]  # one timer for all
    clock.advance(0.05)
    assert deadlines.pending == 50  # due, but kept up to the end of its slice: never early
    clock.advance(RESOLUTION_S)
    assert deadlines.pending == 0
    later.set()
    assert await asyncio.gather(*blocks) == ["timed out"] * 50 + ["done"]


async def test_another_cancellation_goes_through_unchanged():
    deadlines = Deadlines()
    entered = asyncio.Event()

    async def block() -> None:
        with deadlines.within(5):
            entered.set()
            await asyncio.sleep(10)

    task = asyncio.create_task(block())
    await entered.wait()
    task.cancel()  # the caller went away: not a timeout
    with pytest.raises(asyncio.CancelledError):
        await task
    assert deadlines.pending == 0


async def test_a_timeout_error_of_the_block_itself_is_not_taken_for_the_deadline():
    deadlines = Deadlines()
    with pytest.raises(TimeoutError, match="connect"):
        with deadlines.within(5) as deadline:
            raise TimeoutError("connect")
    assert not deadline.expired
    assert asyncio.current_task().cancelling() == 0
