"""prism-openai: the OpenAI-compatible provider kind for Prism."""

from .provider import OpenAIProvider

__all__ = ["OpenAIProvider"]
