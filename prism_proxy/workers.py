"""``prism serve --workers N``: N gateway processes on one port, supervised.

The supervisor binds the port itself and hands the listening sockets to
every worker, so all of them accept on one port, a restarted worker never
loses it, and no other process can take it in between.  A worker that dies
is restarted with backoff (1 s, doubling to 30 s; back to 1 s once a worker
has run a minute) and logged.  SIGTERM drains every worker (each has
``shutdown_grace_s``, then :data:`CLEANUP_S` to clean up before it is
killed), SIGHUP makes every worker reload.  The supervisor exits 0 only when
every worker drained and exited 0 on its own; a worker killed or failing at
the end is logged and makes it exit 1.

Before it starts them, the supervisor asks the plugins whether their state
can be split across processes (``prism_workers``): one that cannot (a
breaker keeping its health in one process) stops start-up and says why.
Every worker gets ``PRISM_WORKERS_DIR``: a directory the workers of this
server share, made before the first starts and removed when the last stops
(prism-metrics keeps its counters there, so ``/metrics`` adds them up).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import secrets
import shutil
import signal
import socket
import sys
import tempfile
import time
from collections.abc import Sequence

import attrs

from .config import Config
from .selflink import INTERNAL_TOKEN_ENV
from .telemetry import WORKERS_DIR_ENV

__all__ = ["CLEANUP_S", "MAX_BACKOFF_S", "Supervisor"]

log = logging.getLogger("prism.workers")

#: The longest pause before restarting a worker that keeps dying.
MAX_BACKOFF_S = 30.0
#: A worker that ran this long before it died is restarted at once (1 s).
HEALTHY_RUN_S = 60.0
#: After its grace, how long a stopping worker has to clean up (stop plugins, write
#: their last state) before it is killed.
CLEANUP_S = 10.0


@attrs.define(eq=False)
class Supervisor:
    """Starts, restarts and stops the workers of one ``prism serve``."""

    config: Config
    count: int
    sockets: Sequence[socket.socket]
    listen: str | None = None
    workers: dict[int, asyncio.subprocess.Process] = attrs.field(factory=dict)
    stopping: asyncio.Event = attrs.field(factory=asyncio.Event)
    #: The directory the workers share (``PRISM_WORKERS_DIR``) while they run.
    shared_dir: str | None = None
    #: One internal token for every worker: a call to the port may reach any of them.
    internal_token: str = attrs.field(factory=lambda: secrets.token_urlsafe(24), repr=False)
    #: Workers that did not stop cleanly when asked (killed, or a status other than 0).
    unclean: int = 0

    def _argv(self) -> list[str]:
        fds = ",".join(str(sock.fileno()) for sock in self.sockets)
        argv = [
            sys.executable,
            "-m",
            "prism_proxy.cli",
            "serve",
            "--config",
            self.config.source,
            "--worker-fds",
            fds,
        ]
        if self.listen is not None:
            argv += ["--listen", self.listen]
        return argv

    async def run(self) -> int:
        loop = asyncio.get_running_loop()
        for signum in (signal.SIGTERM, signal.SIGINT):
            loop.add_signal_handler(signum, self.stopping.set)
        loop.add_signal_handler(signal.SIGHUP, self._forward, signal.SIGHUP)
        log.info("starting %d workers", self.count)
        self.shared_dir = tempfile.mkdtemp(prefix="prism-workers-")
        try:
            await asyncio.gather(*(self._keep(slot) for slot in range(self.count)))
        finally:
            for signum in (signal.SIGTERM, signal.SIGINT, signal.SIGHUP):
                loop.remove_signal_handler(signum)
            shutil.rmtree(self.shared_dir, ignore_errors=True)
        log.info("all workers stopped")
        return 1 if self.unclean else 0

    def _forward(self, signum: int) -> None:
        log.info("reloading every worker")
        for process in self.workers.values():
            with contextlib.suppress(ProcessLookupError):
                process.send_signal(signum)

    async def _keep(self, slot: int) -> None:
        """Keep worker ``slot`` running until the supervisor stops."""
        backoff = 1.0
        fds = [sock.fileno() for sock in self.sockets]
        while not self.stopping.is_set():
            started = time.monotonic()
            env = {
                **os.environ,
                WORKERS_DIR_ENV: self.shared_dir or "",
                INTERNAL_TOKEN_ENV: self.internal_token,
            }
            process = await asyncio.create_subprocess_exec(*self._argv(), pass_fds=fds, env=env)
            self.workers[slot] = process
            log.info("worker %d started (pid %d)", slot, process.pid)
            stop = asyncio.ensure_future(self.stopping.wait())
            ended = asyncio.ensure_future(process.wait())
            await asyncio.wait({stop, ended}, return_when=asyncio.FIRST_COMPLETED)
            if self.stopping.is_set():
                stop.cancel()
                await self._stop(slot, process, ended)
                return
            stop.cancel()
            ran = time.monotonic() - started
            backoff = 1.0 if ran >= HEALTHY_RUN_S else backoff
            log.warning(
                "worker %d (pid %d) exited with status %s after %.0f s; restarting in %.0f s",
                slot,
                process.pid,
                process.returncode,
                ran,
                backoff,
            )
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self.stopping.wait(), backoff)
            backoff = min(MAX_BACKOFF_S, backoff * 2)

    async def _stop(
        self, slot: int, process: asyncio.subprocess.Process, ended: asyncio.Future[int]
    ) -> None:
        """Drain: SIGTERM, the worker's grace and a little more, then SIGKILL."""
        with contextlib.suppress(ProcessLookupError):
            process.send_signal(signal.SIGTERM)
        try:
            await asyncio.wait_for(ended, self.config.shutdown_grace_s + CLEANUP_S)
        except TimeoutError:
            self.unclean += 1
            log.error("worker %d (pid %d) did not stop in time; killing it", slot, process.pid)
            with contextlib.suppress(ProcessLookupError):
                process.kill()
            await process.wait()
            return
        if process.returncode != 0:
            self.unclean += 1
            log.warning(
                "worker %d (pid %d) exited with status %s while draining",
                slot,
                process.pid,
                process.returncode,
            )
