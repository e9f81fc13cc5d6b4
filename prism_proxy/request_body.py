"""Reading an API request's JSON body: bounded in size and in how long it may stall."""

from __future__ import annotations

import asyncio
from typing import Any

import orjson
from aiohttp import web

from .errors import PrismError
from .wire.shape import check_depth

__all__ = ["read_json"]


async def read_json(request: web.Request, limit: int, stall_s: float) -> dict[str, Any]:
    kind = request.headers.get("Content-Type")
    if kind is not None and not _is_json(kind):
        raise PrismError(
            415,
            "unsupported_media_type",
            "the request body must be JSON (Content-Type: application/json)",
            param="Content-Type",
        )
    length = request.content_length
    if length is not None and length > limit:
        raise _too_large(limit)
    raw = await _read_body(request, limit, stall_s)
    if length is not None and len(raw) < length:
        raise PrismError(400, "invalid_json", "the request body is shorter than its Content-Length")
    try:
        body = orjson.loads(raw)
    except orjson.JSONDecodeError:
        raise PrismError(400, "invalid_json", "the request body is not valid JSON") from None
    if not isinstance(body, dict):
        raise PrismError(400, "invalid_json", "the request body must be a JSON object")
    check_depth(body, raw)
    return body


def _is_json(content_type: str) -> bool:
    media = content_type.partition(";")[0].strip().lower()
    return media == "application/json" or (
        media.startswith("application/") and media.endswith("+json")
    )


async def _read_body(request: web.Request, limit: int, stall_s: float) -> bytes:
    """The whole body, counted against ``limit`` as it arrives.

    What has arrived is taken without waiting (usually the whole body); a
    body that then pauses longer than ``stall_s`` between reads is answered
    408 rather than holding the connection open.
    """
    content = request.content
    chunks = []
    size = 0
    while True:
        chunk = content.read_nowait()
        if not chunk:
            if content.at_eof():
                break
            try:
                async with asyncio.timeout(stall_s):
                    chunk = await content.readany()
            except TimeoutError:
                raise PrismError(
                    408,
                    "request_timeout",
                    f"the request body stalled for more than {stall_s:g} s",
                    param="body",
                ) from None
            if not chunk:
                break
        size += len(chunk)
        if size > limit:
            raise _too_large(limit)
        chunks.append(chunk)
    return chunks[0] if len(chunks) == 1 else b"".join(chunks)


def _too_large(limit: int) -> PrismError:
    return PrismError(
        413, "body_too_large", f"the request body exceeds the limit of {limit} bytes", param="body"
    )
