"""The capability fixtures: what each asks a line, and what its answer must show.

A fixture checks the response contract, not only the status: a chat answer
needs text, a finish reason and usage; a tool call must name the tool and
carry arguments that parse as the JSON object its schema asks for; an
embedding must be a vector of numbers (of the line's dimension when known).
Nothing private goes into them: fixed text written for the purpose.
"""

from __future__ import annotations

import importlib.resources
import tomllib
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

import attrs
import orjson

__all__ = [
    "CHAT",
    "EMBEDDINGS",
    "STRICT_SYSTEM",
    "TOOL",
    "VISION",
    "Answer",
    "Fixture",
    "fixtures_for",
    "load_bodies",
    "long_prompt",
]

#: The system prompt of the long ("production-shaped") prompt: strict, as real ones are.
STRICT_SYSTEM = (
    "You are a customer support agent. Answer only from the policy document the user "
    "gives. Quote the rule you apply by its number. Answer in at most three sentences. "
    "Never invent a rule, a price or a date."
)


@attrs.define
class Answer:
    """What came back, as a caller would read it (nothing kept beyond this check)."""

    status: int
    ttft_ms: float | None = None
    total_ms: float = 0.0
    text: str = ""
    finish_reason: str | None = None
    usage: dict[str, Any] | None = None
    tool_calls: list[dict[str, Any]] = attrs.field(factory=list)
    embedding: list[Any] | None = None
    error: str | None = None


@attrs.frozen
class Fixture:
    name: str
    endpoint: str  # chat or embeddings
    body: dict[str, Any]
    stream: bool
    check: Callable[[Answer, dict[str, Any]], str | None]
    #: The line capability it needs (None: every chat line).
    needs: str | None = None


def _chat_ok(answer: Answer, line: dict[str, Any]) -> str | None:
    if not answer.text.strip():
        return "no text in the answer"
    if not answer.finish_reason:
        return "no finish reason"
    if not answer.usage:
        return "no usage reported"
    return None


WEATHER_TOOL = {
    "type": "function",
    "function": {
        "name": "get_weather",
        "description": "The weather now in a city.",
        "parameters": {
            "type": "object",
            "properties": {"city": {"type": "string"}},
            "required": ["city"],
        },
    },
}


def _tool_ok(answer: Answer, line: dict[str, Any]) -> str | None:
    if not answer.tool_calls:
        return "no tool call"
    function = answer.tool_calls[0].get("function") or {}
    if function.get("name") != "get_weather":
        return f"called {function.get('name')!r}, not get_weather"
    try:
        arguments = orjson.loads(function.get("arguments") or "")
    except orjson.JSONDecodeError:
        return "tool arguments do not parse as JSON"
    if not isinstance(arguments, dict) or "city" not in arguments:
        return "tool arguments miss the required 'city'"
    return None


def _embedding_ok(answer: Answer, line: dict[str, Any]) -> str | None:
    vector = answer.embedding
    if not vector or not all(isinstance(x, int | float) for x in vector):
        return "no vector of numbers"
    dimensions = line.get("dimensions")
    if dimensions is not None and len(vector) != dimensions:
        return f"a vector of {len(vector)} numbers, the line declares {dimensions}"
    return None


CHAT = Fixture(
    "chat",
    "chat",
    {
        "messages": [
            {"role": "system", "content": "You are a health check. Answer in one short sentence."},
            {"role": "user", "content": "Say that the check passed."},
        ],
        "max_tokens": 32,
        "stream_options": {"include_usage": True},
    },
    stream=True,
    check=_chat_ok,
)
TOOL = Fixture(
    "tool",
    "chat",
    {
        "messages": [{"role": "user", "content": "What is the weather in Lisbon right now?"}],
        "tools": [WEATHER_TOOL],
        "tool_choice": {"type": "function", "function": {"name": "get_weather"}},
        "max_tokens": 64,
    },
    stream=False,
    check=_tool_ok,
    needs="tools",
)
#: An 8x8 red square: an image no one owns.
RED_SQUARE = (
    "data:image/png;base64,iVBORw0KGgoAAAANSUhEUgAAAAgAAAAICAIAAABLbSncAAAAEUlEQVR4nGO4"
    "IyeHFTEMLQkAid1GAXiz9RcAAAAASUVORK5CYII="
)
VISION = Fixture(
    "vision",
    "chat",
    {
        "messages": [
            {
                "role": "user",
                "content": [
                    {"type": "text", "text": "What colour is this square? One word."},
                    {"type": "image_url", "image_url": {"url": RED_SQUARE}},
                ],
            }
        ],
        "max_tokens": 16,
    },
    stream=False,
    check=lambda answer, line: None if answer.text.strip() else "no text in the answer",
    needs="vision",
)
EMBEDDINGS = Fixture(
    "embeddings", "embeddings", {"input": ["a health check"]}, stream=False, check=_embedding_ok
)


def long_prompt() -> str:
    """About 2,000 tokens: a support policy document (the shipped default of ``--prompt-file``)."""
    return importlib.resources.files("prism_probes").joinpath("long_prompt.txt").read_text()


#: ``probe = ...`` on a chain line: which fixtures describe it (``chat`` by default).
PROBE_KINDS = ("chat", "embeddings", "off")


def fixtures_for(
    line: Any, endpoint: str | None = None, bodies: Mapping[str, dict[str, Any]] | None = None
) -> list[Fixture]:
    """The fixtures for ``line`` (a catalog Binding): its ``probe`` kind, or ``endpoint``,
    decides chat or embeddings; a chat line adds ``tool`` and ``vision`` where it
    declares those capabilities.  ``probe = "off"``: none.  ``bodies`` replaces
    shipped fixtures' requests by name (:func:`load_bodies`); their checks stay."""
    kind = endpoint or line.options.get("probe", "chat")
    if kind == "off":
        return []
    if kind == "embeddings":
        chosen = [EMBEDDINGS]
    else:
        declared = line.options.get("capabilities") or ()
        chosen = [CHAT] + [f for f in (TOOL, VISION) if f.needs in declared]
    bodies = bodies or {}
    return [
        attrs.evolve(f, body=_body(f, bodies[f.name])) if f.name in bodies else f for f in chosen
    ]


def _body(fixture: Fixture, body: dict[str, Any]) -> dict[str, Any]:
    """A replacement body; a streamed fixture still asks for usage (the contract checks it)."""
    if fixture.stream:
        return {"stream_options": {"include_usage": True}, **body}
    return body


def load_bodies(path: Path) -> dict[str, dict[str, Any]]:
    """A TOML file of fixture requests: ``[chat]``, ``[tool]``, ``[vision]``,
    ``[embeddings]`` tables, each the request body that fixture sends instead
    (the model is always the line's).  Raises ValueError naming the problem."""
    try:
        data = tomllib.loads(path.read_text())
    except (OSError, tomllib.TOMLDecodeError) as exc:
        raise ValueError(f"{path}: {exc}") from None
    known = {f.name for f in (CHAT, TOOL, VISION, EMBEDDINGS)}
    for name, body in data.items():
        if name not in known:
            raise ValueError(
                f"{path}: [{name}]: no such fixture (known: {', '.join(sorted(known))})"
            )
        if not isinstance(body, dict) or ("messages" not in body and "input" not in body):
            raise ValueError(f"{path}: [{name}]: a request body needs messages (or input)")
        body.pop("model", None)
    return data
