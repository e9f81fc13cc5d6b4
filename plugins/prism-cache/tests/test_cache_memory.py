"""The memory store through the real server: hits, keys, what is never kept, caller controls."""

from __future__ import annotations

import tracemalloc
from typing import Any

import openai
import pytest
from prism_fake_upstream import Fault

from .conftest import HI, catalog

PLUGINS = ["openai", "anthropic", "cache"]
ON = {"cache": {"store": "memory"}}


async def start(prism_gateway: Any, prism_fake: Any, **kwargs: Any) -> Any:
    cat = kwargs.pop("cat", None) or catalog(prism_fake)
    return await prism_gateway(cat, sections=ON, load_plugins=PLUGINS, **kwargs)


async def chat(
    gw: Any, key: str = "k1@acme", headers: dict[str, str] | None = None, **body: Any
) -> Any:
    body.setdefault("temperature", 0)
    body.setdefault("messages", HI)
    async with gw.openai(default_headers={"x-test-key": key, **(headers or {})}) as client:
        return await client.chat.completions.with_raw_response.create(model="m", **body)


async def test_the_second_identical_call_is_a_hit_and_reaches_no_upstream(
    prism_gateway, prism_fake, callers
):
    gw = await start(prism_gateway, prism_fake)
    first = await chat(gw)
    assert first.headers["x-prism-cache"] == "miss"
    # Key order and the fields that do not change the answer make no difference.
    second = await chat(gw, user="someone", messages=HI, temperature=0.0)
    assert second.headers["x-prism-cache"] == "hit"
    assert prism_fake.hits("a") == 1
    assert int(second.headers["age"]) >= 0
    assert second.headers["x-prism-provider"] == first.headers["x-prism-provider"] == "a"
    assert second.headers["x-prism-model"] == "up"
    assert second.headers["x-prism-attempts"] == "0"
    one, two = first.parse(), second.parse()
    assert two.choices[0].message.content == one.choices[0].message.content
    assert two.usage.prompt_tokens == one.usage.prompt_tokens
    assert two.usage.completion_tokens == one.usage.completion_tokens
    # A different request is a different entry.
    other = await chat(gw, messages=[{"role": "user", "content": "hello there"}])
    assert other.headers["x-prism-cache"] == "miss"
    assert prism_fake.hits("a") == 2


async def test_organisations_never_share_an_entry(prism_gateway, prism_fake, callers):
    gw = await start(prism_gateway, prism_fake)
    await chat(gw, "k1@acme")
    assert (await chat(gw, "k2@acme")).headers["x-prism-cache"] == "hit"  # same organisation
    assert (await chat(gw, "k3@globex")).headers["x-prism-cache"] == "miss"
    assert prism_fake.hits("a") == 2


async def test_nondeterministic_and_tool_requests_are_bypassed_unless_the_model_says(
    prism_gateway, prism_fake, callers
):
    gw = await start(prism_gateway, prism_fake)
    raw = await chat(gw, temperature=0.7)
    assert raw.headers["x-prism-cache"] == "bypass; reason=nondeterministic"
    await chat(gw, temperature=0.7)
    assert prism_fake.hits("a") == 2
    await chat(gw, temperature=0.7, seed=7)
    assert (await chat(gw, temperature=0.7, seed=7)).headers["x-prism-cache"] == "hit"
    tools = [{"type": "function", "function": {"name": "f", "parameters": {"type": "object"}}}]
    assert (await chat(gw, tools=tools)).headers["x-prism-cache"] == "bypass; reason=tools"
    opted = catalog(prism_fake, "b", model={"cache": "all", "cache_tools": True})
    gw2 = await start(prism_gateway, prism_fake, cat=opted)
    # Kept when the answer is text (a tool call is never kept: see the README).
    await chat(gw2, temperature=0.9, tools=tools, tool_choice="none")
    raw = await chat(gw2, temperature=0.9, tools=tools, tool_choice="none")
    assert raw.headers["x-prism-cache"] == "hit"
    assert prism_fake.hits("b") == 1


