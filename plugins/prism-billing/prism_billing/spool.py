"""A local, append-only spool for the ledger rows PostgreSQL could not take.

While PostgreSQL is unreachable, a batch of rows is appended to this file
and fsynced before its calls are told their rows are safe; once PostgreSQL
answers again the rows are replayed into it in the order they were spooled,
and the file is emptied.  A replay that is cut short (a crash between an
insert and the truncation) is simply run again: the ledger's insert skips
request ids it already holds, so every row lands exactly once.

One record per line: the CRC-32 of the JSON object, a space, the object
(column name to value), a newline.  A line that is not whole (a crash in
the middle of an append, never acknowledged) is cut off when the spool is
opened; a whole line whose checksum fails is skipped and counted.

Each process holds its spool file with an exclusive ``flock``: under
``prism serve --workers N`` the second worker to open ``path`` takes
``path.1``, the next ``path.2`` and so on; a restarted worker takes the slot
its predecessor's death freed, and whatever a slot nobody holds still has
(fewer workers than before) is adopted into the spool of the next process
that opens one.
"""

from __future__ import annotations

import asyncio
import collections
import contextlib
import errno
import fcntl
import logging
import os
import zlib
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import orjson

from .rows import COLUMNS, LedgerRow

__all__ = ["MAX_SLOTS", "Spool", "SpoolOpenFailed", "SpoolUnusable"]

log = logging.getLogger("prism.billing")

#: How many processes may spool beside one ``spool_path`` (``path``, ``path.1`` …).
MAX_SLOTS = 64
#: Rows read per step while scanning or adopting a file (bounds memory, not a batch).
_SCAN_ROWS = 4096


class SpoolUnusable(OSError):
    """The spool cannot take rows: its file is gone or replaced, or it is full."""


class SpoolOpenFailed(Exception):
    """The spool could not be opened at start-up (named in the message)."""


def encode(row: LedgerRow) -> bytes:
    body = orjson.dumps(dict(zip(COLUMNS, row.as_tuple(), strict=True)))
    return b"%08x %s\n" % (zlib.crc32(body), body)


def decode(line: bytes) -> LedgerRow | None:
    """The row a whole line holds, or None when the line is damaged."""
    checksum, _, body = line.rstrip(b"\n").partition(b" ")
    try:
        if int(checksum, 16) != zlib.crc32(body):
            return None
        values: Any = orjson.loads(body)
        return LedgerRow(**{name: values[name] for name in COLUMNS if name in values})
    except (ValueError, TypeError):
        return None


