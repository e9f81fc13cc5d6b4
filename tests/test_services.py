"""Services: provided by one plugin, consumed typed by others, whatever the order they load in.

Through the real gateway: two providers stop start-up naming both unless the
operator chooses one, a missing service names who would provide it, a
consumer registered before its provider still gets the provider's object,
and the plugin guide's complete example runs as written.
"""

from __future__ import annotations

import re
import types
import warnings
from pathlib import Path
from typing import Any

import aiohttp
import pytest

from prism_proxy import (
    CAPACITY,
    SERVICES,
    SHARED_STATE,
    TELEMETRY,
    Capacity,
    ConfigError,
    Generation,
    Telemetry,
    hookimpl,
    provide,
)

GUIDE = Path(__file__).resolve().parents[1] / "docs" / "plugin-guide.md"
BODY = {"model": "chat-a", "messages": [{"role": "user", "content": "hi"}]}


class Counting(Telemetry):
    def __init__(self) -> None:
        self.counted: list[tuple[str, dict[str, str]]] = []

    def count(self, name: str, amount: float = 1.0, **labels: str) -> None:
        self.counted.append((name, labels))


class Exporter:
    """A plugin that provides TELEMETRY, counting what it is told."""

    def __init__(self) -> None:
        self.telemetry = Counting()
        self.made = 0

    def make(self) -> Counting:
        self.made += 1
        return self.telemetry

    @hookimpl
    def prism_services(self, generation: Generation) -> list[Any]:
        return [provide(TELEMETRY, self.make)]


class Reporter:
    """A plugin that consumes TELEMETRY and counts every call it settles."""

    def __init__(self) -> None:
        self.got: Telemetry | None = None

    @hookimpl
    def prism_generation(self, generation: Generation) -> None:
        self.got = generation.services.get(TELEMETRY)

    @hookimpl
    def prism_settle(self, call: Any, settlement: Any) -> None:
        assert self.got is not None
        self.got.count("prism_events_total", event="settled")


async def call(gw: Any) -> aiohttp.ClientResponse:
    async with aiohttp.ClientSession() as session:
        async with session.post(gw.url + "/v1/chat/completions", json=BODY) as response:
            await response.read()
            return response


async def test_a_consumer_registered_first_gets_the_provider_built_once(prism_gateway, catalog):
    exporter, reporter = Exporter(), Reporter()
    # The consumer comes first: no tryfirst, no order comment, same result.
    gw = await prism_gateway(
        catalog, plugins=[(reporter, "reporter"), (exporter, "exporter")], load_plugins=["openai"]
    )
    response = await call(gw)
    assert response.status == 200
    assert reporter.got is exporter.telemetry
    assert gw.gateway.current.telemetry is exporter.telemetry  # the core reports there too
    assert exporter.telemetry.counted == [("prism_events_total", {"event": "settled"})]
    assert exporter.made == 1
    assert gw.gateway.current.services.provider(TELEMETRY) == "exporter"


async def test_two_providers_stop_start_up_naming_both(prism_gateway, catalog):
    with pytest.raises(ConfigError) as caught:
        await prism_gateway(
            catalog,
            plugins=[(Exporter(), "exporter-a"), (Exporter(), "exporter-b")],
            load_plugins=["openai"],
        )
    message = str(caught.value)
    assert "telemetry is provided by exporter-a and exporter-b" in message
    assert "[prism] services = telemetry:exporter-a" in message


async def test_the_operator_chooses_one_provider(prism_gateway, catalog):
    first, second, reporter = Exporter(), Exporter(), Reporter()
    gw = await prism_gateway(
        catalog,
        config={"services": "telemetry:exporter-b"},
        plugins=[(first, "exporter-a"), (second, "exporter-b"), (reporter, "reporter")],
        load_plugins=["openai"],
    )
    assert (await call(gw)).status == 200
    assert second.telemetry.counted and not first.telemetry.counted
    assert first.made == 0, "the provider not chosen builds nothing"


@pytest.mark.parametrize(
    ("choice", "message"),
    [
        ("telemetry:nobody", "nobody does not provide telemetry (provided by: exporter)"),
        ("capacity:exporter", "exporter is chosen for capacity, but no loaded plugin provides it"),
        ("metrix:exporter", "unknown service 'metrix' (known: capacity, telemetry,"),
        ("telemetry", "expected SERVICE:PLUGIN, got 'telemetry'"),
    ],
)
async def test_a_choice_that_cannot_hold_is_refused(prism_gateway, catalog, choice, message):
    with pytest.raises(ConfigError, match=re.escape(message)):
        await prism_gateway(
            catalog,
            config={"services": choice},
            plugins=[(Exporter(), "exporter")],
            load_plugins=["openai"],
        )


