"""OpenAI chat as every translation reads it, and chat answers as every translation writes them.

A provider for another wire translates chat requests to its API and its
answers back to chat (``Translation(client="openai", …)``): the core does so
for Anthropic, prism-gemini and prism-bedrock for theirs.  What they all
read of a request the same way lives here, so they agree: the parameters a
target cannot express (refused, naming the feature) or leaves out (dropped,
and said so), the system text, data URLs, a tool call's arguments, a tool
result's text, the conversation as turns that alternate.  On the way back: chat completions,
stream chunks, the ``usage`` object, the estimate of a cut stream's usage.
How each API shapes its own blocks stays with its translation.

Reasons given to :class:`Untranslatable` are noun phrases: the attempt
record reads "cannot express <reason>".
"""

from __future__ import annotations

import time
from collections.abc import Callable, Collection, Iterable, Mapping
from types import MappingProxyType
from typing import Any, overload

import attrs
import orjson

from ..call import Usage
from .shape import MAX_DEPTH, deeper_than

__all__ = [
    "CHAT_CARRIED",
    "OPENAI_ONLY_PARAMS",
    "OPENAI_ONLY_UNSEEDED",
    "ChatChunks",
    "DataURL",
    "Untranslatable",
    "MessageItems",
    "chat_completion",
    "chat_tool_call",
    "chat_turns",
    "chat_usage",
    "check_chat_params",
    "data_url",
    "estimated_usage",
    "system_text",
    "text_chars",
    "tool_arguments",
    "tool_result_text",
]


class Untranslatable(Exception):
    """The request uses a feature the target API cannot express."""


#: OpenAI chat parameters that change the answer and that no other bundled
#: API can express, by the feature a refusal names.  A provider's table is
#: this one with what its API adds or lacks (``{**OPENAI_ONLY_PARAMS,
#: "seed": "seed"}``).
OPENAI_ONLY_PARAMS: Mapping[str, str] = MappingProxyType(
    {
        "logprobs": "logprobs",
        "top_logprobs": "logprobs",
        "logit_bias": "logit_bias",
        "audio": "audio output",
        "prediction": "predicted outputs",
        "functions": "legacy functions",
        "function_call": "legacy function_call",
        "web_search_options": "web search",
        "reasoning_effort": "reasoning_effort",
        "n": "n > 1",
        "modalities": "audio output",
    }
)
#: ``OPENAI_ONLY_PARAMS`` for an API with no seed and no penalties either
#: (Anthropic's Messages, Bedrock's Converse).
OPENAI_ONLY_UNSEEDED: Mapping[str, str] = MappingProxyType(
    {
        **OPENAI_ONLY_PARAMS,
        "seed": "seed",
        "presence_penalty": "presence_penalty",
        "frequency_penalty": "frequency_penalty",
    }
)
#: The OpenAI chat parameters every translation of a chat request to another
#: API carries over: the request itself, its length and sampling, tools and
#: structured output.  A translation adds what its API has besides (a seed,
#: penalties); ``check_chat_params`` drops the rest, or refuses what changes
#: the answer.
CHAT_CARRIED = frozenset(
    {
        "model",
        "messages",
        "max_tokens",
        "max_completion_tokens",
        "temperature",
        "top_p",
        "stop",
        "stream",
        "stream_options",
        "tools",
        "tool_choice",
        "response_format",
    }
)


def _changes_answer(key: str, value: Any) -> bool:
    """Whether a parameter is set to other than what OpenAI does without it."""
    if value is None or value is False:
        return False
    if key == "n":
        return bool((value or 1) > 1)
    if key == "modalities":
        return "audio" in (value or ())
    if key in ("presence_penalty", "frequency_penalty"):
        return bool(value)
    return True


