"""What the bedrock tests share: the plugin to load, the line's model and its answer, a tool."""

from __future__ import annotations

from typing import Any

PLUGINS = ["bedrock"]
MODEL_ID = "anthropic.claude-3-5-sonnet-20240620-v1:0"
#: What the fake upstream answers a plain prompt on a ``MODEL_ID`` line.
ANSWER = f"Hello from {MODEL_ID}. This is the fake upstream answering."
MESSAGES = [{"role": "user", "content": "Hello"}]
#: A chat tool; the other wires' callers declare the same function in their own shape.
WEATHER_TOOL: dict[str, Any] = {
    "type": "function",
    "function": {
        "name": "get_weather",
        "description": "The weather in a city.",
        "parameters": {
            "type": "object",
            "properties": {"city": {"type": "string"}},
            "required": ["city"],
        },
    },
}
