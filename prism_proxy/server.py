"""Running the gateway: listening, draining on SIGTERM, and the event loop choice."""

from __future__ import annotations

import asyncio
import contextlib
import gc
import logging
import os
import signal
import socket
import sys
from collections.abc import Awaitable, Callable, Coroutine, Iterable
from typing import Any

import attrs
from aiohttp import web

from .aiohttp_internals import require as require_aiohttp_internals
from .config import DEFAULT_BACKLOG, Config
from .connections import ConnectionGuard, GuardedSite, default_limit
from .errors import ConfigError
from .gateway import GATEWAY, Gateway

__all__ = [
    "LISTEN_SOCKETS",
    "CannotListen",
    "Listening",
    "bind",
    "close_sockets",
    "listen",
    "listen_options",
    "run",
    "serve",
]

log = logging.getLogger("prism")
#: How long after the grace aiohttp's own shutdown wait gives up (see listen()).
_BACKSTOP_S = 1.0

#: The young generation's collection threshold while serving (CPython's default
#: is 700).  A call allocates a few hundred short-lived objects; at the default,
#: the collector ran every ~20 streamed calls, and each run cost ~150 µs.
GC_YOUNG_THRESHOLD = 10_000
#: As asyncio's and aiohttp's own listeners: rebind at once after a restart (POSIX only;
#: on Linux it never lets two listeners share a port).
REUSE_ADDRESS = os.name == "posix" and sys.platform != "cygwin"
#: Linux's TCP_DEFER_ACCEPT (None elsewhere), and how long the kernel holds a
#: connection that has sent nothing before handing it over all the same.
DEFER_ACCEPT: int | None = getattr(socket, "TCP_DEFER_ACCEPT", None)
DEFER_ACCEPT_S = 1


class CannotListen(OSError):
    """``host:port`` cannot be bound: in use, not an address of this machine, not permitted.

    ``str()`` is the whole sentence, e.g.
    ``cannot listen on 127.0.0.1:8400: address already in use``.
    """

    def __init__(self, host: str, port: int, reason: str, errno: int | None = None) -> None:
        super().__init__(f"cannot listen on {_host_port(host, port)}: {reason}")
        self.host = host
        self.port = port
        self.reason = reason
        self.errno = errno

    @classmethod
    def from_error(cls, host: str, port: int, exc: OSError) -> CannotListen:
        reason = exc.strerror or str(exc) or type(exc).__name__
        return cls(host, port, reason[:1].lower() + reason[1:], exc.errno)


def _host_port(host: str, port: int) -> str:
    return f"[{host}]:{port}" if ":" in host else f"{host}:{port}"


#: Sockets bound before the app was built (``prism serve`` binds first, so a busy
#: port stops it before any plugin's set-up); :func:`listen` serves on them.
LISTEN_SOCKETS = web.AppKey("prism_listen_sockets", list[socket.socket])


def bind(host: str, port: int, *, backlog: int = DEFAULT_BACKLOG) -> list[socket.socket]:
    """Listening sockets on every address ``host`` resolves to (0 picks a free port).

    Raises :class:`CannotListen` (and leaves nothing open) when one cannot be bound.
    """
    try:
        infos = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM, flags=socket.AI_PASSIVE)
    except OSError as exc:  # socket.gaierror: a host name that does not resolve
        raise CannotListen.from_error(host, port, exc) from None
    sockets: list[socket.socket] = []
    seen: set[tuple[int, Any]] = set()
    try:
        for family, type_, proto, _, address in infos:
            if (family, address) in seen:
                continue
            seen.add((family, address))
            sock = socket.socket(family, type_, proto)
            sockets.append(sock)
            if REUSE_ADDRESS:
                sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            if family == socket.AF_INET6:
                # As asyncio does: "::" is IPv6 only; "0.0.0.0" is a listen line of its own.
                sock.setsockopt(socket.IPPROTO_IPV6, socket.IPV6_V6ONLY, 1)
            if port == 0 and len(sockets) > 1:
                # One free port for every address of the host, not one each.
                address = (address[0], sockets[0].getsockname()[1], *address[2:])
            sock.bind(address)
            sock.listen(backlog)
            if DEFER_ACCEPT is not None:
                # A connection reaches the gateway with its first bytes (a caller's
                # request head): at the connection cap, a caller is told from a
                # slow head at once (see connections.ConnectionGuard.make_room),
                # and one that sends nothing waits its first second in the kernel.
                sock.setsockopt(socket.IPPROTO_TCP, DEFER_ACCEPT, DEFER_ACCEPT_S)
            sock.setblocking(False)
    except OSError as exc:
        close_sockets(sockets)
        raise CannotListen.from_error(host, port, exc) from None
    except BaseException:
        close_sockets(sockets)
        raise
    return sockets