class Needy:
    @hookimpl
    def prism_generation(self, generation: Generation) -> None:
        generation.services.require(SHARED_STATE, by="needy")


async def test_a_missing_service_names_who_would_provide_it(prism_gateway, catalog):
    with pytest.raises(ConfigError) as caught:
        await prism_gateway(catalog, plugins=[(Needy(), "needy")], load_plugins=["openai"])
    assert "plugin needy: needs the shared-state service" in str(caught.value)
    assert "install and configure prism-redis" in str(caught.value)


class Liar:
    @hookimpl
    def prism_services(self, generation: Generation) -> list[Any]:
        return [provide(CAPACITY, lambda: "not capacity")]  # type: ignore[arg-type,return-value]


async def test_a_provider_of_the_wrong_type_is_named(prism_gateway, catalog):
    with pytest.raises(ConfigError, match=r"plugin liar: provided the capacity service as str"):
        await prism_gateway(catalog, plugins=[(Liar(), "liar")], load_plugins=["openai"])


class OldStyle:
    """A plugin written before services: it assigns the generation's capacity."""

    def __init__(self) -> None:
        self.capacity = Capacity()

    @hookimpl
    def prism_generation(self, generation: Generation) -> None:
        generation.capacity = self.capacity


async def test_assigning_a_service_still_works_for_one_release_with_a_warning(
    prism_gateway, catalog
):
    old = OldStyle()
    with pytest.warns(DeprecationWarning, match="assigning generation.capacity is deprecated"):
        gw = await prism_gateway(catalog, plugins=[(old, "old")], load_plugins=["openai"])
    assert gw.gateway.current.capacity is old.capacity


def test_the_plugin_guide_lists_every_service():
    text = GUIDE.read_text()
    for name, service in SERVICES.items():
        constant = next(k for k, v in vars(__import__("prism_proxy")).items() if v is service)
        assert f"| `{name}` | `{constant}` | `{service.type.__name__}` |" in text, name


def guide_example() -> types.ModuleType:
    """The guide's complete example (the block that declares ``HelloSettings``), as a module."""
    blocks = re.findall(r"```python\n(.*?)```", GUIDE.read_text(), flags=re.S)
    (source,) = [block for block in blocks if "class HelloSettings" in block]
    module = types.ModuleType("hello_from_the_guide")
    exec(compile(source, "plugin-guide.md", "exec"), module.__dict__)
    return module


async def test_the_guides_complete_example_runs(prism_gateway, catalog):
    hello = guide_example()
    gw = await prism_gateway(
        catalog,
        sections={"hello": {"greeting": "hi there"}},
        plugins=[(hello, "hello")],
        load_plugins=["openai"],
    )
    response = await call(gw)
    assert response.headers["x-hello"] == "hi there"
    assert "x-hello-fleet" not in response.headers  # no prism-redis, no SHARED_STATE

    with pytest.raises(ConfigError, match=r"\[prism:hello\] greeting: longer than max_length"):
        await prism_gateway(
            catalog,
            sections={"hello": {"greeting": "x" * 10, "max_length": 4}},
            plugins=[(guide_example(), "hello")],
            load_plugins=["openai"],
        )
    with pytest.raises(ConfigError, match=r"\[prism:hello\] greting: unknown key"):
        await prism_gateway(
            catalog,
            sections={"hello": {"greting": "hi"}},
            plugins=[(guide_example(), "hello")],
            load_plugins=["openai"],
        )


async def test_the_deprecated_link_lookup_warns(prism_gateway, catalog, prism_redis):
    gw = await prism_gateway(
        catalog,
        sections={"redis": {"url": prism_redis.url, "key_prefix": prism_redis.prefix}},
        load_plugins=["openai", "redis"],
    )
    generation = gw.gateway.current
    with pytest.warns(DeprecationWarning, match=r"SHARED_STATE"):
        link = generation.plugin("redis.link")
    assert link.shared is generation.services.get(SHARED_STATE)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        assert generation.services.provider(SHARED_STATE) == "redis"
        assert generation.services.provider(CAPACITY) == "redis"
