"""What a relay needs to know about one stream event, whatever the wire format."""

from __future__ import annotations

import enum

__all__ = ["ChunkKind"]


class ChunkKind(enum.Enum):
    PRELUDE = 0  # before the answer: role chunk, message_start, an empty text block, ping
    CONTENT = 1  # carries content, a tool call, a refusal or a finish/stop reason
    USAGE = 2  # a usage-only event (OpenAI's trailing chunk with choices == [])
    ERROR = 3  # an error event
    DONE = 4  # the end: OpenAI's [DONE], Anthropic's message_stop
    INVALID = 5  # data that is not JSON (or not UTF-8): never relayed as it is
