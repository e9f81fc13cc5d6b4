"""The wire formats the core speaks itself: OpenAI chat and Anthropic messages."""

from __future__ import annotations

from ..hookimpl import hookimpl
from ..wire import Translation, Wire, default_wires


@hookimpl
def prism_wires() -> list[Wire | Translation]:
    return default_wires()
