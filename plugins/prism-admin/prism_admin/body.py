"""Request bodies and query strings: shapes checked before anything is asked of a service.

Unknown members are refused (a misspelt field must not be ignored), and
every refusal is a 400 ``invalid_request`` whose ``param`` names the field.
"""

from __future__ import annotations

from collections.abc import Collection, Mapping
from typing import Any

import orjson
from aiohttp import web

from prism_proxy import PrismError

__all__ = ["bad", "json_body", "query_int", "reject_unknown"]

_MAX_BODY = 64 * 1024


def bad(field: str, message: str) -> PrismError:
    return PrismError(400, "invalid_request", message, param=field)


def reject_unknown(given: Collection[str], known: Collection[str], where: str = "") -> None:
    for name in given:
        if name not in known:
            field = f"{where}{name}"
            raise bad(field, f"unknown field {field!r} (known: {', '.join(sorted(known))})")


async def json_body(
    request: web.Request, known: Collection[str], required: Collection[str] = ()
) -> dict[str, Any]:
    """The body as a JSON object with only ``known`` members and every ``required`` one."""
    raw = await request.content.read(_MAX_BODY + 1)
    if len(raw) > _MAX_BODY:
        raise PrismError(413, "request_too_large", f"the body exceeds {_MAX_BODY} bytes")
    try:
        body = orjson.loads(raw or b"{}")
    except orjson.JSONDecodeError:
        raise bad("body", "the body is not JSON") from None
    if not isinstance(body, dict):
        raise bad("body", "the body must be a JSON object")
    reject_unknown(body, known)
    for name in required:
        if name not in body:
            raise bad(name, f"{name}: required")
    return body


def query_int(
    query: Mapping[str, str], name: str, default: int | None, *, low: int, high: int
) -> int | None:
    text = query.get(name)
    if text is None:
        return default
    try:
        value = int(text)
    except ValueError:
        raise bad(name, f"{name}: expected a whole number, got {text!r}") from None
    if not low <= value <= high:
        raise bad(name, f"{name}: expected {low} to {high}, got {value}")
    return value
