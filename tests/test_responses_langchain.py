"""LangChain's ChatOpenAI on the Responses API (``use_responses_api=True``) through Prism.

A framework nobody here wrote: its invoke, stream and tool calling must work
against a line of either kind, the gateway translating, and against a line
that speaks the Responses API natively.
"""

from __future__ import annotations

from typing import Any

import pytest

from .responses_support import LINES, NATIVE, NATIVE_LINE, answer, catalog

langchain_openai = pytest.importorskip("langchain_openai")


#: The translated lines of either kind, and a line that speaks the Responses API.
ALL_LINES = [*LINES, pytest.param(NATIVE_LINE, id="native")]


def chat_model(gw: Any, **options: Any) -> Any:
    return langchain_openai.ChatOpenAI(
        model="m",
        base_url=gw.base_url,
        api_key="prism-test",
        use_responses_api=True,
        max_retries=0,
        **options,
    )


@pytest.mark.parametrize("line", ALL_LINES)
async def test_invoke(prism_fake, prism_gateway, line):
    gw = await prism_gateway(catalog(prism_fake, line, native=NATIVE))
    message = await chat_model(gw).ainvoke("Hello")
    assert message.text == answer(line)
    assert message.usage_metadata["output_tokens"] == len(answer(line).split())
    assert message.response_metadata["id"].startswith("resp_")
    assert prism_fake.hits(line[2]) == 1


@pytest.mark.parametrize("line", ALL_LINES)
async def test_stream(prism_fake, prism_gateway, line):
    gw = await prism_gateway(catalog(prism_fake, line, native=NATIVE))
    chunks = [chunk async for chunk in chat_model(gw).astream("Hello")]
    assert len([c for c in chunks if c.text]) > 3
    whole = chunks[0]
    for chunk in chunks[1:]:
        whole = whole + chunk
    assert whole.text == answer(line)
    assert whole.usage_metadata["output_tokens"] == len(answer(line).split())


@pytest.mark.parametrize("line", ALL_LINES)
async def test_tool_call_round_trip(prism_fake, prism_gateway, line):
    from langchain_core.messages import HumanMessage, ToolMessage
    from langchain_core.tools import tool

    @tool
    def get_weather(location: str) -> str:
        """Weather for a city."""
        return f"22 and sunny in {location}"

    gw = await prism_gateway(catalog(prism_fake, line, native=NATIVE))
    model = chat_model(gw).bind_tools([get_weather])
    history: list[Any] = [HumanMessage("What's the weather in Paris?")]
    reply = await model.ainvoke(history)
    [call] = reply.tool_calls
    assert call["name"] == "get_weather" and call["args"] == {"location": "Paris"}
    history += [reply, ToolMessage(get_weather.invoke(call["args"]), tool_call_id=call["id"])]
    final = await model.ainvoke(history)
    assert final.text == "The tool said: 22 and sunny in Paris"
