"""Answers in the Responses API's shape: whole Response objects and typed stream events.

A whole answer is translated from the chat completion (an Anthropic message
is made one first, by the chat translation).  A stream is translated event
by event by a :class:`ResponsesStream`: the chat chunks of an OpenAI line
(:class:`ChatToResponsesStream`) or the Messages events of an Anthropic one
(:class:`AnthropicToResponsesStream`) become ``response.created``,
``response.in_progress``, ``response.output_item.added`` … and
``response.completed`` (``response.incomplete`` when cut), each numbered
(``sequence_number``), as the openai SDK reads them.

A native line's stream (:class:`NativeResponsesStream`) is passed on event
by event, only the Response's id made the gateway's own.  Every Response
repeats the request's parameters (``responses.repeated``), put over it by
``prism_proxy.compat.Prepared`` (:meth:`ResponsesStream.repeat` for streams).
"""

from __future__ import annotations

import os
import time
from collections.abc import Mapping
from typing import Any

import orjson

from ..call import Usage
from ..errors import PrismError
from .events import ChunkKind
from .responses import error_payload, repeated
from .translate_response import StreamTranslatorBase, anthropic_to_openai_body

__all__ = [
    "AnthropicToResponsesStream",
    "ChatToResponsesStream",
    "NativeResponsesStream",
    "ResponsesStream",
    "anthropic_to_response_body",
    "chat_to_response_body",
    "degraded_body",
    "degraded_events",
    "native_body",
]

_USAGE_KIND = ChunkKind.USAGE
#: Chat finish reasons that leave a response incomplete, and the reason it gives.
_INCOMPLETE = {"length": "max_output_tokens", "content_filter": "content_filter"}
_ANTHROPIC_FINISH = {"max_tokens": "length", "refusal": "content_filter"}


def _usage(usage: Usage | None) -> dict[str, Any] | None:
    if usage is None:
        return None
    return {
        "input_tokens": usage.input_tokens,
        "input_tokens_details": {
            "cached_tokens": usage.cached_input_tokens,
            "cache_write_tokens": usage.cache_creation_tokens,
        },
        "output_tokens": usage.output_tokens,
        "output_tokens_details": {"reasoning_tokens": usage.reasoning_tokens},
        "total_tokens": usage.input_tokens + usage.output_tokens,
    }


def _suffix(upstream_id: Any) -> str:
    """A new id for the answer: Prism's own, never the upstream's.

    A response may be stored under its id (``previous_response_id``): ids of
    answers from different lines, or a line that reuses its ids, must never
    collide.
    """
    return os.urandom(12).hex()


def _response(
    suffix: str,
    model: Any,
    created_at: int,
    output: list[dict[str, Any]],
    status: str,
    usage: Usage | None,
    finish: str | None = None,
) -> dict[str, Any]:
    incomplete = _INCOMPLETE.get(finish or "") if status != "failed" else None
    if incomplete is not None and status == "completed":
        status = "incomplete"
    return {
        "id": "resp_" + suffix,
        "object": "response",
        "created_at": created_at,
        "status": status,
        "model": model,
        "output": output,
        "error": None,
        "incomplete_details": {"reason": incomplete} if status == "incomplete" else None,
        # The defaults; a call's own parameters are put over them (``Prepared.echo``).
        **repeated({}),
        "usage": _usage(usage),
    }


def _text_part(text: str) -> dict[str, Any]:
    return {"type": "output_text", "text": text, "annotations": [], "logprobs": []}


def chat_to_response_body(payload: dict[str, Any], usage: Usage | None) -> dict[str, Any]:
    """A whole chat completion as a Response object."""
    choice = (payload.get("choices") or [{}])[0]
    message = choice.get("message") or {}
    finish = choice.get("finish_reason")
    suffix = _suffix(payload.get("id"))
    item_status = "incomplete" if finish in _INCOMPLETE else "completed"
    output: list[dict[str, Any]] = []
    calls = message.get("tool_calls") or ()
    content: list[dict[str, Any]] = []
    if message.get("content"):
        content.append(_text_part(message["content"]))
    if message.get("refusal"):
        content.append({"type": "refusal", "refusal": message["refusal"]})
    if content or not calls:
        output.append(
            {
                "id": "msg_" + suffix,
                "type": "message",
                "status": item_status,
                "role": "assistant",
                "content": content,
            }
        )
    for call in calls:
        function = call.get("function") or {}
        output.append(
            {
                "id": f"fc_{call.get('id')}",
                "type": "function_call",
                "status": "completed",
                "call_id": call.get("id"),
                "name": function.get("name"),
                "arguments": function.get("arguments") or "",
            }
        )
    created = payload.get("created")
    return _response(
        suffix,
        payload.get("model"),
        created if isinstance(created, int) else int(time.time()),
        output,
        "completed",
        usage,
        finish,
    )


