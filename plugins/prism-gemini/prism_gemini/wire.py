"""Google's Gemini wire (``generateContent``): stream inspection, usage, errors.

Gemini's stream (``:streamGenerateContent?alt=sse``) is a run of
``GenerateContentResponse`` objects, one per ``data:`` event, and ends when
the connection does: there is no final event.  The last chunk carries the
``finishReason``; every chunk may carry ``usageMetadata`` (the last is whole).
"""

from __future__ import annotations

from typing import Any

import orjson

from prism_proxy import ChunkKind, Endpoint, Usage, Wire, estimated_usage, text_chars

__all__ = ["FILTERED", "GEMINI", "finish_reason", "parts_of", "usage_update"]

#: Finish (and prompt block) reasons that mean a safety system or content
#: filter cut or refused the answer.
FILTERED = frozenset(
    {
        "SAFETY",
        "RECITATION",
        "BLOCKLIST",
        "PROHIBITED_CONTENT",
        "SPII",
        "IMAGE_SAFETY",
        "IMAGE_PROHIBITED_CONTENT",
        "IMAGE_RECITATION",
    }
)
#: What a prompt refused for a reason outside FILTERED (``OTHER``…) finishes as.
PROMPT_BLOCKED = "PROMPT_BLOCKED"


def _count(value: Any) -> int | None:
    return value if type(value) is int and value >= 0 else None


def parts_of(candidate: Any) -> list[Any]:
    """A candidate's content parts (none when a filter removed the content)."""
    if not isinstance(candidate, dict):
        return []
    content = candidate.get("content")
    parts = content.get("parts") if isinstance(content, dict) else None
    return parts if isinstance(parts, list) else []


def _visible(part: Any) -> bool:
    """Whether a part is answer content (reasoning summaries are not)."""
    if not isinstance(part, dict) or part.get("thought"):
        return False
    return bool(part.get("text")) or any(
        key in part for key in ("functionCall", "inlineData", "executableCode", "fileData")
    )


def _block_reason(payload: dict[str, Any]) -> str | None:
    feedback = payload.get("promptFeedback")
    reason = feedback.get("blockReason") if isinstance(feedback, dict) else None
    if not isinstance(reason, str) or not reason:
        return None
    return reason[:32] if reason in FILTERED else PROMPT_BLOCKED


def event_kind(data: bytes) -> tuple[ChunkKind, Any]:
    """Classify one stream event's data."""
    try:
        payload = orjson.loads(data)
    except orjson.JSONDecodeError:
        return ChunkKind.INVALID, None
    if not isinstance(payload, dict) or "error" in payload:
        return ChunkKind.ERROR, payload
    candidates = payload.get("candidates")
    if candidates is None:
        if _block_reason(payload) is not None:
            return ChunkKind.CONTENT, payload
        return (ChunkKind.USAGE if "usageMetadata" in payload else ChunkKind.PRELUDE), payload
    if not isinstance(candidates, list):
        return ChunkKind.ERROR, payload
    for candidate in candidates:
        if not isinstance(candidate, dict):
            return ChunkKind.ERROR, payload
        if candidate.get("finishReason") or any(_visible(p) for p in parts_of(candidate)):
            return ChunkKind.CONTENT, payload
    return ChunkKind.PRELUDE, payload


def _reason(value: Any) -> str:
    return value[:32] if isinstance(value, str) and value else "OTHER"


def finish_reason(payload: Any) -> str | None:
    """Why the answer ended, as Gemini said (``STOP``, ``MAX_TOKENS``, ``SAFETY``…)."""
    if not isinstance(payload, dict):
        return None
    for candidate in payload.get("candidates") or ():
        if isinstance(candidate, dict) and candidate.get("finishReason"):
            return _reason(candidate["finishReason"])
    return _block_reason(payload)


def _part_chars(part: Any) -> int:
    if not isinstance(part, dict):
        return 0
    chars = 0
    text = part.get("text")
    if isinstance(text, str):
        chars += len(text)
    call = part.get("functionCall")
    if isinstance(call, dict):
        chars += len(orjson.dumps(call.get("args") or {}))
    return chars


def digest(payload: Any) -> tuple[int, str | None]:
    chars = sum(_part_chars(p) for c in payload.get("candidates") or () for p in parts_of(c))
    return chars, finish_reason(payload)


def answer_chars(payload: Any) -> int:
    return digest(payload)[0]


