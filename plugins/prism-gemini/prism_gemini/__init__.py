"""prism-gemini: Google's Gemini API and Vertex AI as Prism provider kinds."""

from .classify import classify_gemini
from .provider import GeminiProvider, VertexProvider
from .wire import GEMINI

__all__ = ["GEMINI", "GeminiProvider", "VertexProvider", "classify_gemini"]
