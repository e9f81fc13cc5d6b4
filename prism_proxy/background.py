"""A task that runs while something is in use: started on entry, cancelled on exit."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator, Callable, Coroutine
from typing import Any

__all__ = ["background"]


@contextlib.asynccontextmanager
async def background(
    work: Callable[[], Coroutine[Any, Any, None]], name: str
) -> AsyncIterator[asyncio.Task[None]]:
    """Run ``work()`` as a task named ``name`` for the body of the ``async with``.

    For the loops plugins keep in a ``lifecycle()`` or a generation's
    ``cleanup_ctx`` (a poll, a refresh, a lease renewal): the task is
    cancelled and awaited on the way out, whatever the body raised.
    """
    task = asyncio.create_task(work(), name=name)
    try:
        yield task
    finally:
        task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await task
