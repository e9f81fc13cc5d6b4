"""Structured outputs a line answers through a forced tool: held whole, checked, then served.

``response_format`` goes to an Anthropic line as a forced tool whose input is
the answer (``wire.translate_request``).  Its answer is rewritten into the
message a line with structured outputs would give, its text the JSON, and
checked against the caller's schema first (``wire.translate_response``): one
that is not JSON or does not match is a failed attempt (the chain goes on),
never served.  A stream is therefore read whole before it is relayed.
"""

from __future__ import annotations

from typing import Any

import aiohttp
import orjson

from .call import UpstreamResult
from .provider_plugins import HeldResponse
from .providers import UpstreamResponse
from .wire.translate_response import structured_events, structured_message

__all__ = ["hold", "structured"]

#: The most a held structured stream may hold (it is read whole before it is served).
_HOLD_LIMIT = 32 * 1024 * 1024


async def hold(
    response: UpstreamResponse, schema: dict[str, Any]
) -> tuple[HeldResponse, str | None]:
    """Read a structured answer's stream whole: it may be served only once it matches.

    Returns the stream to serve (its answer tool made text) or, with why it
    cannot be served, what arrived.  Read within the attempt's timeout.
    """
    chunks: list[bytes] = []
    size = 0
    try:
        async for chunk in response.iter_chunks():
            size += len(chunk)
            if size > _HOLD_LIMIT:
                response.close()
                return HeldResponse(
                    200, response.headers, b""
                ), "structured answer too large to check"
            chunks.append(chunk)
    except (aiohttp.ClientError, OSError):
        response.close()
        return HeldResponse(
            200, response.headers, b""
        ), "the stream broke before its structured answer"
    response.release()
    data, problem = structured_events(b"".join(chunks), schema)
    return HeldResponse(200, response.headers, data), problem


def structured(result: UpstreamResult, schema: dict[str, Any]) -> UpstreamResult:
    """A whole Messages answer with its structured output as text, or marked malformed."""
    payload = result.json
    if not isinstance(payload, dict) or payload.get("type") != "message":
        return result  # an error in a 200: the classifier reads it
    rewritten, problem = structured_message(payload, schema)
    if problem is not None:
        result.malformed = problem
        return result
    if rewritten is payload:
        return result
    out = UpstreamResult(200, result.headers, orjson.dumps(rewritten), wire=result.wire)
    out.json = rewritten
    return out
