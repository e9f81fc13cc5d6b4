"""prism-anthropic: the Anthropic Messages API as a Prism provider kind."""

from .classify import classify_anthropic
from .provider import AnthropicProvider

__all__ = ["AnthropicProvider", "classify_anthropic"]
