"""The per-request context a wire format works with, and the wire-format shape.

A wire format (openai_wire, anthropic_wire) only turns a request plus its
Fault into bytes; the scenario lookup, recording, stalls, status overrides and
drop counting are shared and live in server.py.
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import Awaitable, Callable, Mapping, Sequence
from typing import Any

import attrs
import orjson
from aiohttp import web

from .clock import FakeClock, Timer
from .faults import Fault

__all__ = [
    "ClientGone",
    "EndpointHandler",
    "Exchange",
    "Route",
    "WireFormat",
    "json_bytes",
    "stream_answer",
]

# How often a delay looks for a vanished client when the server was not set
# up to cancel handlers on disconnect (someone else running ``fake.app``).
_DISCONNECT_POLL_S = 0.1


def json_bytes(payload: Any) -> bytes:
    """``orjson.dumps``, but also for integers beyond 64 bits."""
    try:
        return orjson.dumps(payload)
    except orjson.JSONEncodeError:
        # orjson refuses integers beyond 64 bits, and a Fault.usage meant to
        # overflow a client's counters may well hold one.
        return json.dumps(payload, separators=(",", ":"), ensure_ascii=False).encode()


class ClientGone(Exception):
    """The client closed its connection while we were still answering."""


@attrs.define(slots=True)
class Exchange:
    """One request being answered under one Fault."""

    request: web.Request
    scenario: str
    endpoint: str
    fault: Fault
    body: Any
    #: What pauses wait for (None: real time).
    clock: FakeClock | None = None

    def client_gone(self) -> bool:
        transport = self.request.transport
        return transport is None or transport.is_closing()

    async def pause(self, seconds: float) -> None:
        """Sleep, but notice a disconnecting client instead of sleeping on.

        One timer per pause, and one sweep every ``_DISCONNECT_POLL_S`` for
        all the pauses of the loop, rather than each pause waking up that
        often: 10,000 streams pausing between tokens would otherwise cost
        100,000 wake-ups a second.
        """
        if seconds <= 0:
            return
        if self.client_gone():
            raise ClientGone
        loop = asyncio.get_running_loop()
        waiter: asyncio.Future[None] = loop.create_future()
        clock = self.clock
        if clock is None:
            timer: Timer = loop.call_later(seconds, _wake, waiter)
        else:
            timer = clock.call_at(clock.now() + seconds, _wake, waiter)
        watch = _PAUSES.get(loop)
        if watch is None:
            watch = _PAUSES[loop] = _Pauses(loop)
        watch.add(waiter, self)
        try:
            await waiter
        finally:
            timer.cancel()
            watch.discard(waiter)

    def response_headers(self, base: Mapping[str, str]) -> dict[str, str]:
        """Response headers: the format's own, then the Fault's extras win."""
        if not self.fault.headers:
            return dict(base)
        merged = dict(base)
        merged.update(self.fault.headers)
        return merged

    def hang_up(self, started: web.StreamResponse | None = None) -> web.StreamResponse:
        """Drop the connection so the client sees a broken response.

        close() rather than abort(): already-written chunks are flushed first,
        so a client really receives the K chunks before the connection ends,
        but never the chunked-encoding terminator. The returned response
        cannot be sent any more; aiohttp notices the closing transport when
        it tries to finish it and gives up quietly.
        """
        transport = self.request.transport
        if transport is not None:
            transport.close()
        return started if started is not None else web.Response()


def _wake(waiter: asyncio.Future[None]) -> None:
    if not waiter.done():
        waiter.set_result(None)


class _Pauses:
    """The pauses in progress on one event loop, and the sweep that ends a gone client's."""

    def __init__(self, loop: asyncio.AbstractEventLoop) -> None:
        self.loop = loop
        self.waiting: dict[asyncio.Future[None], Exchange] = {}
        self.sweep_timer: asyncio.TimerHandle | None = None

    def add(self, waiter: asyncio.Future[None], ex: Exchange) -> None:
        self.waiting[waiter] = ex
        if self.sweep_timer is None:
            self.sweep_timer = self.loop.call_later(_DISCONNECT_POLL_S, self.sweep)

    def discard(self, waiter: asyncio.Future[None]) -> None:
        self.waiting.pop(waiter, None)
        if not self.waiting:
            # Nothing paused: forget the loop (it may be closed and gone soon).
            if self.sweep_timer is not None:
                self.sweep_timer.cancel()
                self.sweep_timer = None
            if _PAUSES.get(self.loop) is self:
                del _PAUSES[self.loop]

    def sweep(self) -> None:
        self.sweep_timer = self.loop.call_later(_DISCONNECT_POLL_S, self.sweep)
        for waiter, ex in list(self.waiting.items()):
            if ex.client_gone() and not waiter.done():
                waiter.set_exception(ClientGone())


