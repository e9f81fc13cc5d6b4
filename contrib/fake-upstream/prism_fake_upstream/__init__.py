"""A fake OpenAI- and Anthropic-compatible model provider for tests, benchmarks and demos."""

from .faults import Fault
from .recording import Recorded
from .server import FakeUpstream

__all__ = ["FakeUpstream", "Fault", "Recorded"]