def anthropic_to_response_body(payload: dict[str, Any], usage: Usage | None) -> dict[str, Any]:
    """A whole Anthropic message as a Response object (by way of the chat translation)."""
    return chat_to_response_body(anthropic_to_openai_body(payload, usage), usage)


def _event(payload: dict[str, Any]) -> bytes:
    return (
        b"event: " + str(payload["type"]).encode() + b"\ndata: " + orjson.dumps(payload) + b"\n\n"
    )


class ResponsesStream(StreamTranslatorBase):
    """The Responses events of one answer, built from what a line streams.

    Subclasses read their wire's events and call :meth:`text`,
    :meth:`tool_start`, :meth:`tool_arguments` and :meth:`close`; the
    stream's end is :meth:`finish` (or :meth:`failed`, when it broke).
    """

    def __init__(self) -> None:
        self.sequence = 0
        self.suffix = _suffix(None)
        self.model: Any = None
        self.created_at = int(time.time())
        self.started = False
        #: Every output item so far, in order (the open one included).
        self.output: list[dict[str, Any]] = []
        #: The output index of the item still receiving content (None: none is).
        self.open: int | None = None
        #: The line's key of a tool call (its index) -> the item's output index.
        self.tools: dict[Any, int] = {}
        self.finish_reason: str | None = None
        #: The whole Response the stream ended with (set by :meth:`finish`), to be stored.
        self.final: dict[str, Any] | None = None
        #: The request's parameters every Response of the stream repeats.
        self.echo: dict[str, Any] = {}

    def repeat(self, echo: Mapping[str, Any]) -> None:
        self.echo = dict(echo)

    def _emit(self, out: list[bytes], payload: dict[str, Any]) -> None:
        payload["sequence_number"] = self.sequence
        self.sequence += 1
        out.append(_event(payload))

    def _snapshot(self, status: str, usage: Usage | None = None) -> dict[str, Any]:
        response = _response(
            self.suffix,
            self.model,
            self.created_at,
            self.output,
            status,
            usage,
            self.finish_reason,
        )
        response.update(self.echo)
        return response

    def start(self, out: list[bytes]) -> None:
        if self.started:
            return
        self.started = True
        for kind in ("response.created", "response.in_progress"):
            self._emit(out, {"type": kind, "response": self._snapshot("in_progress")})

    def text(self, out: list[bytes], delta: str) -> None:
        self.start(out)
        index = self.open
        if index is None or self.output[index]["type"] != "message":
            self.close(out)
            index = self.open = len(self.output)
            item: dict[str, Any] = {
                "id": f"msg_{self.suffix}_{index}",
                "type": "message",
                "status": "in_progress",
                "role": "assistant",
                "content": [],
            }
            self.output.append(item)
            self._emit(
                out,
                {"type": "response.output_item.added", "output_index": index, "item": dict(item)},
            )
            self._emit(
                out,
                {
                    "type": "response.content_part.added",
                    "item_id": item["id"],
                    "output_index": index,
                    "content_index": 0,
                    "part": _text_part(""),
                },
            )
            item["content"] = [_text_part("")]
        item = self.output[index]
        part = item["content"][0]
        part["text"] += delta
        self._emit(
            out,
            {
                "type": "response.output_text.delta",
                "item_id": item["id"],
                "output_index": index,
                "content_index": 0,
                "delta": delta,
                "logprobs": [],
            },
        )

    def tool_start(self, out: list[bytes], key: Any, call_id: Any, name: Any) -> None:
        self.start(out)
        self.close(out)
        index = self.open = self.tools[key] = len(self.output)
        item: dict[str, Any] = {
            "id": f"fc_{call_id}",
            "type": "function_call",
            "status": "in_progress",
            "call_id": call_id,
            "name": name,
            "arguments": "",
        }
        self.output.append(item)
        self._emit(
            out, {"type": "response.output_item.added", "output_index": index, "item": dict(item)}
        )

    def tool_arguments(self, out: list[bytes], key: Any, delta: str) -> None:
        index = self.tools.get(key)
        if index is None:
            return  # arguments of a call never opened: the line's stream is malformed
        item = self.output[index]
        item["arguments"] += delta
        self._emit(
            out,
            {
                "type": "response.function_call_arguments.delta",
                "item_id": item["id"],
                "output_index": index,
                "delta": delta,
            },
        )

    def close(self, out: list[bytes]) -> None:
        """The open item is whole: its ``.done`` events."""
        index, self.open = self.open, None
        if index is None:
            return
        item = self.output[index]
        if item["type"] == "message":
            item["status"] = "incomplete" if self.finish_reason in _INCOMPLETE else "completed"
            part = item["content"][0]
            common = {"item_id": item["id"], "output_index": index, "content_index": 0}
            self._emit(
                out,
                {
                    "type": "response.output_text.done",
                    **common,
                    "text": part["text"],
                    "logprobs": [],
                },
            )
            self._emit(out, {"type": "response.content_part.done", **common, "part": dict(part)})
        else:
            item["status"] = "completed"
            item["arguments"] = item["arguments"] or "{}"
            self._emit(
                out,
                {
                    "type": "response.function_call_arguments.done",
                    "item_id": item["id"],
                    "output_index": index,
                    "name": item["name"],
                    "arguments": item["arguments"],
                },
            )
        self._emit(out, {"type": "response.output_item.done", "output_index": index, "item": item})

    def finish(self, usage: Usage | None) -> list[bytes]:
        out: list[bytes] = []
        self.start(out)
        self.close(out)
        response = self.final = self._snapshot("completed", usage)
        kind = "response.incomplete" if response["status"] == "incomplete" else "response.completed"
        self._emit(out, {"type": kind, "response": response})
        return out

    def failed(self, err: PrismError) -> bytes:
        """The stream broke after its commit point: ``error``, then ``response.failed``."""
        out = [_event(error_payload(err, self.sequence))]
        self.sequence += 1
        response = self._snapshot("failed")
        response["error"] = {"code": err.code, "message": err.message}
        self._emit(out, {"type": "response.failed", "response": response})
        return b"".join(out)


