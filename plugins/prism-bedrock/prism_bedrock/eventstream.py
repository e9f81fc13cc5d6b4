"""ConverseStream's binary event stream, presented to the core as SSE events.

The answer (``application/vnd.amazon.eventstream``) is decoded with
botocore's :class:`~botocore.eventstream.EventStreamBuffer`, which checks
each message's prelude and message CRCs. Each event message becomes
``data: {"<:event-type>": <payload>}``; an exception message
``data: {"<:exception-type>": <payload>}`` (the type ends in ``Exception``),
which the wire reads as an error event. A frame that does not decode breaks
the connection as a damaged body does (``aiohttp.ClientPayloadError``).
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Mapping
from typing import Any, cast

import aiohttp
import orjson
from botocore.eventstream import EventStreamBuffer, EventStreamMessage, ParserError

from prism_proxy import ResponseWrapper, UpstreamResponse

__all__ = ["ConverseResponse", "EVENT_STREAM", "message_event"]

EVENT_STREAM = "application/vnd.amazon.eventstream"


def _exception_name(name: str) -> str:
    name = name[:1].lower() + name[1:]
    return name if name.endswith("Exception") else name + "Exception"


def message_event(message: EventStreamMessage, model: str | None = None) -> bytes | None:
    """One decoded message as an SSE event, or None for one that means nothing here."""
    # botocore-stubs type a message's headers as int: they are the parsed header dict.
    headers = cast("Mapping[str, Any]", message.headers)
    kind = headers.get(":message-type", "event")
    payload = bytes(message.payload) or b"{}"
    if kind == "event":
        name = str(headers.get(":event-type", ""))
        if not name:
            return None
        if name == "messageStart" and model is not None:
            try:
                start = orjson.loads(payload)
            except orjson.JSONDecodeError:
                start = None
            if isinstance(start, dict):
                # Converse names no model in its answer: the caller is told the one called.
                payload = orjson.dumps({**start, "modelId": model})
    elif kind == "exception":
        name = _exception_name(str(headers.get(":exception-type", "internalServerException")))
    elif kind == "error":
        # A protocol-level error: its code and message are headers, not a payload.
        name = _exception_name(str(headers.get(":error-code", "internalServerException")))
        payload = orjson.dumps({"message": str(headers.get(":error-message", ""))})
    else:
        return None
    data = b'{"' + name.encode() + b'":' + payload + b"}"
    return b"event: " + name.encode() + b"\ndata: " + data + b"\n\n"


class ConverseResponse(ResponseWrapper):
    """The upstream's answer, its event stream read as SSE events.

    ``read()`` gives the body as it is (a whole Converse answer, or an
    error's JSON), the model called named in a 200 answer's ``modelId``.
    """

    def __init__(self, response: UpstreamResponse, model: str) -> None:
        super().__init__(response)
        self.model = model

    async def read(self) -> bytes:
        body = await self.response.read()
        if self.status == 200 and body.startswith(b"{") and not body[1:].lstrip().startswith(b"}"):
            body = b'{"modelId":' + orjson.dumps(self.model) + b"," + body[1:]
        return body

    def iter_chunks(self) -> AsyncIterator[bytes]:
        content_type = self.headers.get("Content-Type", "").split(";")[0].strip().lower()
        if content_type != EVENT_STREAM:
            return self.response.iter_chunks()
        return self._events()

    async def _events(self) -> AsyncIterator[bytes]:
        buffer = EventStreamBuffer()
        async for chunk in self.response.iter_chunks():
            buffer.add_data(chunk)
            out: list[bytes] = []
            try:
                for message in buffer:
                    event = message_event(message, self.model)
                    if event is not None:
                        out.append(event)
            except ParserError as exc:
                raise aiohttp.ClientPayloadError(
                    f"event stream frame does not decode: {type(exc).__name__}"
                ) from None
            if out:
                yield b"".join(out)
