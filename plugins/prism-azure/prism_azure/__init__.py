"""prism-azure: the Azure OpenAI provider kind for Prism."""

from .entra import EntraTokens
from .provider import AzureOpenAIProvider

__all__ = ["AzureOpenAIProvider", "EntraTokens"]
