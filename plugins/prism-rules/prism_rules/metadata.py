"""Request metadata: the body's ``metadata`` object merged over the ``x-prism-metadata`` header.

Both must be JSON objects whose values are strings, numbers, true/false or
null.  The header is at most 4096 bytes; the merged result at most 32 values
and 4096 bytes of JSON.  Anything else is a 400 naming the header or field.
Metadata is data to compare against and nothing more.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from typing import Any

import orjson

from prism_proxy import PrismError

from .conditions import Primitive

__all__ = ["HEADER", "MAX_BYTES", "MAX_VALUES", "read_metadata"]

HEADER = "x-prism-metadata"
BODY_FIELD = "metadata"
MAX_BYTES = 4096
MAX_VALUES = 32


def read_metadata(header_values: Sequence[str], body_value: Any) -> dict[str, Primitive]:
    """The call's metadata; raises ``PrismError(400, ...)`` on anything out of bounds."""
    merged: dict[str, Primitive] = {}
    if header_values:
        merged.update(_from_header(header_values))
    if body_value is not None:
        merged.update(_checked(body_value, BODY_FIELD, f"'{BODY_FIELD}'"))
    if not merged:
        return merged
    if len(merged) > MAX_VALUES:
        raise _bad(
            "metadata_too_many_values",
            f"metadata has {len(merged)} values (body '{BODY_FIELD}' merged over {HEADER}); "
            f"the limit is {MAX_VALUES}",
            BODY_FIELD if body_value else HEADER,
        )
    size = len(orjson.dumps(merged))
    if size > MAX_BYTES:
        raise _bad(
            "metadata_too_large",
            f"metadata is {size} bytes of JSON (body '{BODY_FIELD}' merged over {HEADER}); "
            f"the limit is {MAX_BYTES}",
            BODY_FIELD if body_value else HEADER,
        )
    return merged


def _from_header(values: Sequence[str]) -> dict[str, Primitive]:
    if len(values) > 1:
        raise _bad("metadata_not_object", f"send {HEADER} once, as one JSON object", HEADER)
    raw = values[0].encode("utf-8", "surrogateescape")
    if len(raw) > MAX_BYTES:
        raise _bad(
            "metadata_too_large",
            f"{HEADER} is {len(raw)} bytes; the limit is {MAX_BYTES}",
            HEADER,
        )
    try:
        parsed = orjson.loads(raw)
    except orjson.JSONDecodeError:
        raise _bad("metadata_invalid_json", f"{HEADER} is not valid JSON", HEADER) from None
    return _checked(parsed, HEADER, HEADER)


def _checked(value: Any, param: str, name: str) -> dict[str, Primitive]:
    if not isinstance(value, Mapping):
        raise _bad(
            "metadata_not_object",
            f"{name} must be a JSON object of strings, numbers, booleans or null",
            param,
        )
    if len(value) > MAX_VALUES:
        raise _bad(
            "metadata_too_many_values",
            f"{name} has {len(value)} values; the limit is {MAX_VALUES}",
            param,
        )
    for key, item in value.items():
        if not _primitive(item):
            raise _bad(
                "metadata_invalid_value",
                f"{name}: the value of {_short(key)!r} must be a string, number, boolean or "
                "null (no objects or arrays)",
                param,
            )
    return dict(value)


def _primitive(item: Any) -> bool:
    if isinstance(item, float):
        return math.isfinite(item)
    return item is None or isinstance(item, (str, int, bool))


def _short(key: str) -> str:
    return key if len(key) <= 40 else key[:37] + "..."


def _bad(code: str, message: str, param: str) -> PrismError:
    return PrismError(400, code, message, param=param)