def answer_problem(endpoint: Endpoint, payload: Any) -> str | None:
    """Why a 200 body is not a Gemini answer of ``endpoint`` (None: it is, or an error)."""
    if not isinstance(payload, dict):
        return "200 without a JSON answer"
    if "error" in payload:
        return None
    if endpoint is Endpoint.EMBEDDINGS:
        items = payload.get("embeddings")
        if items is None and "embedding" in payload:
            items = [payload["embedding"]]
        if items is None and isinstance(payload.get("predictions"), list):
            items = [
                p.get("embeddings") if isinstance(p, dict) else None for p in payload["predictions"]
            ]
        if not isinstance(items, list) or not items:
            return "embeddings answer without embeddings"
        for item in items:
            if not isinstance(item, dict) or not isinstance(item.get("values"), list):
                return "embeddings answer with an item that has no values"
        return None
    candidates = payload.get("candidates")
    if candidates is None:
        return None if _block_reason(payload) else "answer without candidates"
    if not isinstance(candidates, list) or not candidates:
        return "answer without candidates"
    for candidate in candidates:
        if not isinstance(candidate, dict):
            return "answer with a candidate that is not an object"
        content = candidate.get("content")
        if content is not None and not isinstance(content, dict):
            return "answer with a candidate whose content is not an object"
        parts = content.get("parts") if isinstance(content, dict) else None
        if parts is not None and not (
            isinstance(parts, list) and all(isinstance(p, dict) for p in parts)
        ):
            return "answer with parts that are not objects"
    return None


def usage_update(previous: Usage | None, payload: Any) -> Usage | None:
    """``usageMetadata`` of a whole answer or a stream chunk (each chunk's is whole so far).

    ``promptTokenCount`` counts the cached part too (``cachedContentTokenCount``);
    ``candidatesTokenCount`` leaves out the thinking (``thoughtsTokenCount``),
    which is billed as output: Prism's output counts both.
    """
    if not isinstance(payload, dict):
        return previous
    meta = payload.get("usageMetadata")
    if not isinstance(meta, dict):
        return _prediction_usage(payload, previous)
    keys = (
        "promptTokenCount",
        "candidatesTokenCount",
        "cachedContentTokenCount",
        "thoughtsTokenCount",
        "toolUsePromptTokenCount",
    )
    counts = {key: _count(meta[key]) for key in keys if meta.get(key) is not None}
    if None in counts.values():
        return Usage(suspect=True)
    thoughts = counts.get("thoughtsTokenCount", 0) or 0
    return Usage(
        input_tokens=(counts.get("promptTokenCount") or 0)
        + (counts.get("toolUsePromptTokenCount") or 0),
        output_tokens=(counts.get("candidatesTokenCount") or 0) + thoughts,
        cached_input_tokens=counts.get("cachedContentTokenCount") or 0,
        reasoning_tokens=thoughts,
    )


def _prediction_usage(payload: dict[str, Any], previous: Usage | None) -> Usage | None:
    """Vertex ``:predict`` embeddings: each prediction counts its text's tokens."""
    predictions = payload.get("predictions")
    if not isinstance(predictions, list):
        return previous
    total = 0
    for prediction in predictions:
        embeddings = prediction.get("embeddings") if isinstance(prediction, dict) else None
        stats = embeddings.get("statistics") if isinstance(embeddings, dict) else None
        count = _count(stats.get("token_count")) if isinstance(stats, dict) else None
        if count is None:
            return Usage(suspect=True)
        total += count
    return Usage(input_tokens=total)


def estimate_usage(body: dict[str, Any], delivered_chars: int) -> Usage:
    """Usage of a cut stream that never reported it, from the prompt's text."""
    system = body.get("systemInstruction")
    contents = [system] if isinstance(system, dict) else []
    contents.extend(c for c in body.get("contents") or () if isinstance(c, dict))
    chars = sum(text_chars(content.get("parts") or ()) for content in contents)
    return estimated_usage(chars, delivered_chars)


#: No caller speaks Gemini's wire: it needs none of a caller's parts (error bodies,
#: the final event, the degraded answer); every stream is translated.
GEMINI = Wire.upstream(
    "gemini",
    inspect=event_kind,
    usage_update=usage_update,
    digest=digest,
    estimate_usage=estimate_usage,
    answer_problem=answer_problem,
    answer_chars=answer_chars,
    finish_reason=finish_reason,
    filtered=FILTERED,
)
