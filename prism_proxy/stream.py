"""Reading an upstream stream: up to the commit point, then onwards.

The commit point is the first event that carries content (text, a tool
call, a refusal or a finish reason).  Everything before it is held back so
that a failure there is an ordinary attempt failure; everything after it is
forwarded as it arrives: as the upstream's own bytes when the caller speaks
the same wire format, else through a stream translator.
"""

from __future__ import annotations

import asyncio
from typing import Any

import aiohttp

from .call import Usage
from .clock import Clock, Timer
from .providers import UpstreamResponse
from .sse import SSEBuffer, event_data
from .wire import Wire
from .wire.events import ChunkKind
from .wire.translate_response import StreamTranslator

__all__ = ["StreamBroken", "UpstreamStream"]

_READ_ERRORS = (aiohttp.ClientError, OSError)
# Enum members bound to names once (why: prism_proxy.call, above Endpoint).
_CONTENT, _USAGE, _ERROR, _DONE, _INVALID = (
    ChunkKind.CONTENT,
    ChunkKind.USAGE,
    ChunkKind.ERROR,
    ChunkKind.DONE,
    ChunkKind.INVALID,
)
NOT_JSON = "upstream sent an event that is not JSON"


def _is_utf8(data: bytes) -> bool:
    if data.isascii():
        return True
    try:
        data.decode()
    except UnicodeDecodeError:
        return False
    return True


def _data_only(run: bytes) -> list[bytes] | None:
    """The data of each event in ``run``, or None unless each is one ``data:`` line.

    The caller's SSE parser sees exactly these lines: an event with a line
    more (a JSON value split over lines, a comment, an event name) is left
    to be looked at alone.
    """
    if not run.startswith(b"data: "):
        return None
    datas = run[6:-2].split(b"\n\ndata: ")
    # One memchr over the joined copy costs less than one find per event
    # (count, and ``in``, cost more still).
    if b"".join(datas).find(b"\n") >= 0:
        return None
    return datas


class StreamBroken(Exception):
    """The upstream stream ended badly after the commit point."""

    def __init__(self, reason: str) -> None:
        super().__init__(reason)
        self.reason = reason


