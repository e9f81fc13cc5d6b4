"""Conversation state of the Responses API, kept by the core's in-process store.

``previous_response_id`` carries a conversation on any line (the line is
sent the earlier items, the fake upstream records them), ``responses.retrieve``
and ``responses.delete`` answer the owner only, ``store=False`` keeps nothing,
and a kept response expires on the gateway's clock.
"""

from __future__ import annotations

import json
from typing import Any

import openai
import pytest
from prism_fake_upstream import Fault

from prism_proxy.testing import eventually

from .responses_support import (
    ANTHROPIC_LINE,
    LINES,
    OPENAI_LINE,
    WEATHER_TOOL,
    Callers,
    answer,
    catalog,
    client,
    start,
)


def history(sent: dict[str, Any], kind: str) -> list[tuple[str, str]]:
    """(role, text) of each message the line was sent, in either wire."""
    found = []
    for message in sent["messages"]:
        content = message.get("content")
        if isinstance(content, list):
            content = "".join(part.get("text", "") for part in content)
        found.append((message["role"], content))
    return found


@pytest.mark.parametrize("line", LINES)
async def test_a_follow_up_carries_the_conversation_to_the_line(prism_fake, prism_gateway, line):
    gw = await start(prism_gateway, catalog(prism_fake, line))
    sdk = gw.openai()
    first = await sdk.responses.create(model="m", instructions="Be brief.", input="Hello")
    second = await sdk.responses.create(
        model="m", previous_response_id=first.id, input="And again?"
    )
    assert second.id != first.id and second.output_text == answer(line)
    sent = prism_fake.requests(line[2])[-1].body
    # The first turn's instructions are not carried over (as OpenAI does).
    assert history(sent, line[1]) == [
        ("user", "Hello"),
        ("assistant", answer(line)),
        ("user", "And again?"),
    ]
    third = await sdk.responses.create(model="m", previous_response_id=second.id, input="Last.")
    sent = prism_fake.requests(line[2])[-1].body
    assert [text for _, text in history(sent, line[1])] == [
        "Hello",
        answer(line),
        "And again?",
        answer(line),
        "Last.",
    ]
    assert third.status == "completed"


async def test_a_follow_up_goes_on_after_a_failover(prism_fake, prism_gateway):
    gw = await start(prism_gateway, catalog(prism_fake, OPENAI_LINE, ANTHROPIC_LINE, retries=0))
    sdk = gw.openai()
    first = await sdk.responses.with_raw_response.create(model="m", input="Hello")
    assert first.headers["x-prism-provider"] == "gpt"
    prism_fake.script("gpt-ok", [Fault(status=503)])
    second = await sdk.responses.with_raw_response.create(
        model="m", previous_response_id=first.parse().id, input="Still there?"
    )
    assert second.headers["x-prism-provider"] == "claude"
    assert second.headers["x-prism-attempts"] == "2"
    sent = prism_fake.requests("claude-ok")[-1].body
    assert history(sent, "anthropic") == [
        ("user", "Hello"),
        ("assistant", answer(OPENAI_LINE)),
        ("user", "Still there?"),
    ]
    # And the answer the second line gave is the next turn's history.
    third = await sdk.responses.create(
        model="m", previous_response_id=second.parse().id, input="Bye."
    )
    assert third.status == "completed"
    sent = prism_fake.requests("gpt-ok")[-1].body
    assert history(sent, "openai")[3] == ("assistant", answer(ANTHROPIC_LINE))


@pytest.mark.parametrize("line", LINES)
async def test_a_tool_round_trip_by_previous_response_id(prism_fake, prism_gateway, line):
    gw = await start(prism_gateway, catalog(prism_fake, line))
    sdk = gw.openai()
    first = await sdk.responses.create(
        model="m", input="What's the weather in Paris?", tools=[WEATHER_TOOL], stream=False
    )
    [call] = first.output
    assert call.type == "function_call" and json.loads(call.arguments) == {"location": "Paris"}
    follow_up = await sdk.responses.create(
        model="m",
        tools=[WEATHER_TOOL],
        previous_response_id=first.id,
        input=[{"type": "function_call_output", "call_id": call.call_id, "output": "22 and sunny"}],
    )
    assert follow_up.output_text == "The tool said: 22 and sunny"


