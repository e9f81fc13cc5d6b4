"""The processes of a run: the fake upstream, Redis when replicas share it, `prism serve`s."""

from __future__ import annotations

import asyncio
import contextlib
import socket
import sys
import time
from collections.abc import Sequence
from pathlib import Path

import aiohttp

__all__ = ["LabError", "Processes", "free_port"]


class LabError(RuntimeError):
    """Something the run needs did not start; the message says what and why."""


def free_port() -> int:
    """A loopback port that was free a moment ago."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


async def _ready(url: str, process: asyncio.subprocess.Process, timeout_s: float) -> bool:
    deadline = time.monotonic() + timeout_s
    async with aiohttp.ClientSession() as session:
        while time.monotonic() < deadline and process.returncode is None:
            with contextlib.suppress(aiohttp.ClientError):
                async with session.get(url) as response:
                    if response.status < 500:
                        return True
            await asyncio.sleep(0.05)
    return False


class Processes:
    """Starts processes, and stops every one of them (by its own pid) on close."""

    def __init__(self, logs: Path) -> None:
        self._logs = logs
        self._started: list[asyncio.subprocess.Process] = []

    async def _spawn(
        self, name: str, argv: Sequence[str], cwd: Path | None = None
    ) -> asyncio.subprocess.Process:
        self._logs.mkdir(parents=True, exist_ok=True)
        with (self._logs / f"{name}.log").open("ab") as log:
            process = await asyncio.create_subprocess_exec(
                *argv, stdout=log, stderr=log, stdin=asyncio.subprocess.DEVNULL, cwd=cwd
            )
        self._started.append(process)
        return process

    def _tail(self, name: str) -> str:
        lines = (self._logs / f"{name}.log").read_text(errors="replace").strip().splitlines()
        return lines[-1] if lines else "(no output)"

    async def fake_upstream(self) -> str:
        port = free_port()
        argv = [sys.executable, "-m", "prism_fake_upstream.cli", "--port", str(port)]
        process = await self._spawn("fake-upstream", [*argv, "--max-recorded", "0"])
        url = f"http://127.0.0.1:{port}"
        if not await _ready(f"{url}/_fake/hits/ready", process, 15.0):
            raise LabError(f"the fake upstream did not start: {self._tail('fake-upstream')}")
        return url

    async def redis(self) -> str:
        port = free_port()
        argv = ["redis-server", "--port", str(port), "--bind", "127.0.0.1", "--save", ""]
        try:
            await self._spawn("redis", [*argv, "--appendonly", "no"])
        except FileNotFoundError:
            raise LabError("replicas > 1 share Redis, and redis-server is not installed") from None
        deadline = time.monotonic() + 10.0
        while time.monotonic() < deadline:
            try:
                _reader, writer = await asyncio.open_connection("127.0.0.1", port)
            except OSError:
                await asyncio.sleep(0.05)
                continue
            writer.close()
            return f"redis://127.0.0.1:{port}/0"
        raise LabError(f"redis-server did not start: {self._tail('redis')}")

    async def gateway(self, name: str, ini: Path, port: int, timeout_s: float = 20.0) -> str:
        argv = [sys.executable, "-m", "prism_proxy.cli", "serve", "--config", str(ini)]
        process = await self._spawn(name, argv, cwd=ini.parent)
        url = f"http://127.0.0.1:{port}"
        if not await _ready(f"{url}/readyz", process, timeout_s):
            raise LabError(f"{name}: prism serve did not start: {self._tail(name)}")
        return url

    async def close(self) -> None:
        started, self._started = self._started, []
        for process in started:
            if process.returncode is None:
                process.terminate()
        for process in started:
            try:
                await asyncio.wait_for(process.wait(), 10.0)
            except TimeoutError:
                process.kill()
                await process.wait()
