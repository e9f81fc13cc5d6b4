"""Wire-format-neutral answer synthesis: default text, token split, rough counts."""

from __future__ import annotations

import re
from collections.abc import Iterable
from typing import Any

__all__ = ["count_message_words", "count_words", "default_answer", "split_tokens"]

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
