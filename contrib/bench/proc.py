"""What the bench reads of its processes in /proc, and where it lets them run (Linux)."""

from __future__ import annotations

import contextlib
import os
from pathlib import Path

__all__ = ["ThreadTimes", "cpu_seconds", "pin", "process_tree", "split_cpus", "thread_times"]


def _stat(pid: int) -> list[str]:
    return _stat_path(Path(f"/proc/{pid}/stat"))


def _stat_path(path: Path) -> list[str]:
    """The fields after the command name (which may hold spaces and parentheses)."""
    return path.read_text().rsplit(")", 1)[1].split()


def process_tree(pid: int) -> set[int]:
    """``pid`` and its living descendants (a supervisor's workers, a peer's children)."""
    parents: dict[int, int] = {}
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                parents[int(entry.name)] = int(_stat(int(entry.name))[1])
            except (OSError, IndexError):
                continue  # gone meanwhile
    tree, grown = {pid}, True
    while grown:
        more = {child for child, parent in parents.items() if parent in tree} - tree
        tree |= more
        grown = bool(more)
    return tree


def cpu_seconds(pid: int) -> float:
    """CPU time (user + system) of ``pid`` and of its living descendants."""
    ticks = 0
    for member in process_tree(pid):
        try:
            fields = _stat(member)
        except OSError:
            continue
        ticks += int(fields[11]) + int(fields[12])
    return ticks / os.sysconf("SC_CLK_TCK")


#: (main thread user, main thread system, other threads' user, other threads' system), seconds.
ThreadTimes = tuple[float, float, float, float]


def thread_times(pid: int) -> ThreadTimes:
    """``pid``'s CPU time split between its main thread and its other threads.

    Python 3.11 does not name OS threads, so the split is by role: the event
    loop runs on the main thread; the other threads are executors (the
    ledger's writer, ``to_thread`` work).  A thread that ended meanwhile is
    no longer listed: its time is in neither part.
    """
    tick = os.sysconf("SC_CLK_TCK")
    times = [0.0, 0.0, 0.0, 0.0]
    for task in Path(f"/proc/{pid}/task").iterdir():
        try:
            fields = _stat_path(task / "stat")
        except OSError:
            continue  # ended meanwhile
        part = 0 if int(task.name) == pid else 2
        times[part] += int(fields[11]) / tick
        times[part + 1] += int(fields[12]) / tick
    return times[0], times[1], times[2], times[3]


def split_cpus() -> tuple[set[int], set[int]] | None:
    """(the proxies' CPUs, the load's and upstream's CPUs): the last CPU for the
    proxy under test, the others for wrk and the fake; None on one CPU."""
    cpus = sorted(os.sched_getaffinity(0))
    if len(cpus) < 2:
        return None
    return {cpus[-1]}, set(cpus[:-1])


def pin(pid: int, cpus: set[int]) -> None:
    """Every thread of ``pid`` and of its descendants onto ``cpus``."""
    for member in process_tree(pid):
        with contextlib.suppress(OSError):
            for task in Path(f"/proc/{member}/task").iterdir():
                with contextlib.suppress(OSError):
                    os.sched_setaffinity(int(task.name), cpus)