class ChatToResponsesStream(ResponsesStream):
    """OpenAI chat chunks in, Responses events out."""

    def convert(self, kind: ChunkKind, payload: Any) -> list[bytes]:
        if kind is _USAGE_KIND or not isinstance(payload, dict):
            return []
        out: list[bytes] = []
        if not self.started:
            self.suffix = _suffix(payload.get("id"))
            self.model = payload.get("model")
            self.start(out)
        for choice in payload.get("choices") or ():
            delta = choice.get("delta") or {}
            # A refusal is passed on as text (as the Messages translation does).
            text = delta.get("content") or delta.get("refusal")
            if text:
                self.text(out, text)
            for call in delta.get("tool_calls") or ():
                function = call.get("function") or {}
                position = call.get("index", 0)
                if position not in self.tools:
                    self.tool_start(out, position, call.get("id"), function.get("name"))
                if function.get("arguments"):
                    self.tool_arguments(out, position, function["arguments"])
            if choice.get("finish_reason"):
                self.finish_reason = choice["finish_reason"]
        return out


class AnthropicToResponsesStream(ResponsesStream):
    """Anthropic Messages events in, Responses events out."""

    def convert(self, kind: ChunkKind, payload: Any) -> list[bytes]:
        if not isinstance(payload, dict):
            return []
        out: list[bytes] = []
        event = payload.get("type")
        if event == "message_start":
            message = payload.get("message") or {}
            self.suffix = _suffix(message.get("id"))
            self.model = message.get("model")
            self.start(out)
        elif event == "content_block_start":
            block = payload.get("content_block") or {}
            if block.get("type") == "tool_use":
                self.tool_start(out, payload.get("index", 0), block.get("id"), block.get("name"))
            elif block.get("type") == "text" and block.get("text"):
                self.text(out, block["text"])
        elif event == "content_block_delta":
            delta = payload.get("delta") or {}
            if delta.get("type") == "text_delta" and delta.get("text"):
                self.text(out, delta["text"])
            elif delta.get("type") == "input_json_delta" and delta.get("partial_json"):
                self.tool_arguments(out, payload.get("index", 0), delta["partial_json"])
        elif event == "message_delta":
            reason = (payload.get("delta") or {}).get("stop_reason")
            if reason:
                self.finish_reason = _ANTHROPIC_FINISH.get(reason, "stop")
        return out


