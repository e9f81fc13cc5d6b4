"""prism-bedrock: Amazon Bedrock's Converse API as a Prism provider kind."""

from .classify import classify_bedrock
from .provider import BedrockProvider
from .wire import BEDROCK

__all__ = ["BEDROCK", "BedrockProvider", "classify_bedrock"]