async def test_tool_calls_are_replayed_with_ids_of_their_own_whole_and_streamed(
    prism_gateway, prism_fake, callers
):
    cat = catalog(prism_fake, model={"cache_tools": True})
    cat["models"]["c"]["cache_tools"] = True
    gw = await start(prism_gateway, prism_fake, cat=cat)
    tools = [{"type": "function", "function": {"name": "f", "parameters": {"type": "object"}}}]
    first = (await chat(gw, tools=tools)).parse().choices[0]
    raw = await chat(gw, tools=tools)
    assert raw.headers["x-prism-cache"] == "hit"
    again = raw.parse().choices[0]
    assert first.finish_reason == again.finish_reason == "tool_calls"
    made, replayed = first.message.tool_calls[0], again.message.tool_calls[0]
    assert (replayed.function.name, replayed.function.arguments) == (
        made.function.name,
        made.function.arguments,
    )
    assert replayed.id != made.id
    async with gw.openai(default_headers={"x-test-key": "k1@acme"}) as client:
        stream = await client.chat.completions.create(
            model="m", messages=HI, temperature=0, tools=tools, stream=True
        )
        name, arguments, finish = "", "", None
        async for chunk in stream:
            for piece in chunk.choices[0].delta.tool_calls or ():
                name += piece.function.name or ""
                arguments += piece.function.arguments or ""
            finish = chunk.choices[0].finish_reason or finish
    assert (name, arguments, finish) == (made.function.name, made.function.arguments, "tool_calls")
    assert prism_fake.hits("a") == 1
    claude_tools = [{"name": "f", "input_schema": {"type": "object"}}]
    async with gw.anthropic(default_headers={"x-test-key": "k1@acme"}) as claude:
        ask: dict[str, Any] = {
            "model": "c",
            "max_tokens": 50,
            "messages": HI,
            "tools": claude_tools,
        }
        used = await claude.messages.create(**ask)
        async with claude.messages.stream(**ask) as events:
            replay = await events.get_final_message()
    assert used.stop_reason == replay.stop_reason == "tool_use"
    block, again_block = used.content[-1], replay.content[-1]
    assert (again_block.name, again_block.input) == (block.name, block.input)
    assert again_block.id != block.id
    assert prism_fake.hits("c") == 1


@pytest.mark.parametrize(
    "fault",
    [
        Fault(text=""),  # empty
        Fault(empty_length=True),  # cut at max_tokens
        Fault(usage={"prompt_tokens": 1.5}),  # usage that could not be true: estimated
    ],
)
async def test_answers_that_are_not_a_plain_success_are_never_kept(
    prism_gateway, prism_fake, callers, fault
):
    gw = await start(prism_gateway, prism_fake)
    prism_fake.script("a", [fault])
    await chat(gw)
    assert (await chat(gw)).headers["x-prism-cache"] == "miss"
    assert prism_fake.hits("a") == 2


async def test_a_degraded_answer_is_never_kept(prism_gateway, prism_fake, callers):
    cat = catalog(prism_fake, model={"degraded": "busy, try later", "call_budget_ms": 1000})
    gw = await start(prism_gateway, prism_fake, cat=cat)
    prism_fake.script("a", [Fault(stall_s=5)])
    raw = await chat(gw)
    assert raw.headers["x-prism-outcome"] == "degraded"
    assert (await chat(gw)).headers["x-prism-cache"] == "miss"


async def test_cache_control_and_ttl_from_the_caller(
    prism_gateway, prism_fake, callers, prism_clock
):
    prism_fake.clock = prism_clock
    gw = await start(prism_gateway, prism_fake, clock=prism_clock)
    no_store = {"Cache-Control": "no-store"}
    assert (await chat(gw, headers=no_store)).headers["x-prism-cache"] == "bypass; reason=no-store"
    assert (await chat(gw)).headers["x-prism-cache"] == "miss"  # no-store wrote nothing
    assert (await chat(gw, headers=no_store)).headers["x-prism-cache"] == "bypass; reason=no-store"
    assert prism_fake.hits("a") == 3  # nor read anything
    refresh = await chat(gw, headers={"Cache-Control": "no-cache"})
    assert refresh.headers["x-prism-cache"] == "miss; reason=no-cache"
    assert prism_fake.hits("a") == 4
    assert (await chat(gw)).headers["x-prism-cache"] == "hit"
    prism_clock.advance(30)
    assert (await chat(gw, headers={"x-prism-cache-ttl": "10"})).headers["x-prism-cache"] == "miss"
    assert prism_fake.hits("a") == 5  # older than the caller accepts: refreshed
    # The entry written with a 10 s TTL is gone 11 s later.
    prism_clock.advance(11)
    assert (await chat(gw)).headers["x-prism-cache"] == "miss"
    with pytest.raises(openai.BadRequestError) as refused:
        await chat(gw, headers={"x-prism-cache-ttl": "soon"})
    assert refused.value.code == "invalid_cache_ttl"