def _fsync_dir(directory: Path) -> None:
    """Make a file's creation durable: its directory entry, not only its bytes."""
    fd = os.open(directory, os.O_RDONLY | os.O_DIRECTORY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def _lock(path: Path) -> int | None:
    """``path`` opened for appending and exclusively locked, or None if another process holds it."""
    existed = path.exists()
    fd = os.open(path, os.O_RDWR | os.O_APPEND | os.O_CREAT | os.O_CLOEXEC, 0o600)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        os.close(fd)
        return None
    except BaseException:
        os.close(fd)
        raise
    if not existed:
        _fsync_dir(path.parent)
    return fd


def _read(fd: int, offset: int, max_rows: int) -> tuple[list[LedgerRow], int, int, int]:
    """Up to ``max_rows`` whole records from ``offset``: (rows, next offset, damaged, torn at).

    ``torn at`` is the offset of a last line without its newline (-1: none).
    """
    rows: list[LedgerRow] = []
    damaged = 0
    size = os.fstat(fd).st_size
    position = offset  # where the unparsed bytes in ``buffer`` start
    buffer = b""
    while len(rows) < max_rows:
        read_at = position + len(buffer)
        more = os.pread(fd, 1 << 20, read_at) if read_at < size else b""
        if not more:
            return rows, position, damaged, position if buffer else -1
        buffer += more
        start = 0
        while len(rows) < max_rows:
            end = buffer.find(b"\n", start)
            if end < 0:
                break
            row = decode(buffer[start : end + 1])
            if row is None:
                damaged += 1
            else:
                rows.append(row)
            start = end + 1
        position += start
        buffer = buffer[start:]
    return rows, position, damaged, -1


def _write_all(fd: int, data: bytes) -> None:
    """Append ``data`` to a file and sync it; on failure cut what was written."""
    size = os.fstat(fd).st_size
    written = 0
    try:
        while written < len(data):
            written += os.write(fd, data[written:])
        os.fdatasync(fd)
    except OSError:
        # A partial record would glue onto the next one.
        with contextlib.suppress(OSError):
            os.ftruncate(fd, size)
        raise


class Spool:
    """This process's spool file: append, read back in order, empty once replayed.

    Every file operation runs on one thread of its own, one after another, so
    an append and a truncation never interleave; what they change is set on
    the event loop once they return.
    """

    def __init__(self, path: Path, *, max_bytes: int, counters: collections.Counter[str]) -> None:
        #: The configured path; :attr:`path` is the slot this process holds.
        self.base = path
        self.path = path
        self.max_bytes = max_bytes
        self.counters = counters
        #: Rows in the file not yet replayed into the ledger (by this process).
        self.depth = 0
        #: The file's size in bytes.
        self.size = 0
        #: Rows handed to :meth:`append` whose write has not returned yet.
        self.pending = 0
        #: Why the last append failed, while the spool cannot take rows (None: it can).
        self.broken: str | None = None
        #: How far the replay got: the records before it are in the ledger.
        self.replayed_to = 0
        self._fd: int | None = None
        self._executor = ThreadPoolExecutor(1, thread_name_prefix="prism-billing-spool")

    def can_take(self) -> bool:
        return self.state() == "ok"

    def state(self) -> str:
        """``ok``, ``full`` or ``unusable`` (its file gone, its disk failing)."""
        if self._fd is None or self.broken is not None:
            return "unusable"
        return "ok" if self.size < self.max_bytes else "full"

    def why_not(self) -> str:
        """Why :meth:`can_take` is false, for a log line or an error."""
        if self._fd is None:
            return f"spool {self.base} is not open"
        if self.broken is not None:
            return f"spool {self.path}: {self.broken}"
        return f"spool {self.path} is full ({self.size} bytes, spool_max_bytes {self.max_bytes})"

    async def _run(self, function: Any, *args: Any) -> Any:
        return await asyncio.get_running_loop().run_in_executor(self._executor, function, *args)

    async def open(self) -> None:
        """Take a free slot, cut a torn last record, count the rows, adopt abandoned slots."""
        try:
            self._fd, self.path, self.depth, self.size = await self._run(self._open)
        except OSError as exc:
            raise SpoolOpenFailed(f"cannot open the spool {self.base}: {exc}") from None

    def _open(self) -> tuple[int, Path, int, int]:
        for slot in range(MAX_SLOTS):
            path = self.base if slot == 0 else self.base.with_name(f"{self.base.name}.{slot}")
            fd = _lock(path)
            if fd is not None:
                break
        else:
            held = f"all {MAX_SLOTS} spool slots beside {self.base} are held"
            raise SpoolUnusable(errno.EBUSY, held)
        try:
            depth, _ = self._scan(fd, path)
            moved, size = self._adopt_all(fd, path)
        except BaseException:
            os.close(fd)
            raise
        return fd, path, depth + moved, size

    async def adopt(self) -> None:
        """Take in the rows of slots no process holds (a writer closed with rows left)."""
        if self._fd is None or not self.can_take():
            return
        moved, size = await self._run(self._adopt_all, self._fd, self.path)
        self.depth += moved
        self.size = size

    def _adopt_all(self, fd: int, mine: Path) -> tuple[int, int]:
        """(rows moved in, the file's size after)."""
        moved = 0
        for other in self._others(mine):
            moved += self._adopt(other, fd)
        return moved, os.fstat(fd).st_size

    def _others(self, mine: Path) -> list[Path]:
        """The other slots beside :attr:`base` (``base``, ``base.1`` …)."""
        siblings = [self.base, *self.base.parent.glob(f"{self.base.name}.*")]
        return [
            p
            for p in siblings
            if p != mine and (p == self.base or p.name.rsplit(".", 1)[1].isdigit())
        ]

    def _scan(self, fd: int, path: Path) -> tuple[int, int]:
        """(rows, size) of a locked file, after cutting off a torn last record."""
        rows, offset = 0, 0
        while True:
            found, offset, damaged, torn = _read(fd, offset, _SCAN_ROWS)
            rows += len(found)
            self._damaged(path, damaged)
            if torn >= 0:
                # Never acknowledged: its append did not finish.
                os.ftruncate(fd, torn)
                os.fsync(fd)
                return rows, torn
            if not found and not damaged:
                return rows, offset

    def _adopt(self, other: Path, fd: int) -> int:
        """Move the rows of a slot no process holds into ours (``fd``): how many."""
        try:
            theirs = _lock(other) if other.exists() else None
        except OSError:
            return 0
        if theirs is None:
            return 0  # a live process holds it
        moved, offset = 0, 0
        try:
            while True:
                rows, offset, damaged, torn = _read(theirs, offset, _SCAN_ROWS)
                self._damaged(other, damaged)
                if rows:
                    _write_all(fd, b"".join(encode(row) for row in rows))
                    moved += len(rows)
                if torn >= 0 or not (rows or damaged):
                    break
            # Moved and synced first: a crash before this truncation leaves the rows in
            # two spools, and the ledger keeps one of each.
            os.ftruncate(theirs, 0)
            os.fsync(theirs)
        finally:
            os.close(theirs)
        if moved:
            log.warning("spool %s: adopted %d rows from %s", self.base, moved, other)
        return moved

    def _damaged(self, path: Path, count: int) -> None:
        if count:
            self.counters["billing_spool_damaged"] += count
            log.error("spool %s: %d damaged records skipped", path, count)

    async def append(self, rows: list[LedgerRow]) -> None:
        """Append ``rows`` and fsync; raises OSError (the spool then refuses) if it cannot."""
        if not self.can_take():
            raise SpoolUnusable(errno.ENOSPC, self.why_not())
        data = b"".join(encode(row) for row in rows)
        self.pending += len(rows)
        try:
            size: int = await self._run(self._append, data)
        except OSError as exc:
            self.broken = f"{type(exc).__name__}: {exc}"
            log.error("spool %s cannot take rows: %s", self.path, self.broken)
            raise
        finally:
            self.pending -= len(rows)
        # Set from the file, in the order the thread ran the operations: an adoption
        # may have added rows too.
        self.size = size
        self.depth += len(rows)
        if self.size >= self.max_bytes:
            log.error("%s: no more rows until it is replayed", self.why_not())

    def _append(self, data: bytes) -> int:
        """Append and sync; the file's size after."""
        fd = self._fd
        assert fd is not None
        # A file removed or replaced under us would swallow every row written to it.
        if os.fstat(fd).st_ino != os.stat(self.path).st_ino:
            raise SpoolUnusable(errno.ENOENT, f"{self.path} was removed or replaced")
        _write_all(fd, data)
        return os.fstat(fd).st_size

    async def probe(self) -> None:
        """Clear :attr:`broken` once the spool can take rows again (its file back, its disk)."""
        if self.broken is None or self._fd is None:
            return
        found = await self._run(self._probe, self._fd, self.depth == 0)
        if found is not None:
            fd, depth, size = found
            if fd != self._fd:  # a new file
                self._fd, self.depth, self.size, self.replayed_to = fd, depth, size, 0
            self.broken = None
            log.info("spool %s takes rows again", self.path)

    def _probe(self, fd: int, replayed: bool) -> tuple[int, int, int] | None:
        try:
            if os.fstat(fd).st_ino == os.stat(self.path).st_ino:
                os.fdatasync(fd)
                return fd, 0, 0  # the same file: nothing to count again
            if not replayed:
                return None  # the rows still readable through ``fd`` are replayed first
            replacement = _lock(self.path)
        except OSError:
            return None
        if replacement is None:
            return None
        os.close(fd)
        depth, size = self._scan(replacement, self.path)
        return replacement, depth, size

    @property
    def rejected_path(self) -> Path:
        """Where rows the ledger refused on replay are kept, for an operator to look at."""
        return self.path.with_name(self.path.name + ".rejected")

    async def reject(self, row: LedgerRow) -> None:
        """Keep a row the ledger refused beside the spool (same format), synced."""
        await self._run(_keep_rejected, self.rejected_path, encode(row))

    async def read(self, max_rows: int) -> tuple[list[LedgerRow], int]:
        """The next rows to replay, oldest first, and the offset after them."""
        assert self._fd is not None
        rows, offset, damaged, _ = await self._run(_read, self._fd, self.replayed_to, max_rows)
        self._damaged(self.path, damaged)
        return rows, offset

    def replayed(self, rows: int, offset: int) -> None:
        """The rows :meth:`read` returned, up to ``offset``, are in the ledger."""
        self.replayed_to = offset
        self.depth = max(0, self.depth - rows)

    async def empty_if_replayed(self) -> bool:
        """Empty the file if every row in it was replayed (nothing appended since)."""
        assert self._fd is not None
        emptied: bool = await self._run(_empty_if_at, self._fd, self.replayed_to)
        if emptied:
            self.size = self.replayed_to = self.depth = 0
        return emptied

    async def close(self) -> None:
        fd, self._fd = self._fd, None
        if fd is not None:
            await self._run(os.close, fd)  # closing releases the lock
        self._executor.shutdown(wait=True)


def _keep_rejected(path: Path, record: bytes) -> None:
    fd = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT | os.O_CLOEXEC, 0o600)
    try:
        _write_all(fd, record)
    finally:
        os.close(fd)


def _empty_if_at(fd: int, size: int) -> bool:
    if os.fstat(fd).st_size != size:
        return False
    os.ftruncate(fd, 0)
    os.fsync(fd)
    return True
