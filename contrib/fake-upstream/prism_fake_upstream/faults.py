"""What a scenario does to one request: the Fault description and its parsers."""

from __future__ import annotations

import re
from collections.abc import Mapping
from typing import Any

import attrs

__all__ = ["Fault", "fault_for_scenario_name", "fault_from_json", "trickle_fault", "trickle_text"]

# Long enough that no sane client timeout outlasts it, short enough that a
# forgotten standalone process still frees its sockets within the hour.
LONG_DELAY_S = 3600.0
SLOW_TOKEN_DELAY_S = 0.05
# ``trickle``: a slow model's long answer, one token every 500 ms for 30 s.
TRICKLE_TOKENS = 60
TRICKLE_INTERVAL_MS = 500

_ERR_NAME = re.compile(r"err([1-5][0-9][0-9])")
_DIE_NAME = re.compile(r"die([0-9]+)")
_TRICKLE_NAME = re.compile(r"trickle(?:([0-9]+)x([0-9]+))?")
_CTX_NAME = re.compile(r"ctx([0-9]+)")

FaultBody = bytes | dict[str, Any] | None


def _to_body(value: bytes | str | Mapping[str, Any] | None) -> FaultBody:
    # A str is accepted because the control API can only carry text.
    if value is None or isinstance(value, bytes):
        return value
    if isinstance(value, str):
        return value.encode()
    return dict(value)


def _to_headers(value: Mapping[str, str]) -> Mapping[str, str]:
    # Copy so a caller mutating its dict later cannot change a scripted Fault.
    return dict(value)


def _to_usage(value: Mapping[str, Any] | None) -> dict[str, Any] | None:
    # Copied for the same reason as headers.
    return None if value is None else dict(value)


def _to_event(value: bytes | str | None) -> bytes | None:
    # A str is accepted because the control API can only carry text.
    return value.encode() if isinstance(value, str) else value


def _non_negative(_inst: object, attr: attrs.Attribute[Any], value: float | None) -> None:
    if value is not None and value < 0:
        raise ValueError(f"{attr.name} must be >= 0, got {value!r}")


def _http_status(_inst: object, _attr: attrs.Attribute[Any], value: int) -> None:
    if not 100 <= value <= 599:
        raise ValueError(f"status must be an HTTP status code, got {value!r}")


@attrs.frozen
class Fault:
    """How to answer one request; the default answers normally."""

    status: int = attrs.field(default=200, validator=_http_status)
    body: FaultBody = attrs.field(default=None, converter=_to_body)
    headers: Mapping[str, str] = attrs.field(factory=dict, converter=_to_headers)
    stall_s: float = attrs.field(default=0.0, validator=_non_negative)
    first_token_delay_s: float = attrs.field(default=0.0, validator=_non_negative)
    token_delay_s: float = attrs.field(default=0.0, validator=_non_negative)
    #: After a stream's final event, the body's end comes this much later (servers
    #: that flush each event do this); the final event is flushed first.
    end_delay_s: float = attrs.field(default=0.0, validator=_non_negative)
    die_after_chunks: int | None = attrs.field(default=None, validator=_non_negative)
    empty_length: bool = False
    text: str | None = None
    stream_error: dict[str, Any] | None = None
    #: Lies about usage. Merged (shallowly, values sent verbatim, nothing
    #: recomputed: total_tokens stays honest unless overridden too) over the
    #: usage of the OpenAI completion, streamed usage chunk and embeddings, and
    #: of the Anthropic message. An Anthropic stream has two partial usages:
    #: message_start's gets the keys it already carries, message_delta's gets
    #: output_tokens and every key message_start does not carry.
    usage: dict[str, Any] | None = attrs.field(default=None, converter=_to_usage)
    #: One malformed SSE event, ``data: <bad_event>\n\n`` verbatim (no
    #: ``event:`` line on either wire), sent in a stream after ``bad_event_at``
    #: content pieces (0: before the first; past the last piece: right after
    #: it, so a test need not count pieces); the stream then goes on normally.
    #: Not sent when die_after_chunks/stream_error end the stream before that
    #: point; a non-streamed answer ignores it. Bytes, not text, so it can be
    #: invalid UTF-8 as well as invalid JSON.
    bad_event: bytes | None = attrs.field(default=None, converter=_to_event)
    bad_event_at: int = attrs.field(default=0, validator=_non_negative)
    #: Anthropic only: the answer opens with a signed ``thinking`` block of this
    #: text (streamed as ``thinking_delta`` pieces, then a ``signature_delta``);
    #: its word tokens count in ``output_tokens``. ``""`` is a block whose
    #: thinking is omitted (only the signature), as ``display: "omitted"`` gives.
    thinking: str | None = None
    #: Anthropic only: a ``redacted_thinking`` block with this opaque ``data``
    #: first of all (whole in its ``content_block_start``, as the API streams
    #: it). It adds nothing to ``output_tokens``: the fake cannot know what the
    #: encrypted reasoning cost; a test says so with ``usage``.
    redacted_thinking: str | None = None
    #: A model with a context window this many tokens long: a chat completion or
    #: message whose prompt (counted in words, as its usage counts it) is longer is
    #: refused as the real APIs refuse it (400; OpenAI ``context_length_exceeded``,
    #: Anthropic ``prompt is too long: N tokens > M maximum``).
    context_limit: int | None = attrs.field(default=None, validator=_non_negative)

    def to_json(self) -> dict[str, Any]:
        """The control-API form of this Fault (inverse of fault_from_json)."""
        out: dict[str, Any] = {}
        for field in attrs.fields(Fault):
            value = getattr(self, field.name)
            if value == field.default or (field.name == "headers" and not value):
                continue
            if field.name == "body" and isinstance(value, bytes):
                value = value.decode()
            elif field.name == "bad_event":
                try:
                    value = value.decode()
                except UnicodeDecodeError:
                    raise ValueError(
                        "bad_event is not valid UTF-8; the control API carries it as text"
                    ) from None
            elif field.name in ("headers", "usage"):
                value = dict(value)
            out[field.name] = value
        return out