async def test_an_organisation_can_opt_out(prism_gateway, prism_fake, callers):
    callers.org_settings["quiet"] = {"cache": False}
    gw = await start(prism_gateway, prism_fake)
    raw = await chat(gw, "k1@quiet")
    assert raw.headers["x-prism-cache"] == "bypass; reason=org"
    await chat(gw, "k1@quiet")
    assert prism_fake.hits("a") == 2


async def test_a_reload_that_changes_the_chain_makes_old_entries_unreachable(
    prism_gateway, prism_fake, callers
):
    gw = await start(prism_gateway, prism_fake)
    await chat(gw)
    config = gw.gateway.current.config
    await gw.gateway.reload(config)  # the same catalog: entries stay
    assert (await chat(gw)).headers["x-prism-cache"] == "hit"
    changed = catalog(prism_fake, max_context_tokens=9000)
    await gw.gateway.reload(attrs_evolve_catalog(config, changed))
    assert (await chat(gw)).headers["x-prism-cache"] == "miss"
    assert prism_fake.hits("a") == 2


def attrs_evolve_catalog(config: Any, catalog_data: dict[str, Any]) -> Any:
    from prism_proxy import config_from_mapping

    return config_from_mapping(
        {"disable": sorted(config.disable)},
        {"cache": {"store": "memory"}},
        source="<test config>",
        catalog_data=catalog_data,
    )


async def test_a_hit_streams_to_both_sdks_and_crosses_wires_of_delivery(
    prism_gateway, prism_fake, callers
):
    gw = await start(prism_gateway, prism_fake)
    whole = (await chat(gw)).parse()
    text = whole.choices[0].message.content
    async with gw.openai(default_headers={"x-test-key": "k1@acme"}) as client:
        stream = await client.chat.completions.create(
            model="m",
            messages=HI,
            temperature=0,
            stream=True,
            stream_options={"include_usage": True},
        )
        pieces, usage = [], None
        async for chunk in stream:
            if chunk.choices:
                pieces.append(chunk.choices[0].delta.content or "")
            if chunk.usage is not None:
                usage = chunk.usage
    assert "".join(pieces) == text
    assert usage is not None and usage.completion_tokens == whole.usage.completion_tokens
    assert prism_fake.hits("a") == 1
    # The Anthropic SDK: a messages caller, streamed the second time.
    async with gw.anthropic(default_headers={"x-test-key": "k1@acme"}) as claude:
        first = await claude.messages.create(model="c", max_tokens=50, messages=HI)
        async with claude.messages.stream(model="c", max_tokens=50, messages=HI) as events:
            replayed = await events.get_final_message()
    assert replayed.content[0].text == first.content[0].text
    assert replayed.usage.output_tokens == first.usage.output_tokens
    assert prism_fake.hits("c") == 1


async def test_a_streamed_answer_is_kept_and_replayed_whole(prism_gateway, prism_fake, callers):
    gw = await start(prism_gateway, prism_fake)
    async with gw.openai(default_headers={"x-test-key": "k1@acme"}) as client:
        stream = await client.chat.completions.create(
            model="m", messages=HI, temperature=0, stream=True
        )
        text = "".join([c.choices[0].delta.content or "" async for c in stream if c.choices])
    again = (await chat(gw)).parse()
    assert again.choices[0].message.content == text
    assert prism_fake.hits("a") == 1


async def test_responses_callers_get_hits_in_their_wire(prism_gateway, prism_fake, callers):
    gw = await start(prism_gateway, prism_fake)
    async with gw.openai(default_headers={"x-test-key": "k1@acme"}) as client:
        ask = {"model": "m", "input": "hi", "temperature": 0, "instructions": "be brief"}
        first = await client.responses.create(**ask)
        raw = await client.responses.with_raw_response.create(**ask)
        assert raw.headers["x-prism-cache"] == "hit"
        second = raw.parse()
        assert second.instructions == first.instructions == "be brief"
        assert second.output_text == first.output_text
        assert second.usage is not None and second.usage.output_tokens == first.usage.output_tokens
        # A hit is kept for follow-ups as a served Response is.
        follow = await client.responses.create(
            model="m", input="and then?", temperature=0, previous_response_id=second.id
        )
        assert follow.output_text
        assert prism_fake.hits("a") == 2
        # A stream that does not say store=false is never replayed (the core keeps only
        # what an upstream streamed, for follow-ups), but a replay with store=false is.
        stream = await client.responses.create(**ask, stream=True)
        done = [event async for event in stream if event.type == "response.completed"]
        assert done and done[0].response.output_text == first.output_text
        assert prism_fake.hits("a") == 3
        stream = await client.responses.create(**ask, stream=True, store=False)
        done = [event async for event in stream if event.type == "response.completed"]
    assert done and done[0].response.output_text == first.output_text
    assert done[0].response.usage.output_tokens == first.usage.output_tokens
    assert prism_fake.hits("a") == 3