_PAUSES: dict[asyncio.AbstractEventLoop, _Pauses] = {}


EndpointHandler = Callable[[Exchange], Awaitable[web.StreamResponse]]


@attrs.frozen
class Route:
    method: str
    endpoint: str  # the part after /v1/, e.g. "chat/completions"
    handler: EndpointHandler


@attrs.frozen
class WireFormat:
    """What a provider API contributes: its endpoints and its error shape."""

    name: str
    routes: tuple[Route, ...]
    # Default body for a non-200 status in this format's error shape:
    # (status, message or None for the status's usual one, extra headers).
    error_response: Callable[[int, str | None, Mapping[str, str]], web.Response]


async def stream_answer(
    ex: Exchange,
    headers: Mapping[str, str],
    opening: bytes,
    pieces: Sequence[bytes],
    closing: bytes,
    error_event: Callable[[Mapping[str, Any]], bytes],
) -> web.StreamResponse:
    """Stream ``opening``, one piece per token, then ``closing``, with the Fault's timing.

    Both wire formats stream alike; only their bytes differ.  Events are
    batched between delays: with no delay configured the whole body goes out
    in one write, which keeps the benchmark path cheap; with delays each event
    is flushed before the pause, so clients see the intended timing.  A
    ``die_after_chunks`` drops the connection after that many pieces; a
    ``stream_error`` ends the stream with ``error_event`` instead of closing.
    A ``bad_event`` goes out after ``bad_event_at`` pieces (or after the last
    one), unless the stream was cut before that.
    """
    fault = ex.fault
    resp = web.StreamResponse(headers=ex.response_headers(headers))
    await resp.prepare(ex.request)
    pending: list[bytes] = []

    async def flush() -> None:
        if pending:
            data = b"".join(pending)
            pending.clear()
            await resp.write(data)

    # Headers are out; nothing else is until the first token is "ready", so a
    # time-to-first-token timeout in the client sees an idle body.
    await ex.pause(fault.first_token_delay_s)
    pending.append(opening)
    cut = fault.die_after_chunks
    if cut is None and fault.stream_error is not None:
        cut = 0
    emitted = pieces if cut is None else pieces[:cut]
    bad_event = None if fault.bad_event is None else b"data: " + fault.bad_event + b"\n\n"
    # Clamped so that a test need not know how many pieces the answer has.
    bad_at = min(fault.bad_event_at, len(pieces))
    if bad_event is not None and bad_at == 0:
        pending.append(bad_event)
    for i, piece in enumerate(emitted, 1):
        if i > 1 and fault.token_delay_s:
            await flush()
            await ex.pause(fault.token_delay_s)
        pending.append(piece)
        if bad_event is not None and i == bad_at:
            pending.append(bad_event)
    if fault.stream_error is not None:
        pending.append(error_event(fault.stream_error))
        await resp.write_eof(b"".join(pending))
        return resp
    if cut is not None:
        await flush()
        return ex.hang_up(resp)
    pending.append(closing)
    if fault.end_delay_s:
        await flush()
        await ex.pause(fault.end_delay_s)
    await resp.write_eof(b"".join(pending))
    return resp
