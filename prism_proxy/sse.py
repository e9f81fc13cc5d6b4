"""Incremental Server-Sent Events reading, for relaying upstream streams as they arrive."""

from __future__ import annotations

from collections.abc import Callable

__all__ = ["SSEBuffer", "event_data"]


class SSEBuffer:
    """Bytes read from an event stream, taken out one complete event (or run of events) at a time.

    Events are kept as received so a relay can forward them without
    re-encoding; CRLF line endings are normalised to LF.  Nothing is split
    up front: a relay that forwards a run of events whole never pays for
    cutting it into pieces.
    """

    __slots__ = ("_buf", "_cr", "_pos")

    def __init__(self) -> None:
        self._buf = b""
        #: Where the next event starts in ``_buf``; everything before it is taken.
        self._pos = 0
        self._cr = False

    def feed(self, data: bytes) -> None:
        if self._cr:
            data = b"\r" + data
            self._cr = False
        if b"\r" in data:
            if data.endswith(b"\r"):
                # Its \n may be in the next read: decide then, not now.
                data = data[:-1]
                self._cr = True
            data = data.replace(b"\r\n", b"\n").replace(b"\r", b"\n")
        if self._pos < len(self._buf):
            self._buf = self._buf[self._pos :] + data
        else:
            self._buf = data
        self._pos = 0

    def next_event(self) -> bytes | None:
        """The next complete event (ending with its blank line), or None until more arrives."""
        buf, pos = self._buf, self._pos
        end = buf.find(b"\n\n", pos)
        if end < 0:
            return None
        self._pos = end + 2
        return buf[pos : end + 2]

    def take_run(self, first_notable: Callable[[bytes, int, int], int]) -> bytes:
        """The complete events before the first one ``first_notable`` points into, unsplit.

        ``first_notable(buf, start, end)`` returns where in ``buf[start:end]``
        the first event worth a closer look may start (-1: none is).
        """
        buf, pos = self._buf, self._pos
        end = buf.rfind(b"\n\n", pos) + 2
        if end < pos + 2:
            return b""
        notable = first_notable(buf, pos, end)
        if notable >= 0:
            end = buf.rfind(b"\n\n", pos, notable) + 2
            if end < pos + 2:
                return b""
        self._pos = end
        return buf[pos:end]

    def put_back(self, taken: bytes) -> None:
        """Undo the last ``take_run`` or ``next_event``, which returned ``taken``."""
        self._pos -= len(taken)


def event_data(event: bytes) -> bytes | None:
    """The joined ``data:`` lines of one event, or None for a comment-only event."""
    if event.startswith(b"data: ") and event.count(b"\n") == 2:
        return event[6:-2]
    parts = []
    for line in event.split(b"\n"):
        if line.startswith(b"data:"):
            value = line[5:]
            parts.append(value[1:] if value.startswith(b" ") else value)
    if not parts:
        return None
    return b"\n".join(parts)