def close_sockets(sockets: Iterable[socket.socket]) -> None:
    """Close what :func:`bind` opened (closing a socket a server already closed is harmless)."""
    for sock in sockets:
        sock.close()


@attrs.define(eq=False)
class Listening:
    """An app accepting connections; ``stop()`` drains in-flight calls, then cancels the rest."""

    runner: web.AppRunner
    host: str
    port: int
    #: How long calls in flight have to finish once ``stop()`` begins.
    grace_s: float

    @property
    def url(self) -> str:
        host = f"[{self.host}]" if ":" in self.host else self.host
        return f"http://{host}:{self.port}"

    async def stop(self) -> None:
        """Drain: the gateway is marked draining, the listener closes, calls in flight
        have ``grace_s`` to finish, the rest are cancelled, then the app cleans up.

        The mark comes first, so nothing the gateway sends itself from here on
        (probes) meets its own closed port.  aiohttp alone waits the grace, asks
        the calls left to stop, then waits as long again: a stuck stream held a
        worker twice its grace, past the point where its supervisor kills it.
        """
        gateway = self.runner.app.get(GATEWAY)
        if gateway is not None:
            gateway.start_draining()
        cut_off = asyncio.get_running_loop().call_later(self.grace_s, self._cut_off)
        try:
            await self.runner.cleanup()
        finally:
            cut_off.cancel()

    def _cut_off(self) -> None:
        """Close the connections still busy at the grace: their handlers are cancelled
        at once (handler cancellation is on) and their calls settle as aborted."""
        server = self.runner.server
        busy = server.connections if server is not None else []
        if busy:
            log.warning(
                "draining: the grace (%.0f s) is over; busy connections closed: %d",
                self.grace_s,
                len(busy),
            )
        for handler in busy:
            handler.force_close()


async def listen(
    app: web.Application,
    host: str,
    port: int,
    *,
    grace_s: float,
    header_timeout_s: float = 10.0,
    keepalive_timeout_s: float = 75.0,
    max_connections: int | None = None,
    backlog: int = DEFAULT_BACKLOG,
    counters: dict[str, int] | None = None,
) -> Listening:
    """Start ``app`` on ``host:port`` (0 picks a free port).

    The port is bound before the app's start-up contexts run: a busy port
    raises :class:`CannotListen` before any plugin started anything.  An app
    carrying :data:`LISTEN_SOCKETS` is served on those sockets instead (and
    ``host`` only names it).  Handler cancellation is on: a caller that disconnects cancels its
    handler, which closes the upstream connection at once.  On stop, the
    listener closes first, in-flight calls get ``grace_s`` to finish, then
    the rest are cancelled (and settle as aborted).  Connections are
    guarded (see :mod:`.connections`): a request head must arrive within
    ``header_timeout_s``, idle keep-alive connections close after
    ``keepalive_timeout_s``, and at ``max_connections`` (default: 45%
    of the open-file soft limit) a new connection takes the place of one
    still waiting for its request head, or is refused at once;
    up to ``backlog`` more wait in the kernel's queue to be accepted.
    An aiohttp that lacks an internal the connections rely on raises
    :class:`~prism_proxy.aiohttp_internals.AiohttpInternalMissing` here,
    before it binds or starts anything.
    """
    require_aiohttp_internals()
    sockets = app.get(LISTEN_SOCKETS)
    if sockets is None:
        sockets = bind(host, port, backlog=backlog)
    if GATEWAY in app:
        # Known before the start-up contexts run: plugins may call themselves.
        own = "127.0.0.1" if host in ("0.0.0.0", "", "::") else host
        if ":" in own:
            own = f"[{own}]"
        app[GATEWAY].self_link.url = f"http://{own}:{sockets[0].getsockname()[1]}"
    if max_connections is None:
        max_connections, soft = default_limit()
        log.info(
            "accepting at most %d connections (45%% of the open-file limit %d)",
            max_connections,
            soft,
        )
    guard = ConnectionGuard(header_timeout_s, max_connections, counters)
    # The grace is Listening's own cut-off (it closes what is still busy); aiohttp's
    # wait is only a backstop behind it.  Were both due at the same moment, a
    # handler cancelled by the cut-off would resolve the wait aiohttp's timeout
    # had just cancelled, and aiohttp would log InvalidStateError while draining.
    runner = web.AppRunner(app, handler_cancellation=True, shutdown_timeout=grace_s + _BACKSTOP_S)
    try:
        # setup() runs the app's start-up contexts; a failing one must not
        # leave the ones before it (pools, background tasks) running.
        await runner.setup()
        for sock in sockets:
            site = GuardedSite(
                runner,
                sock,
                guard=guard,
                keepalive_timeout_s=keepalive_timeout_s,
                backlog=backlog,
            )
            await site.start()
    except BaseException:
        await runner.cleanup()
        close_sockets(sockets)
        raise
    bound_port = runner.addresses[0][1]
    return Listening(runner, host, bound_port, grace_s)


