"""Incremental Server-Sent Events splitting, for relaying upstream streams as they arrive."""

from __future__ import annotations

__all__ = ["SSEBuffer", "event_data", "split_events"]


def split_events(buf: bytes) -> tuple[list[bytes], bytes]:
    """Complete events (each ending with a blank line) and the unfinished rest."""
    events: list[bytes] = []
    start = 0
    while True:
        end = buf.find(b"\n\n", start)
        if end < 0:
            return events, buf[start:]
        events.append(buf[start : end + 2])
        start = end + 2


class SSEBuffer:
    """Cuts a byte stream into complete events (each ending with a blank line).

    Raw event bytes are kept as received so a relay can forward them without
    re-encoding.  CRLF line endings are normalised to LF.
    """

    __slots__ = ("_cr", "_pending")

    def __init__(self) -> None:
        self._pending = b""
        self._cr = False

    def feed(self, data: bytes) -> list[bytes]:
        if self._cr:
            data = b"\r" + data
            self._cr = False
        if b"\r" in data:
            if data.endswith(b"\r"):
                # Its \n may be in the next read: decide then, not now.
                data = data[:-1]
                self._cr = True
            data = data.replace(b"\r\n", b"\n").replace(b"\r", b"\n")
        events, self._pending = split_events(self._pending + data if self._pending else data)
        return events


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
