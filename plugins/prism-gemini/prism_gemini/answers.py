"""Gemini answers as OpenAI chat completions and embeddings, whole or streamed."""

from __future__ import annotations

import base64
import os
import struct
from typing import Any

from prism_proxy import (
    ChatChunks,
    ChunkKind,
    StreamTranslatorBase,
    Usage,
    chat_completion,
    chat_tool_call,
)

from .translate import signed_id
from .wire import FILTERED, PROMPT_BLOCKED, finish_reason, parts_of

__all__ = ["GeminiToOpenAIStream", "embeddings_body", "gemini_to_openai_body"]

_TO_OPENAI_FINISH = {"STOP": "stop", "MAX_TOKENS": "length", PROMPT_BLOCKED: "content_filter"}
#: The mark the line puts on an embeddings answer whose caller asked for base64.
BASE64_MARK = "prismEncodingFormat"


def openai_finish(reason: str | None, called: bool) -> str:
    if reason in FILTERED:
        return "content_filter"
    if called and reason in (None, "STOP"):
        return "tool_calls"
    return _TO_OPENAI_FINISH.get(reason or "STOP", "stop")


def _read_parts(parts: list[Any]) -> tuple[list[str], list[dict[str, Any]]]:
    texts, calls = [], []
    for part in parts:
        if not isinstance(part, dict) or part.get("thought"):
            continue
        if isinstance(part.get("text"), str):
            texts.append(part["text"])
        call = part.get("functionCall")
        if isinstance(call, dict):
            call_id = signed_id(part.get("thoughtSignature"))
            calls.append(chat_tool_call(call_id, call.get("name"), call.get("args") or {}))
    return texts, calls


def _completion_id(payload: dict[str, Any]) -> str:
    response_id = payload.get("responseId")
    return "chatcmpl-" + (response_id if isinstance(response_id, str) else os.urandom(12).hex())


def gemini_to_openai_body(payload: dict[str, Any], usage: Usage | None) -> dict[str, Any]:
    candidates = payload.get("candidates") or [{}]
    texts, calls = _read_parts(parts_of(candidates[0]))
    return chat_completion(
        completion_id=_completion_id(payload),
        model=payload.get("modelVersion"),
        texts=texts,
        tool_calls=calls,
        finish_reason=openai_finish(finish_reason(payload), bool(calls)),
        usage=usage,
    )


class GeminiToOpenAIStream(StreamTranslatorBase):
    """Gemini stream chunks in, OpenAI chat chunks out."""

    def __init__(self, *, include_usage: bool) -> None:
        self.include_usage = include_usage
        self.chunks = ChatChunks("chatcmpl-" + os.urandom(12).hex())
        self.started = False
        self.calls = 0
        self.finished = False

    def _start(self, payload: dict[str, Any]) -> list[bytes]:
        self.started = True
        if isinstance(payload.get("responseId"), str):
            self.chunks.completion_id = "chatcmpl-" + payload["responseId"]
        self.chunks.model = payload.get("modelVersion")
        return [self.chunks.delta({"role": "assistant", "content": ""})]

    def convert(self, kind: ChunkKind, payload: Any) -> list[bytes]:
        if not isinstance(payload, dict) or kind is ChunkKind.USAGE:
            return []
        out = [] if self.started else self._start(payload)
        candidates = payload.get("candidates") or [{}]
        texts, calls = _read_parts(parts_of(candidates[0]))
        text = "".join(texts)
        if text:
            out.append(self.chunks.delta({"content": text}))
        for call in calls:
            out.append(self.chunks.delta({"tool_calls": [{"index": self.calls, **call}]}))
            self.calls += 1
        reason = finish_reason(payload)
        if reason is not None and not self.finished:
            self.finished = True
            out.append(self.chunks.delta({}, openai_finish(reason, self.calls > 0)))
        return out

    def finish(self, usage: Usage | None) -> list[bytes]:
        out = [] if self.started else self._start({})
        if not self.include_usage or usage is None:
            return out
        out.append(self.chunks.usage(usage))
        return out


def _base64(values: list[Any]) -> str:
    return base64.b64encode(struct.pack(f"<{len(values)}f", *values)).decode()


def embeddings_body(payload: dict[str, Any], usage: Usage | None) -> dict[str, Any]:
    """``embedContent``/``batchEmbedContents`` answers as an OpenAI embeddings list."""
    items = payload.get("embeddings")
    if items is None and "predictions" in payload:
        items = [prediction.get("embeddings") or {} for prediction in payload["predictions"]]
    if items is None:
        items = [payload.get("embedding") or {}]
    encode = payload.get(BASE64_MARK) == "base64"
    data = []
    for index, item in enumerate(items):
        values = item.get("values") or []
        data.append(
            {
                "object": "embedding",
                "index": index,
                "embedding": _base64(values) if encode else values,
            }
        )
    tokens = usage.input_tokens if usage is not None else 0
    return {
        "object": "list",
        "data": data,
        "model": payload.get("modelVersion"),
        "usage": {"prompt_tokens": tokens, "total_tokens": tokens},
    }