def check_chat_params(
    body: Mapping[str, Any], *, unsupported: Mapping[str, str], carried: Collection[str]
) -> list[str]:
    """Refuse what the target cannot express; list what it leaves out.

    Raises :class:`Untranslatable` naming the feature of the first parameter
    of ``unsupported`` the body sets to other than OpenAI's default.  Returns
    ``"dropped <name>"`` for each other parameter set that is neither
    ``carried`` (translated) nor in ``unsupported``: the gateway reports these
    in ``x-prism-params-adjusted``, so nothing leaves a request silently.
    """
    for key, feature in unsupported.items():
        if _changes_answer(key, body.get(key)):
            raise Untranslatable(feature)
    return [
        f"dropped {key}"
        for key, value in body.items()
        if value is not None and key not in carried and key not in unsupported
    ]


def _text_of(content: Any, what: str) -> str:
    if isinstance(content, str):
        return content
    texts = []
    for part in content or ():
        if part.get("type") != "text":
            raise Untranslatable(f"{what} part type {part.get('type')!r}")
        texts.append(part.get("text", ""))
    return "\n".join(texts)


def system_text(body: Mapping[str, Any]) -> str | None:
    """The ``system`` and ``developer`` messages' text, in order (None: there are none).

    Parts of one message are joined by a line break, messages by a blank
    line.  A system message holds text only: another part is untranslatable.
    """
    texts = [
        _text_of(message.get("content"), "system content")
        for message in body["messages"]
        if message.get("role") in ("system", "developer")
    ]
    return "\n\n".join(texts) if texts else None


def tool_result_text(content: Any) -> str:
    """A ``tool`` message's result as one text (its text parts joined by line breaks)."""
    return _text_of(content, "tool result")


def tool_arguments(call: Mapping[str, Any]) -> dict[str, Any]:
    """An assistant tool call's arguments (a JSON text) as the object they encode."""
    if call.get("type") not in (None, "function"):
        raise Untranslatable(f"tool call type {call['type']!r}")
    try:
        arguments = orjson.loads((call.get("function") or {}).get("arguments") or "{}")
    except orjson.JSONDecodeError:
        raise Untranslatable("tool call arguments that are not JSON") from None
    if not isinstance(arguments, dict):
        raise Untranslatable("tool call arguments that are not a JSON object")
    # The text was never counted in the body's depth: parsed, it nests in it.
    if deeper_than(arguments, MAX_DEPTH):
        raise Untranslatable(f"tool call arguments nested more than {MAX_DEPTH} levels deep")
    return arguments


@attrs.frozen
class DataURL:
    """A base64 ``data:`` URL's content, as the caller sent it (never decoded here)."""

    #: Lower-cased; empty when the URL names none (each API has its default).
    media_type: str
    #: The base64 text.
    data: str


@overload
def data_url(url: str, what: str = ..., *, remote: str) -> DataURL: ...
@overload
def data_url(url: str, what: str = ..., *, remote: None = None) -> DataURL | None: ...
def data_url(url: str, what: str = "an image", *, remote: str | None = None) -> DataURL | None:
    """``url`` (an ``image_url`` part's, say) read as a base64 data URL.

    Another URL gives None, or, for an API that takes no URLs, raises
    ``Untranslatable(remote)``: the caller's reason (``"an image by URL"``).
    A data URL that is not base64 is untranslatable, named by ``what``.
    """
    if not url.startswith("data:"):
        if remote is None:
            return None
        raise Untranslatable(remote)
    header, _, data = url.partition(",")
    if ";base64" not in header:
        raise Untranslatable(f"{what} that is not a base64 data URL")
    return DataURL(media_type=header[5:].split(";")[0].lower(), data=data)


#: What one chat message becomes in the target API: its blocks (parts, items…).
MessageItems = Callable[[Mapping[str, Any]], list[dict[str, Any]]]


