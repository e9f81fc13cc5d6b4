"""Wire-format-neutral answer synthesis: default text, token split, rough counts,
and the deterministic tool calls both wire formats make."""

from __future__ import annotations

import json
import re
from collections.abc import Iterable, Mapping, Sequence
from typing import Any

__all__ = [
    "TOOL_STRING_VALUE",
    "content_text",
    "count_message_words",
    "count_words",
    "default_answer",
    "split_tokens",
    "tool_arguments",
    "tool_arguments_json",
    "tool_result_answer",
]

# What every required string parameter of a called tool is filled with.
TOOL_STRING_VALUE = "Paris"

# Leading whitespace stays with the following word (" world"), the way BPE
# tokens look, so joining the pieces reproduces the text exactly.
_TOKEN = re.compile(r"\s*\S+")


def default_answer(model: str) -> str:
    return f"Hello from {model}. This is the fake upstream answering."


def split_tokens(text: str) -> list[str]:
    tokens = _TOKEN.findall(text)
    consumed = sum(map(len, tokens))
    if consumed < len(text):
        # Trailing whitespace has no word to lead; keep it so nothing is lost.
        if tokens:
            tokens[-1] += text[consumed:]
        else:
            tokens.append(text)
    return tokens


def count_words(text: str) -> int:
    return len(text.split())


def _content_text(content: Any) -> Iterable[str]:
    if isinstance(content, str):
        yield content
    elif isinstance(content, list):
        for part in content:
            if isinstance(part, dict):
                text = part.get("text")
                if isinstance(text, str):
                    yield text
            elif isinstance(part, str):
                yield part


def count_message_words(messages: Iterable[Any]) -> int:
    """Rough prompt size: words in every text content of every message."""
    total = 0
    for message in messages:
        if isinstance(message, dict):
            for text in _content_text(message.get("content")):
                total += count_words(text)
    return total


def content_text(content: Any) -> str:
    """The text of a message content (a string or a list of text parts)."""
    return " ".join(_content_text(content))


def tool_result_answer(results: Sequence[str]) -> str:
    """The answer to a conversation that ends with tool results."""
    return "The tool said: " + " ".join(results)


def _argument_value(schema: Any) -> Any:
    if not isinstance(schema, Mapping):
        return TOOL_STRING_VALUE
    enum = schema.get("enum")
    if isinstance(enum, list) and enum:
        return enum[0]
    kind = schema.get("type")
    if isinstance(kind, list):
        kind = next((k for k in kind if k != "null"), "null")
    if kind in ("integer", "number"):
        return 1
    if kind == "boolean":
        return True
    if kind == "array":
        return []
    if kind == "object":
        return tool_arguments(schema)
    if kind == "null":
        return None
    return TOOL_STRING_VALUE


def tool_arguments(schema: Any) -> dict[str, Any]:
    """Deterministic arguments for a tool with JSON schema ``schema``.

    Every *required* property is filled: the first ``enum`` value if there is
    one, else by type: string "Paris", integer/number 1, boolean true, array
    [], object recursively the same way, null null. Optional properties are
    left out.
    """
    if not isinstance(schema, Mapping):
        return {}
    properties = schema.get("properties")
    required = schema.get("required")
    if not isinstance(required, list):
        return {}
    if not isinstance(properties, Mapping):
        properties = {}
    return {
        name: _argument_value(properties.get(name)) for name in required if isinstance(name, str)
    }


def tool_arguments_json(arguments: Mapping[str, Any]) -> tuple[str, list[str]]:
    """The arguments as JSON text and the fragments it is streamed in.

    The text keeps json.dumps' spaces so split_tokens cuts it into several
    fragments (``{"location":`` + `` "Paris"}``), like a model emitting it
    token by token; the fragments join back to the text exactly.
    """
    text = json.dumps(arguments, ensure_ascii=False)
    return text, split_tokens(text)