async def test_off_without_a_store(prism_gateway, prism_fake, callers):
    gw = await prism_gateway(catalog(prism_fake), load_plugins=PLUGINS)
    raw = await chat(gw)
    assert "x-prism-cache" not in raw.headers
    await chat(gw)
    assert prism_fake.hits("a") == 2
    assert gw.gateway.current.hooks.lookup is None  # the hot path skips the hook entirely


async def test_anthropic_sdk_sees_a_miss_then_a_hit(prism_gateway, prism_fake, callers):
    gw = await start(prism_gateway, prism_fake)
    async with gw.anthropic(default_headers={"x-test-key": "k1@acme"}) as claude:
        raw = await claude.messages.with_raw_response.create(model="c", max_tokens=50, messages=HI)
        assert raw.headers["x-prism-cache"] == "miss"
        raw = await claude.messages.with_raw_response.create(model="c", max_tokens=50, messages=HI)
        assert raw.headers["x-prism-cache"] == "hit"
        again = await raw.parse()
        assert again.content[0].text and again.stop_reason == "end_turn"


async def test_the_memory_store_keeps_within_max_bytes_dropping_the_least_recent(
    prism_gateway, prism_fake, callers
):
    gw = await prism_gateway(
        catalog(prism_fake),
        sections={"cache": {"store": "memory", "max_bytes": 1024}},
        load_plugins=PLUGINS,
    )
    asks = [[{"role": "user", "content": f"question {n}"}] for n in range(8)]
    for messages in asks:
        await chat(gw, messages=messages)
    store = gw.gateway.current.plugin("cache.hooks").store
    assert 0 < store.bytes_used <= 1024
    assert (await chat(gw, messages=asks[-1])).headers["x-prism-cache"] == "hit"
    assert (await chat(gw, messages=asks[0])).headers["x-prism-cache"] == "miss"  # pushed out


async def test_what_the_memory_store_counts_is_what_its_entries_hold(
    prism_gateway, prism_fake, callers
):
    # max_bytes bounds memory only if a kept blob holds what len() says: a
    # serialiser that hands back its whole write buffer made each short
    # answer hold 4 KiB (a soak grew by 137 MB under an 8 MB bound).
    gw = await start(prism_gateway, prism_fake)
    store = gw.gateway.current.plugin("cache.hooks").store
    tracemalloc.start()
    try:
        for n in range(40):
            await chat(gw, messages=[{"role": "user", "content": f"question {n}"}])
        # What the cache's own code allocated and still holds: the entries.
        held = tracemalloc.take_snapshot().filter_traces(
            [tracemalloc.Filter(True, "*/prism_cache/*")]
        )
    finally:
        tracemalloc.stop()
    counted = store.bytes_used
    assert counted > 40 * 128
    assert sum(trace.size for trace in held.traces) < 2 * counted


async def test_a_streamed_hit_says_so_in_its_headers(prism_gateway, prism_fake, callers):
    import aiohttp

    gw = await start(prism_gateway, prism_fake)
    await chat(gw)
    body = {"model": "m", "messages": HI, "temperature": 0, "stream": True}
    async with aiohttp.ClientSession() as session:
        async with session.post(
            gw.url + "/v1/chat/completions", json=body, headers={"x-test-key": "k1@acme"}
        ) as response:
            assert response.headers["x-prism-cache"] == "hit"
            assert response.headers["x-prism-provider"] == "a"
            assert int(response.headers["age"]) >= 0
            assert response.headers["Content-Type"].startswith("text/event-stream")
            events = await response.text()
    assert events.endswith("data: [DONE]\n\n")
    assert prism_fake.hits("a") == 1