@pytest.mark.parametrize("stream", [False, True], ids=["whole", "streamed"])
async def test_retrieve_and_delete(prism_fake, prism_gateway, stream):
    gw = await start(prism_gateway, catalog(prism_fake, ANTHROPIC_LINE))
    sdk = gw.openai()
    if stream:
        events = [event async for event in await sdk.responses.create(
            model="m", input="Hello", stream=True
        )]  # fmt: skip
        served = events[-1].response
    else:
        served = await sdk.responses.create(model="m", input="Hello")
    kept = await sdk.responses.retrieve(served.id)
    assert kept.id == served.id
    assert kept.output_text == answer(ANTHROPIC_LINE)
    assert kept.usage.output_tokens == served.usage.output_tokens
    raw = await gw.openai().responses.with_raw_response.delete(served.id)
    assert raw.http_response.json() == {"id": served.id, "object": "response", "deleted": True}
    with pytest.raises(openai.NotFoundError) as info:
        await sdk.responses.retrieve(served.id)
    assert info.value.code == "response_not_found"
    with pytest.raises(openai.NotFoundError):
        await sdk.responses.delete(served.id)
    with pytest.raises(openai.NotFoundError) as info:
        await sdk.responses.create(model="m", previous_response_id=served.id, input="More")
    assert info.value.code == "previous_response_not_found"
    assert info.value.param == "previous_response_id"


async def test_only_the_organisation_that_made_it_sees_it(prism_fake, prism_gateway):
    gw = await start(
        prism_gateway, catalog(prism_fake, OPENAI_LINE), plugins=[(Callers(), "callers")]
    )
    acme = await client(gw, "k1@acme").responses.create(model="m", input="Secret plan")
    # Another key of the same organisation sees it and may go on with it.
    assert (await client(gw, "k2@acme").responses.retrieve(acme.id)).id == acme.id
    hits = prism_fake.hits("gpt-ok")
    for stranger in ("k3@globex", "lonely", None):
        sdk = client(gw, stranger)
        with pytest.raises(openai.NotFoundError):
            await sdk.responses.retrieve(acme.id)
        with pytest.raises(openai.NotFoundError):
            await sdk.responses.delete(acme.id)
        with pytest.raises(openai.NotFoundError) as info:
            await sdk.responses.create(model="m", previous_response_id=acme.id, input="Tell me")
        assert info.value.code == "previous_response_not_found"
        assert "Secret" not in info.value.message
        with pytest.raises(openai.NotFoundError):
            await sdk.responses.input_items.list(acme.id)
    assert prism_fake.hits("gpt-ok") == hits  # no stranger's call reached a line
    listed = await client(gw, "k2@acme").responses.input_items.list(acme.id)
    assert [item.content[0].text for item in listed.data] == ["Secret plan"]
    assert (await client(gw, "k1@acme").responses.retrieve(acme.id)).id == acme.id
    # A key without an organisation owns its own, and the anonymous caller theirs.
    mine = await client(gw, "lonely").responses.create(model="m", input="Hi")
    with pytest.raises(openai.NotFoundError):
        await client(gw, "k1@acme").responses.retrieve(mine.id)
    anonymous = await client(gw).responses.create(model="m", input="Hi")
    assert (await client(gw).responses.retrieve(anonymous.id)).id == anonymous.id
    with pytest.raises(openai.NotFoundError):
        await client(gw, "lonely").responses.retrieve(anonymous.id)


@pytest.mark.parametrize("stream", [False, True], ids=["whole", "streamed"])
async def test_store_false_keeps_nothing(prism_fake, prism_gateway, stream):
    gw = await start(prism_gateway, catalog(prism_fake, OPENAI_LINE))
    sdk = gw.openai()
    served = await sdk.responses.create(model="m", input="Hi", store=False, stream=stream)
    if stream:
        served = [event async for event in served][-1].response
    assert served.id.startswith("resp_")
    with pytest.raises(openai.NotFoundError):
        await sdk.responses.retrieve(served.id)
    with pytest.raises(openai.NotFoundError):
        await sdk.responses.create(model="m", previous_response_id=served.id, input="More")


async def test_a_kept_response_expires_after_an_hour(prism_fake, prism_gateway, prism_clock):
    gw = await start(prism_gateway, catalog(prism_fake, OPENAI_LINE), clock=prism_clock)
    sdk = gw.openai()
    served = await sdk.responses.create(model="m", input="Hi")
    prism_clock.advance(3590)
    assert (await sdk.responses.retrieve(served.id)).id == served.id
    prism_clock.advance(20)
    with pytest.raises(openai.NotFoundError):
        await sdk.responses.retrieve(served.id)


async def test_a_broken_stream_is_not_kept(prism_fake, prism_gateway):
    prism_fake.script("gpt-ok", [Fault(die_after_chunks=3)])
    gw = await start(prism_gateway, catalog(prism_fake, OPENAI_LINE))
    sdk = gw.openai()
    events = [e async for e in await sdk.responses.create(model="m", input="Hi", stream=True)]
    assert events[-1].type == "response.failed"
    with pytest.raises(openai.NotFoundError):
        await sdk.responses.retrieve(events[0].response.id)


