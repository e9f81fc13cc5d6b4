"""What the tests of the newer APIs share: their catalogs, lines, tools and stream checks.

A catalog here is one model ``m`` whose chain is the given lines, each a
``(provider name, kind, fake scenario)``, its upstream model ``up-<name>``.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

import openai
import pytest

from prism_proxy import Principal, hookimpl

WEATHER_TOOL = {
    "type": "function",
    "name": "get_weather",
    "description": "Weather for a city",
    "parameters": {
        "type": "object",
        "properties": {"location": {"type": "string"}},
        "required": ["location"],
    },
}

OPENAI_LINE = ("gpt", "openai", "gpt-ok")
ANTHROPIC_LINE = ("claude", "anthropic", "claude-ok")
LINES = [pytest.param(OPENAI_LINE, id="openai-line"), pytest.param(ANTHROPIC_LINE, id="anthropic")]
#: An OpenAI line sent Responses calls natively (``catalog(..., native=NATIVE)``).
NATIVE_LINE = ("native", "openai", "native-ok")
NATIVE = (NATIVE_LINE[0],)
#: Where each kind of line is sent a translated Responses call.
UPSTREAM_PATH = {"openai": "chat/completions", "anthropic": "messages"}


def catalog(
    fake: Any, *lines: tuple[str, str, str], native: Iterable[str] = (), **model: Any
) -> dict[str, Any]:
    """Model ``m`` whose chain is ``lines``, in order; ``native``: the providers sent
    Responses calls natively (``responses = "native"``)."""
    speakers = set(native)
    return {
        "providers": {
            name: {
                "kind": kind,
                "base_url": fake.base_url(scenario),
                **({"responses": "native"} if name in speakers else {}),
            }
            for name, kind, scenario in lines
        },
        "models": {
            "m": {
                "chain": [{"provider": name, "model": f"up-{name}"} for name, _, _ in lines],
                **model,
            }
        },
    }


def answer(line: tuple[str, str, str]) -> str:
    """What the fake upstream answers on ``line`` when nothing else is asked."""
    return f"Hello from up-{line[0]}. This is the fake upstream answering."


async def collect(stream: Any) -> list[Any]:
    return [event async for event in stream]


def check_sequence(events: list[Any]) -> None:
    """Numbered from 0, one by one, and framed by created/in_progress … completed."""
    assert [e.sequence_number for e in events] == list(range(len(events)))
    assert [e.type for e in events[:2]] == ["response.created", "response.in_progress"]
    assert events[0].response.status == "in_progress"


class Callers:
    """A stand-in auth plugin: ``x-test-key: KEY@ORG`` names the caller (no header: anonymous)."""

    @hookimpl
    def prism_authenticate(self, call: Any) -> Principal | None:
        value = call.request.headers.get("x-test-key")
        if not value:
            return None
        key, _, org = value.partition("@")
        return Principal(key_id=key, org=org or None)


async def start(prism_gateway: Any, catalog: dict[str, Any], **options: Any) -> Any:
    """A gateway on the core's own store of responses (prism-responses, if installed, disabled)."""
    return await prism_gateway(catalog, config={"disable": ["responses"]}, **options)


def client(gw: Any, caller: str | None = None) -> openai.AsyncOpenAI:
    """The gateway's openai client, as ``caller`` (``KEY@ORG``; None: anonymous)."""
    return gw.openai(default_headers={"x-test-key": caller} if caller else None)
