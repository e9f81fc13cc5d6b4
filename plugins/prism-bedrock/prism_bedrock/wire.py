"""The Bedrock Converse wire as the core reads it: each stream event a one-key JSON object.

The provider presents every decoded event-stream message as an SSE event
whose data is ``{"<event type>": <payload>}`` (``{"contentBlockDelta":
{...}}``); exception frames become ``{"<exceptionType>": {"message": ...}}``,
whose key ends in ``Exception``. A whole Converse answer is
``{"output": {"message": ...}, "stopReason": ..., "usage": ...}``.
"""

from __future__ import annotations

from typing import Any

import orjson

from prism_proxy import ChunkKind, Endpoint, Usage, Wire, estimated_usage, text_chars

__all__ = ["BEDROCK", "FILTERED", "usage_of"]

#: Stop reasons that mean a guardrail or content filter cut the answer.
FILTERED = frozenset({"guardrail_intervened", "content_filtered"})
_PRELUDE_EVENTS = frozenset({"messageStart", "contentBlockStop"})


def event_name(payload: Any) -> tuple[str, Any] | None:
    """The (type, payload) of a one-key event object, else None."""
    if isinstance(payload, dict) and len(payload) == 1:
        ((name, inner),) = payload.items()
        return name, inner
    return None


def inspect(data: bytes) -> tuple[ChunkKind, Any]:
    try:
        payload = orjson.loads(data)
    except orjson.JSONDecodeError:
        return ChunkKind.INVALID, None
    named = event_name(payload)
    if named is None or not isinstance(named[1], dict):
        return ChunkKind.ERROR, payload
    name, inner = named
    if name == "contentBlockDelta":
        delta = inner.get("delta")
        if isinstance(delta, dict) and set(delta) <= {"text"} and not delta.get("text"):
            return ChunkKind.PRELUDE, payload
        return ChunkKind.CONTENT, payload
    if name == "contentBlockStart":
        start = inner.get("start")
        # A tool call's start already carries content: the tool's name.
        has_tool = isinstance(start, dict) and isinstance(start.get("toolUse"), dict)
        return (ChunkKind.CONTENT if has_tool else ChunkKind.PRELUDE), payload
    if name == "messageStop":
        return ChunkKind.CONTENT, payload
    if name == "metadata":
        return ChunkKind.USAGE, payload
    if name.endswith("Exception"):
        return ChunkKind.ERROR, payload
    # messageStart, contentBlockStop, and events a newer API may add.
    return ChunkKind.PRELUDE, payload


def _delta_chars(delta: Any) -> int:
    if not isinstance(delta, dict):
        return 0
    text = delta.get("text")
    if isinstance(text, str):
        return len(text)
    tool = delta.get("toolUse")
    if isinstance(tool, dict) and isinstance(tool.get("input"), str):
        return len(tool["input"])
    reasoning = delta.get("reasoningContent")
    if isinstance(reasoning, dict) and isinstance(reasoning.get("text"), str):
        return len(reasoning["text"])
    return 0


def _reason(value: Any) -> str:
    return value[:32] if isinstance(value, str) and value else "other"


def digest(payload: Any) -> tuple[int, str | None]:
    named = event_name(payload)
    if named is None or not isinstance(named[1], dict):
        return 0, None
    name, inner = named
    if name == "contentBlockDelta":
        return _delta_chars(inner.get("delta")), None
    if name == "messageStop":
        return 0, _reason(inner.get("stopReason"))
    return 0, None


def finish_reason(payload: Any) -> str | None:
    if isinstance(payload, dict) and payload.get("stopReason"):
        return _reason(payload["stopReason"])
    return None


def _count(value: Any) -> int | None:
    return value if type(value) is int and value >= 0 else None


def usage_of(report: Any, previous: Usage | None = None) -> Usage | None:
    """A Converse ``usage`` object as Prism's usage (every prompt token in ``input_tokens``).

    Bedrock's ``inputTokens`` leaves out the tokens read from and written to
    the prompt cache, which it reports beside it.
    """
    if not isinstance(report, dict):
        return previous
    counts = {}
    for key in ("inputTokens", "outputTokens", "cacheReadInputTokens", "cacheWriteInputTokens"):
        if report.get(key) is not None:
            counts[key] = _count(report[key])
    if None in counts.values():
        return Usage(suspect=True)
    read = counts.get("cacheReadInputTokens") or 0
    written = counts.get("cacheWriteInputTokens") or 0
    return Usage(
        input_tokens=(counts.get("inputTokens") or 0) + read + written,
        output_tokens=counts.get("outputTokens") or 0,
        cached_input_tokens=read,
        cache_creation_tokens=written,
    )


def usage_update(previous: Usage | None, payload: Any) -> Usage | None:
    """Usage from a whole answer or a stream's ``metadata`` event."""
    if not isinstance(payload, dict):
        return previous
    if "usage" in payload:
        return usage_of(payload.get("usage"), previous)
    metadata = payload.get("metadata")
    if isinstance(metadata, dict) and len(payload) == 1:
        return usage_of(metadata.get("usage"), previous)
    return previous


def answer_problem(endpoint: Endpoint, payload: Any) -> str | None:
    if not isinstance(payload, dict):
        return "200 without a JSON answer"
    output = payload.get("output")
    message = output.get("message") if isinstance(output, dict) else None
    if not isinstance(message, dict):
        return "Converse answer without output.message"
    content = message.get("content")
    if not isinstance(content, list) or not all(isinstance(block, dict) for block in content):
        return "Converse message whose content is not a list of blocks"
    return None


def answer_chars(payload: Any) -> int:
    total = 0
    for block in payload["output"]["message"]["content"]:
        if isinstance(block.get("text"), str):
            total += len(block["text"])
        tool = block.get("toolUse")
        if isinstance(tool, dict):
            total += len(orjson.dumps(tool.get("input")))
    return total


def estimate_usage(body: dict[str, Any], delivered_chars: int) -> Usage:
    """Usage of a cut stream that never reported it, from the prompt's text."""
    messages = [m for m in body.get("messages") or () if isinstance(m, dict)]
    chars = text_chars(body.get("system") or ()) + sum(
        text_chars(message.get("content") or ()) for message in messages
    )
    return estimated_usage(chars, delivered_chars)


#: No caller speaks Bedrock's wire: it needs none of a caller's parts (error bodies,
#: the final event, the degraded answer); every stream is translated, nothing
#: forwarded unparsed.
BEDROCK = Wire.upstream(
    "bedrock",
    inspect=inspect,
    usage_update=usage_update,
    digest=digest,
    estimate_usage=estimate_usage,
    answer_problem=answer_problem,
    answer_chars=answer_chars,
    finish_reason=finish_reason,
    filtered=FILTERED,
)