async def test_a_bad_previous_response_id_is_named(prism_fake, prism_gateway):
    gw = await start(prism_gateway, catalog(prism_fake, OPENAI_LINE))
    with pytest.raises(openai.BadRequestError) as info:
        await gw.openai().responses.create(
            model="m", input="Hi", extra_body={"previous_response_id": 7}
        )
    assert info.value.param == "previous_response_id"
    assert prism_fake.hits("gpt-ok") == 0


async def test_a_kept_response_outlives_a_reload(prism_fake, prism_gateway):
    from prism_proxy import config_from_mapping

    gw = await start(prism_gateway, catalog(prism_fake, OPENAI_LINE))
    sdk = gw.openai()
    served = await sdk.responses.create(model="m", input="Hello")
    before = gw.gateway.current.number
    await gw.gateway.reload(
        config_from_mapping(
            {"disable": ["responses"]}, {}, catalog_data=catalog(prism_fake, OPENAI_LINE)
        )
    )
    assert gw.gateway.current.number == before + 1
    # The generation that kept it has stopped before the follow-up asks.
    await eventually(lambda: not gw.gateway.draining_generations, what="generation 1 stopped")
    follow_up = await sdk.responses.create(model="m", previous_response_id=served.id, input="Again")
    assert follow_up.status == "completed"
    assert (await sdk.responses.retrieve(served.id)).id == served.id


@pytest.mark.parametrize("line", LINES)
@pytest.mark.parametrize("stream", [False, True], ids=["whole", "streamed"])
async def test_the_response_repeats_the_requests_parameters(
    prism_fake, prism_gateway, line, stream
):
    gw = await start(prism_gateway, catalog(prism_fake, line))
    sdk = gw.openai()
    first = await sdk.responses.create(model="m", input="Hi")
    request: dict[str, Any] = {
        "instructions": "Be brief.",
        "temperature": 0.25,
        "top_p": 0.5,
        "max_output_tokens": 200,
        "tools": [WEATHER_TOOL],
        "tool_choice": "none",
        "text": {"format": {"type": "json_object"}},
        "metadata": {"ticket": "42"},
        "parallel_tool_calls": False,
        "user": "u-1",
        "previous_response_id": first.id,
    }
    served = await sdk.responses.create(model="m", input="Answer in JSON", stream=stream, **request)
    if stream:
        events = [event async for event in served]
        assert events[0].response.instructions == "Be brief."
        served = events[-1].response
    kept = await sdk.responses.retrieve(served.id)
    for response in (served, kept):
        dumped = response.model_dump(exclude_none=True)
        for key, value in request.items():
            assert dumped[key] == value, key
        assert response.store is True and response.model == f"up-{line[0]}"
    # Unset parameters are OpenAI's defaults.
    assert first.temperature == 1.0 and first.tool_choice == "auto" and first.tools == []
    assert first.previous_response_id is None and first.metadata == {}


async def test_input_items_are_listed_a_page_at_a_time(prism_fake, prism_gateway):
    gw = await start(prism_gateway, catalog(prism_fake, OPENAI_LINE))
    sdk = gw.openai()
    first = await sdk.responses.create(model="m", input="One")
    second = await sdk.responses.create(
        model="m",
        previous_response_id=first.id,
        input=[{"role": "user", "content": [{"type": "input_text", "text": "Two"}]}],
    )
    page = await sdk.responses.input_items.list(second.id)
    texts = [item.content[0].text for item in page.data]
    assert texts == ["Two", answer(OPENAI_LINE), "One"]  # newest first
    assert [item.role for item in page.data] == ["user", "assistant", "user"]
    assert page.has_more is False
    assert page.first_id == page.data[0].id and page.last_id == page.data[-1].id
    assert page.data[1].id == first.output[0].id  # the answer keeps its own id
    oldest = await sdk.responses.input_items.list(second.id, order="asc", limit=1)
    assert [item.content[0].text for item in oldest.data] == ["One"] and oldest.has_more
    rest = await sdk.responses.input_items.list(
        second.id, order="asc", limit=1, after=oldest.last_id
    )
    assert [item.content[0].text for item in rest.data] == [answer(OPENAI_LINE)]
    with pytest.raises(openai.BadRequestError) as info:
        await sdk.responses.input_items.list(second.id, limit=101)
    assert info.value.param == "limit"
    with pytest.raises(openai.NotFoundError):
        await sdk.responses.input_items.list("resp_nope")