def fault_for_scenario_name(name: str) -> Fault:
    """Parse a scenario name; names that mean nothing special behave like ``ok``."""
    if name == "stall":
        return Fault(stall_s=LONG_DELAY_S)
    if name == "slowfirst":
        return Fault(first_token_delay_s=LONG_DELAY_S)
    if name == "slow":
        return Fault(token_delay_s=SLOW_TOKEN_DELAY_S)
    if name == "empty":
        return Fault(empty_length=True)
    if m := _ERR_NAME.fullmatch(name):
        return Fault(status=int(m.group(1)))
    if m := _DIE_NAME.fullmatch(name):
        return Fault(die_after_chunks=int(m.group(1)))
    if m := _CTX_NAME.fullmatch(name):
        return Fault(context_limit=int(m.group(1)))
    if m := _TRICKLE_NAME.fullmatch(name):
        tokens, interval_ms = (
            (int(m.group(1)), int(m.group(2)))
            if m.group(1) is not None
            else (TRICKLE_TOKENS, TRICKLE_INTERVAL_MS)
        )
        return trickle_fault(tokens, interval_ms / 1000)
    return Fault()


def trickle_text(tokens: int) -> str:
    """``tok1 tok2 … tokN``: an answer of exactly ``tokens`` word tokens."""
    return " ".join(f"tok{i}" for i in range(1, tokens + 1))


def trickle_fault(tokens: int, interval_s: float) -> Fault:
    """``tokens`` tokens, the first ``interval_s`` after the headers, then one every ``interval_s``.

    The last token (with the finish, and ``[DONE]`` / ``message_stop``) comes
    ``tokens * interval_s`` after the headers.
    """
    return Fault(
        first_token_delay_s=interval_s, token_delay_s=interval_s, text=trickle_text(tokens)
    )


def _is_number(value: object) -> bool:
    return isinstance(value, int | float) and not isinstance(value, bool)


def fault_from_json(obj: object) -> Fault:
    """Build a Fault from its control-API JSON form; raises ValueError on bad input."""
    if not isinstance(obj, dict):
        raise ValueError("each fault must be a JSON object")
    known = {f.name for f in attrs.fields(Fault)}
    unknown = set(obj) - known
    if unknown:
        raise ValueError(f"unknown fault fields: {sorted(unknown)}")
    for key in ("stall_s", "first_token_delay_s", "token_delay_s", "end_delay_s"):
        if key in obj and not _is_number(obj[key]):
            raise ValueError(f"{key} must be a number")
    for key in ("status", "die_after_chunks", "bad_event_at", "context_limit"):
        value = obj.get(key)
        if value is not None and (not isinstance(value, int) or isinstance(value, bool)):
            raise ValueError(f"{key} must be an integer")
    for key in ("status", "bad_event_at"):
        if key in obj and obj[key] is None:
            raise ValueError(f"{key} must be an integer")
    if "empty_length" in obj and not isinstance(obj["empty_length"], bool):
        raise ValueError("empty_length must be a boolean")
    for key in ("text", "thinking", "redacted_thinking"):
        if obj.get(key) is not None and not isinstance(obj[key], str):
            raise ValueError(f"{key} must be a string")
    if obj.get("body") is not None and not isinstance(obj["body"], str | dict):
        raise ValueError("body must be a JSON object or a string")
    for key in ("stream_error", "usage"):
        if obj.get(key) is not None and not isinstance(obj[key], dict):
            raise ValueError(f"{key} must be a JSON object")
    if obj.get("bad_event") is not None and not isinstance(obj["bad_event"], str):
        raise ValueError("bad_event must be a string")
    headers = obj.get("headers", {})
    if not isinstance(headers, dict) or not all(
        isinstance(k, str) and isinstance(v, str) for k, v in headers.items()
    ):
        raise ValueError("headers must be an object of strings")
    return Fault(**obj)
