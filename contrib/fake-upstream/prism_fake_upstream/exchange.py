"""The per-request context a wire format works with, and the wire-format shape.

A wire format (openai_wire, anthropic_wire) only turns a request plus its
Fault into bytes; the scenario lookup, recording, stalls, status overrides and
drop counting are shared and live in server.py.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable, Mapping
from typing import Any

import attrs
from aiohttp import web

from .faults import Fault

__all__ = ["ClientGone", "EndpointHandler", "Exchange", "Route", "WireFormat"]

# How often a delay looks for a vanished client when the server was not set
# up to cancel handlers on disconnect (someone else running ``fake.app``).
_DISCONNECT_POLL_S = 0.1


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

    def client_gone(self) -> bool:
        transport = self.request.transport
        return transport is None or transport.is_closing()

    async def pause(self, seconds: float) -> None:
        """Sleep, but notice a disconnecting client instead of sleeping on."""
        if seconds <= 0:
            return
        loop = asyncio.get_running_loop()
        deadline = loop.time() + seconds
        while True:
            if self.client_gone():
                raise ClientGone
            remaining = deadline - loop.time()
            if remaining <= 0:
                return
            await asyncio.sleep(min(remaining, _DISCONNECT_POLL_S))

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