def listen_options(config: Config) -> dict[str, Any]:
    """The keyword arguments of :func:`listen` that ``config`` sets."""
    return {
        "grace_s": config.shutdown_grace_s,
        "header_timeout_s": config.header_timeout_s,
        "keepalive_timeout_s": config.keepalive_timeout_s,
        "max_connections": config.max_connections,
        "backlog": config.backlog,
    }


async def serve(
    app: web.Application,
    config: Config,
    *,
    started: Callable[[Listening], Awaitable[None]] | None = None,
) -> None:
    """Serve until SIGTERM or SIGINT, then drain for ``shutdown_grace_s``; SIGHUP reloads.

    A reload builds the next generation from the configuration file beside
    the running one and swaps it in (see :meth:`Gateway.reload`); a
    configuration that does not load is refused and the running one serves on.
    """
    counters = app[GATEWAY].counters if GATEWAY in app else None
    listening = await listen(
        app, config.listen.host, config.listen.port, counters=counters, **listen_options(config)
    )
    log.info("Prism listening on %s (config: %s)", listening.url, config.source)
    _settle_heap()
    if started is not None:
        await started(listening)
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for signum in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(signum, stop.set)
    reloads: set[asyncio.Task[None]] = set()
    if GATEWAY in app:
        gateway = app[GATEWAY]

        def hangup() -> None:
            task = loop.create_task(_reload(gateway))
            reloads.add(task)
            task.add_done_callback(reloads.discard)

        loop.add_signal_handler(signal.SIGHUP, hangup)
    try:
        await stop.wait()
    finally:
        for signum in (signal.SIGTERM, signal.SIGINT, signal.SIGHUP):
            loop.remove_signal_handler(signum)
    log.info("draining: in-flight calls have %.0f s to finish", config.shutdown_grace_s)
    await listening.stop()
    log.info("stopped")


async def _reload(gateway: Gateway) -> None:
    # The gateway logs and counts a refusal; the running generation serves on.
    with contextlib.suppress(ConfigError):
        await gateway.reload()


def _settle_heap() -> None:
    """Leave what start-up built out of every future collection; collect young objects rarer.

    Only for a process Prism owns (``prism serve``): an app mounted in
    someone else's process leaves the collector alone.
    """
    gc.collect()
    gc.freeze()
    _, middle, old = gc.get_threshold()
    gc.set_threshold(GC_YOUNG_THRESHOLD, middle, old)


def run(main: Coroutine[Any, Any, None]) -> None:
    """Run ``main`` on uvloop when it is installed, else on asyncio's default loop."""
    try:
        import uvloop
    except ImportError:
        factory = None
    else:
        factory = uvloop.new_event_loop
    with asyncio.Runner(loop_factory=factory) as runner, contextlib.suppress(KeyboardInterrupt):
        runner.run(main)