class UpstreamStream:
    __slots__ = (
        "_broken",
        "_chunks",
        "_clock",
        "_forward_usage",
        "_fresh",
        "_now",
        "_reader",
        "_silent",
        "_sse",
        "_waiting_since",
        "_watchdog",
        "delivered_chars",
        "done",
        "finish_reason",
        "finished",
        "idle_timeout",
        "invalid",
        "pending",
        "plain_commit",
        "response",
        "translator",
        "usage",
        "wire",
    )

    def __init__(
        self,
        response: UpstreamResponse,
        *,
        wire: Wire,
        forward_usage: bool,
        clock: Clock,
        translator: StreamTranslator | None = None,
        idle_timeout: float | None = None,
    ) -> None:
        self.response = response
        self.wire = wire
        self.translator = translator
        self._chunks = response.iter_chunks().__aiter__()
        self._sse = SSEBuffer()
        self._broken: StreamBroken | None = None
        self._forward_usage = forward_usage
        #: Events read but not yet forwarded (the held-back prelude).
        self.pending: list[bytes] = []
        self.usage: Usage | None = None
        #: Characters of answer text forwarded, for estimating a cut stream's usage.
        self.delivered_chars = 0
        self.finished = False
        #: Why the upstream said the answer ended (once it did).
        self.finish_reason: str | None = None
        self.done = False
        #: Why the stream broke before its commit point with an event that is not JSON.
        self.invalid: str | None = None
        #: The committing event is a plain chunk of text, judged without parsing it.
        self.plain_commit = False
        #: After the commit point, the longest silence tolerated between reads.
        self.idle_timeout = idle_timeout
        #: The watchdog's time and timer (the generation's clock).
        self._clock = clock
        self._now = clock.now
        #: When a read after the commit point started waiting (None: not waiting).
        self._waiting_since: float | None = None
        self._watchdog: Timer | None = None
        self._silent = False
        #: The buffer holds bytes no batch has looked at yet.
        self._fresh = True
        self._reader: asyncio.Task[Any] | None = None

    async def _read(self) -> None:
        """Read once from the network (StopAsyncIteration at EOF)."""
        self._sse.feed(await self._chunks.__anext__())
        self._fresh = True

    async def until_commit(self) -> tuple[bytes | None, Any, bool]:
        """Read up to the commit point.

        Returns ``(data, payload, broken)``: the data of the committing event
        (or of an error event sent before any content), its parsed payload
        (None when ``plain_commit``: nothing in it needed parsing), and
        whether the stream broke before content (``invalid`` then says so
        when it broke on an event that is not JSON).
        """
        sse = self._sse
        # Forwarding the upstream's own bytes, a role prelude and the first text
        # need not be built: ``wire.plain_run`` sees what they are.
        plain = self.wire.plain_run if self.translator is None else None
        while True:
            event = sse.next_event()
            if event is None:
                try:
                    await self._read()
                except (StopAsyncIteration, *_READ_ERRORS):
                    return None, None, True
                continue
            data = event_data(event)
            if data is None:
                continue
            if plain is not None:
                count, chars, finish, first = plain([data])
                # A chunk that finishes may be an empty answer: classifiers see it parsed.
                if count and finish is None and _is_utf8(data):
                    self.pending.append(event)
                    if first < 0:
                        continue
                    self.delivered_chars += chars
                    self.plain_commit = True
                    return data, None, False
            kind, payload = self.wire.inspect(data)
            if kind is _ERROR:
                return data, payload, False
            if kind is _INVALID:
                self.invalid = NOT_JSON
                return None, None, True
            if kind is _DONE:
                return None, None, True
            self._take(kind, payload, event, self.pending)
            if kind is _CONTENT:
                return data, payload, False

    def _take(self, kind: ChunkKind, payload: Any, event: bytes, out: list[bytes]) -> None:
        wire = self.wire
        self.usage = wire.usage_update(self.usage, payload)
        if kind is _CONTENT:
            chars, finish = wire.digest(payload)
            self.delivered_chars += chars
            if finish is not None:
                self.finished = True
                self.finish_reason = finish
        if self.translator is not None:
            out.extend(self.translator.convert(kind, payload))
        elif kind is not _USAGE or self._forward_usage:
            out.append(event)

    async def _read_unless_silent(self) -> None:
        """Read once, unless the upstream stays silent longer than ``idle_timeout``.

        One watchdog timer per stream, not a timeout per read: a stream of
        a thousand tokens is a thousand reads, and a timer armed and
        cancelled around each cost more than the rest of the relay's work
        on the read.  Raises TimeoutError when the watchdog ended the wait.
        """
        idle = self.idle_timeout
        if idle is None:
            await self._read()
            return
        task = self._reader
        if task is None:
            task = self._reader = asyncio.current_task()  # the relay reads from one task
            assert task is not None
        self._waiting_since = since = self._now()
        if self._watchdog is None:
            self._watchdog = self._clock.call_at(since + idle, self._watch, task, idle)
        try:
            await self._read()
        except asyncio.CancelledError:
            # Only the watchdog's own cancellation becomes a timeout; a
            # caller leaving (or a shutdown) cancels as usual.
            if self._silent and task.uncancel() == 0:
                raise TimeoutError from None
            raise
        finally:
            self._waiting_since = None

    def _watch(self, task: asyncio.Task[Any], idle: float) -> None:
        """Cancel a read that has waited ``idle`` seconds; else look again when one could have."""
        self._watchdog = None
        if self.done or self._broken is not None or task.done():
            return
        now = self._now()
        since = self._waiting_since
        if since is not None and now - since >= idle:
            self._silent = True
            task.cancel()
            return
        due = (now if since is None else since) + idle
        self._watchdog = self._clock.call_at(due, self._watch, task, idle)

    def close(self) -> None:
        """Drop the upstream at once (a broken stream, a caller gone)."""
        self._stop_watch()
        self.response.close()

    def _stop_watch(self) -> None:
        if self._watchdog is not None:
            self._watchdog.cancel()
            self._watchdog = None

    async def finish(self) -> None:
        """Read what follows the final event (the chunked body's end), then release.

        A response left short of its end makes aiohttp close the connection
        instead of pooling it; the caller already has its answer by now.
        """
        self._stop_watch()
        response = self.response
        if response.at_eof():
            response.release()  # the usual case: the end came with the final event
            return
        try:
            async with asyncio.timeout(1.0):
                while True:
                    await self._chunks.__anext__()
        except StopAsyncIteration:
            response.release()
        except (TimeoutError, *_READ_ERRORS):
            response.close()

    def _forward_plain_run(self, out: list[bytes]) -> None:
        """Forward as they are the complete events before the first one worth a look.

        A fast upstream delivers many events per read, and a slow one a few
        tokens' worth: most carry only text (or the finish), and need only be
        seen to be JSON (``wire.plain_run``) to be passed on unbuilt.
        """
        sse = self._sse
        run = sse.take_complete()
        if not run:
            return
        datas = _data_only(run)
        if datas is None:
            sse.put_back(run)
            return
        count, chars, finish, _ = self.wire.plain_run(datas)
        if count and count < len(datas):
            # What is left is usually short (the usage chunk, the final event).
            size = len(run)
            for data in datas[count:]:
                size -= len(data) + 8  # b"data: " + data + b"\n\n"
            sse.put_back(run[size:])
            run = run[:size]
        if not count or not _is_utf8(run):
            sse.put_back(run)  # looked at one by one: a bad one ends the stream
            return
        out.append(run)
        self.delivered_chars += chars
        if finish is not None:
            self.finished = True
            self.finish_reason = finish

    def closing(self) -> bytes:
        """What the caller gets after the last upstream event and before the final one."""
        if self.translator is None:
            return b""
        return b"".join(self.translator.finish(self.usage))

    async def next_batch(self) -> bytes | None:
        """The next forwardable bytes after the commit point: all that one network read allows.

        The held-back prelude goes out with whatever else has already arrived,
        so a fast upstream costs the caller as few writes as possible.  None
        once the stream has ended cleanly: at the upstream's final event (not
        forwarded: the relay writes the caller's own after settling) or at EOF
        after a finish reason.  Raises :class:`StreamBroken` otherwise, after
        returning what arrived before the break.
        """
        out, self.pending = self.pending, []
        while True:
            if self._broken is not None:
                if out:
                    return b"".join(out)
                raise self._broken
            if self.done:
                return b"".join(out) if out else None
            if self._fresh:
                self._fresh = False
                self._forward_buffered(out)
                if out:
                    return b"".join(out)
                if self.done or self._broken is not None:
                    continue
            try:
                await self._read_unless_silent()
            except TimeoutError:
                self._broken = StreamBroken(f"upstream silent for {self.idle_timeout:g} s")
            except StopAsyncIteration:
                if self.finished:
                    self.done = True
                else:
                    self._broken = StreamBroken("upstream closed the stream before it finished")
            except _READ_ERRORS as exc:
                self._broken = StreamBroken(f"upstream connection broke: {type(exc).__name__}")

    def _forward_buffered(self, out: list[bytes]) -> None:
        """Move every complete buffered event into ``out`` (forwarded or translated).

        Stops at the upstream's final event (``done``) or an error event
        (``_broken``).  Forwarding the upstream's own bytes, most events need
        no parsing: a run of plain ones goes out whole.
        """
        if self.translator is None:
            self._forward_plain_run(out)
        inspect = self.wire.inspect
        next_event = self._sse.next_event
        while (event := next_event()) is not None:
            data = event_data(event)
            if data is None:
                if self.translator is None:
                    out.append(event)
                continue
            kind, payload = inspect(data)
            if kind is _DONE:
                self.done = True
                return
            if kind is _ERROR:
                self._broken = StreamBroken("upstream sent an error event")
                return
            if kind is _INVALID:
                self._broken = StreamBroken(NOT_JSON)
                return
            self._take(kind, payload, event, out)
