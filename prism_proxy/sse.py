"""Incremental Server-Sent Events reading, for relaying upstream streams as they arrive."""

from __future__ import annotations

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
        if data.find(b"\r") >= 0:  # memchr; ``in`` first tries the byte as an int
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

    def take_complete(self) -> bytes:
        """Every complete event buffered, unsplit (empty until one is complete)."""
        buf, pos = self._buf, self._pos
        end = buf.rfind(b"\n\n", pos) + 2
        if end < pos + 2:
            return b""
        self._pos = end
        return buf[pos:end]

    def put_back(self, taken: bytes) -> None:
        """Give back the end of what the last ``take_complete`` or ``next_event`` returned."""
        self._pos -= len(taken)


def event_data(event: bytes) -> bytes | None:
    """The joined ``data:`` lines of one event, or None for a comment-only event."""
    if event.startswith(b"data: ") and event.find(b"\n") == len(event) - 2:
        return event[6:-2]
    parts = []
    for line in event.split(b"\n"):
        if line.startswith(b"data:"):
            value = line[5:]
            parts.append(value[1:] if value.startswith(b" ") else value)
    if not parts:
        return None
    return b"\n".join(parts)