def native_body(payload: dict[str, Any], usage: Usage | None) -> dict[str, Any]:
    """A native line's whole Response, under the gateway's own id."""
    return {**payload, "id": "resp_" + _suffix(payload.get("id"))}


#: The events that end a native line's answer: held until the call settles.
_LAST = frozenset({"response.completed", "response.incomplete"})


class NativeResponsesStream(StreamTranslatorBase):
    """A native line's Responses events, passed on as they come.

    Each Response in them gets the gateway's own id and the request's
    parameters; the last event (``response.completed``) is held back and
    written by :meth:`finish`, once the call is settled, and kept as
    :attr:`final`.  A stream broken after its commit point ends with
    :meth:`failed`, numbered after the last event passed on.
    """

    def __init__(self) -> None:
        self.id = "resp_" + _suffix(None)
        self.echo: dict[str, Any] = {}
        self.sequence = 0
        self.final: dict[str, Any] | None = None
        self._held: dict[str, Any] | None = None
        self._latest: dict[str, Any] = {"id": self.id, "object": "response", "output": []}
        #: The output items so far, as their events built them (for ``response.failed``).
        self._output: list[dict[str, Any]] = []

    def repeat(self, echo: Mapping[str, Any]) -> None:
        self.echo = dict(echo)

    def convert(self, kind: ChunkKind, payload: Any) -> list[bytes]:
        if not isinstance(payload, dict) or not isinstance(payload.get("type"), str):
            return []
        number = payload.get("sequence_number")
        if type(number) is int:
            self.sequence = number + 1
        response = payload.get("response")
        if isinstance(response, dict):
            self._latest = {**response, "id": self.id, **self.echo}
            payload = {**payload, "response": self._latest}
            if payload["type"] in _LAST:
                self._held = payload
                return []
        elif kind is ChunkKind.CONTENT or "item" in payload:
            self._follow(payload)
        return [_event(payload)]

    def _follow(self, payload: dict[str, Any]) -> None:
        """Keep the output items up to date with an item or delta event."""
        index = payload.get("output_index")
        if type(index) is not int or not 0 <= index <= len(self._output):
            return
        item = payload.get("item")
        if isinstance(item, dict):
            copied = {**item, "content": [dict(p) for p in item.get("content") or ()]}
            if index == len(self._output):
                self._output.append(copied)
            else:
                self._output[index] = copied
            return
        delta = payload.get("delta")
        if index == len(self._output) or not isinstance(delta, str):
            return
        current = self._output[index]
        if payload["type"] == "response.function_call_arguments.delta":
            current["arguments"] = str(current.get("arguments") or "") + delta
        elif payload["type"] == "response.output_text.delta":
            parts = current["content"]
            if not parts:
                parts.append(_text_part(""))
            parts[-1]["text"] = str(parts[-1].get("text") or "") + delta

    def finish(self, usage: Usage | None) -> list[bytes]:
        if self._held is None:
            return []
        self.final = self._held["response"]
        return [_event(self._held)]

    def failed(self, err: PrismError) -> bytes:
        """``error``, then ``response.failed``, numbered on from the line's events."""
        out = _event(error_payload(err, self.sequence))
        response = {
            **self._latest,
            "status": "failed",
            "output": self._output,
            "error": {"code": err.code, "message": err.message},
        }
        failed = {
            "type": "response.failed",
            "response": response,
            "sequence_number": self.sequence + 1,
        }
        self.sequence += 2
        return out + _event(failed)


def degraded_body(suffix: str, model: str, text: str) -> dict[str, Any]:
    """The operator's degraded answer as a whole Response."""
    item = {
        "id": "msg_" + suffix,
        "type": "message",
        "status": "completed",
        "role": "assistant",
        "content": [_text_part(text)],
    }
    return _response(suffix, model, int(time.time()), [item], "completed", Usage())


def degraded_events(suffix: str, model: str, text: str) -> bytes:
    """The same answer as a complete stream of Responses events."""
    stream = ResponsesStream()
    stream.suffix, stream.model = suffix, model
    out: list[bytes] = []
    stream.text(out, text)
    out.extend(stream.finish(Usage()))
    return b"".join(out)
