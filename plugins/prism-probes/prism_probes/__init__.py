"""prism-probes: capability fixtures and ``prism preflight``."""

from .fixtures import CHAT, EMBEDDINGS, TOOL, Answer, Fixture, long_prompt
from .preflight import run_preflight, run_suite

__all__ = [
    "CHAT",
    "EMBEDDINGS",
    "TOOL",
    "Answer",
    "Fixture",
    "long_prompt",
    "run_preflight",
    "run_suite",
]