def chat_turns(
    body: Mapping[str, Any],
    *,
    user: MessageItems,
    assistant: MessageItems,
    tool: MessageItems,
    assistant_role: str = "assistant",
    key: str = "content",
) -> list[dict[str, Any]]:
    """A chat request's conversation as the target's turns, ``{"role": …, key: [items]}``.

    Each message but the system ones (:func:`system_text`) becomes items by
    the function for its role, in order; a tool's result joins the user's
    turn.  APIs that want turns to alternate get consecutive messages of one
    role (a tool result and the user's next words, parallel tool results) as
    one turn; a turn with nothing in it is left out.  Another role is
    untranslatable.
    """
    turns: list[dict[str, Any]] = []
    for message in body["messages"]:
        role = message.get("role")
        if role in ("system", "developer"):
            continue
        if role == "user":
            items, turn_role = user(message), "user"
        elif role == "assistant":
            items, turn_role = assistant(message), assistant_role
        elif role == "tool":
            items, turn_role = tool(message), "user"
        else:
            raise Untranslatable(f"message role {role!r}")
        if not items:
            continue
        if turns and turns[-1]["role"] == turn_role:
            turns[-1][key].extend(items)
        else:
            turns.append({"role": turn_role, key: items})
    return turns


# -- answers ---------------------------------------------------------------------------


def chat_usage(usage: Usage | None) -> dict[str, Any]:
    """A chat completion's ``usage`` object (no usage known: zeros)."""
    usage = usage or Usage()
    return {
        "prompt_tokens": usage.input_tokens,
        "completion_tokens": usage.output_tokens,
        "total_tokens": usage.input_tokens + usage.output_tokens,
        "prompt_tokens_details": {"cached_tokens": usage.cached_input_tokens},
        "completion_tokens_details": {"reasoning_tokens": usage.reasoning_tokens},
    }


def chat_tool_call(call_id: Any, name: Any, arguments: Any) -> dict[str, Any]:
    """An answer's ``tool_calls`` entry: ``arguments`` (an object) as the JSON text chat carries."""
    return {
        "id": call_id,
        "type": "function",
        "function": {"name": name, "arguments": orjson.dumps(arguments).decode()},
    }


def chat_completion(
    *,
    completion_id: str,
    model: Any,
    texts: Iterable[str],
    tool_calls: list[dict[str, Any]],
    finish_reason: str,
    usage: Usage | None,
) -> dict[str, Any]:
    """A whole chat completion of one choice: its texts joined, its tool calls if any."""
    message: dict[str, Any] = {"role": "assistant", "content": "".join(texts) or None}
    if tool_calls:
        message["tool_calls"] = tool_calls
    return {
        "id": completion_id,
        "object": "chat.completion",
        "created": int(time.time()),
        "model": model,
        "choices": [{"index": 0, "message": message, "finish_reason": finish_reason}],
        "usage": chat_usage(usage),
    }


def _now() -> int:
    return int(time.time())


@attrs.define
class ChatChunks:
    """One chat completion stream's chunks, as server-sent events (the core adds ``[DONE]``).

    ``completion_id`` and ``model`` may be set once the upstream names them.
    """

    completion_id: str
    model: Any = None
    created: int = attrs.field(factory=_now)

    def _event(self, chunk: dict[str, Any]) -> bytes:
        head = {
            "id": self.completion_id,
            "object": "chat.completion.chunk",
            "created": self.created,
            "model": self.model,
        }
        return b"data: " + orjson.dumps({**head, **chunk}) + b"\n\n"

    def delta(self, delta: dict[str, Any], finish_reason: str | None = None) -> bytes:
        """A chunk of the one choice: ``{"content": …}``, ``{"tool_calls": […]}``, ``{}``…"""
        choice = {"index": 0, "delta": delta, "finish_reason": finish_reason}
        return self._event({"choices": [choice]})

    def usage(self, usage: Usage) -> bytes:
        """The last chunk of a stream whose caller asked for usage (``include_usage``)."""
        return self._event({"choices": [], "usage": chat_usage(usage)})


def text_chars(blocks: Iterable[Any]) -> int:
    """Characters of the ``text`` members of ``blocks`` (anything else counts 0)."""
    return sum(
        len(block["text"])
        for block in blocks
        if isinstance(block, dict) and isinstance(block.get("text"), str)
    )


def estimated_usage(prompt_chars: int, delivered_chars: int) -> Usage:
    """Usage of a cut stream the upstream never counted: about 4 characters a token."""
    return Usage(
        input_tokens=-(-prompt_chars // 4),
        output_tokens=-(-delivered_chars // 4),
        estimated=True,
    )
