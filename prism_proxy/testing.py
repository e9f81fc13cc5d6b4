"""A pytest plugin for testing Prism and Prism plugins through the real server.

Installed with ``prism-llm-gateway`` (entry point ``pytest11``), so a vendor's
provider plugin is tested exactly the way the core's are:

- ``prism_fake``: a running fake upstream (needs ``prism-fake-upstream``);
- ``prism_plugin``: ``prism_plugin(obj, "name")`` registers a plugin object in
  every gateway the test starts afterwards;
- ``prism_gateway``: ``await prism_gateway(catalog, config={...}, sections={...})``
  starts the real app on a loopback port and returns a :class:`GatewayUnderTest`;
  ``load_plugins=[...]`` loads only the installed plugins named;
- ``prism_clock``: a :class:`~prism_proxy.clock.ManualClock` for
  ``prism_gateway(..., clock=prism_clock)`` (and ``prism_fake.clock``):
  deadlines, retry pauses, the stream watchdog and the fake's stalls then
  happen when the test advances it, taking no real time; :func:`eventually`
  waits (bounded) for what must have happened before it does;
- :func:`free_port` and :func:`serve_process`: ``prism serve`` as a real
  process, for what only a process shows (signals, a crash, a restart).

The fixtures of a service a plugin speaks ship with that plugin's own pytest
plugin: ``prism_redis`` with prism-redis (``prism_redis.testing``),
``prism_postgres`` with prism-billing (``prism_billing.testing``).
"""

from __future__ import annotations

import asyncio
import contextlib
import errno
import importlib
import importlib.metadata
import os
import random as random_module
import resource
import socket
import sys
import time
import warnings
from collections.abc import (
    AsyncIterator,
    Awaitable,
    Callable,
    Iterable,
    Iterator,
    Mapping,
    Sequence,
)
from pathlib import Path
from typing import TYPE_CHECKING, Any, Protocol

import attrs
import pytest
from aiohttp import web

from .app import create_app
from .clock import Clock, ManualClock
from .config import config_from_mapping
from .gateway import GATEWAY, Gateway
from .server import Listening, listen, listen_options

if TYPE_CHECKING:
    import anthropic
    import openai
    from prism_fake_upstream import FakeUpstream

__all__ = [
    "GatewayUnderTest",
    "PluginRegistry",
    "Sleeps",
    "StartGateway",
    "ToolRoundTrip",
    "eventually",
    "free_port",
    "installed_plugins",
    "openai_tool_round_trip",
    "out_of_file_handles",
    "serve_process",
]


#: Names that moved to a plugin's pytest plugin: importable from here for one
#: release, with a DeprecationWarning.
_MOVED = {
    "RedisUnderTest": "prism_redis.testing",
    "REDIS_SERVER": "prism_redis.testing",
    "POSTGRES_SERVER": "prism_billing.testing",
}


def __getattr__(name: str) -> Any:
    module = _MOVED.get(name)
    if module is None:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    warnings.warn(
        f"prism_proxy.testing.{name} moved to {module}.{name}",
        DeprecationWarning,
        stacklevel=2,
    )
    return getattr(importlib.import_module(module), name)


@attrs.define(eq=False)
class GatewayUnderTest:
    app: web.Application
    listening: Listening

    @property
    def url(self) -> str:
        return self.listening.url

    @property
    def base_url(self) -> str:
        """What an OpenAI SDK's ``base_url`` should be."""
        return self.listening.url + "/v1"

    @property
    def gateway(self) -> Gateway:
        return self.app[GATEWAY]

    def openai(self, **kwargs: Any) -> openai.AsyncOpenAI:
        """An ``openai.AsyncOpenAI`` client for this gateway, with SDK retries off."""
        import openai

        kwargs.setdefault("api_key", "prism-test")
        kwargs.setdefault("max_retries", 0)
        return openai.AsyncOpenAI(base_url=self.base_url, **kwargs)

    def anthropic(self, **kwargs: Any) -> anthropic.AsyncAnthropic:
        """An ``anthropic.AsyncAnthropic`` client for this gateway, with SDK retries off."""
        import anthropic

        kwargs.setdefault("api_key", "prism-test")
        kwargs.setdefault("max_retries", 0)
        return anthropic.AsyncAnthropic(base_url=self.listening.url, **kwargs)

    async def stop(self) -> None:
        await self.listening.stop()


@attrs.define
class PluginRegistry:
    plugins: list[tuple[object, str]] = attrs.field(factory=list)

    def __call__(self, plugin: object, name: str) -> None:
        self.plugins.append((plugin, name))


class StartGateway(Protocol):
    def __call__(
        self,
        catalog: Mapping[str, Any],
        *,
        config: Mapping[str, Any] | None = None,
        sections: Mapping[str, Mapping[str, Any]] | None = None,
        plugins: Iterable[tuple[object, str]] = (),
        clock: Clock | Callable[[], float] | None = None,
        sleep: Callable[[float], Awaitable[None]] | None = None,
        random: Callable[[], float] = random_module.random,
        base_dir: Path | None = None,
        load_plugins: Iterable[str] | None = None,
    ) -> Awaitable[GatewayUnderTest]: ...


async def eventually(
    check: Callable[[], bool], *, timeout_s: float = 5.0, what: str | None = None
) -> None:
    """Return once ``check()`` is true; fail the test after ``timeout_s`` of real time.

    For what a test must see happen (a request reaching the fake, an event
    reaching the client) before it advances a manual clock.
    """
    deadline = time.monotonic() + timeout_s
    while not check():
        if time.monotonic() > deadline:
            raise AssertionError(f"not within {timeout_s:g} s: {what or check}")
        await asyncio.sleep(0.002)


class Sleeps(list[float]):
    """An injected ``sleep`` (``prism_gateway(..., sleep=Sleeps())``): records
    each wait and returns at once, so retry pauses are asserted, never taken."""

    async def __call__(self, seconds: float) -> None:
        self.append(seconds)


@attrs.frozen
class ToolRoundTrip:
    """What :func:`openai_tool_round_trip` saw: the model's one tool call, and
    the answer to the request that carried the tool's result back."""

    call_id: str
    name: str
    arguments: str
    answer: Any


async def openai_tool_round_trip(
    client: openai.AsyncOpenAI,
    tool: Mapping[str, Any],
    result: str,
    *,
    stream: bool,
    prompt: str = "Weather in Paris?",
    model: str = "m",
) -> ToolRoundTrip:
    """An OpenAI chat caller's tool round trip through the gateway.

    The caller forces ``tool`` (``tool_choice="required"``), streamed or not,
    and the answer must be exactly one call of it finishing with
    ``tool_calls``; the call and ``result`` (the tool's message content) are
    then sent back with the same tools, unstreamed.  What a translation made
    of either request is the provider's to check, in the fake's record.
    """
    from openai.types.chat import ChatCompletionMessageFunctionToolCall

    tools: Any = [tool]
    messages: list[Any] = [{"role": "user", "content": prompt}]
    if stream:
        chunks = [
            chunk
            async for chunk in await client.chat.completions.create(
                model=model, messages=messages, tools=tools, tool_choice="required", stream=True
            )
        ]
        deltas = [
            call
            for chunk in chunks
            if chunk.choices
            for call in chunk.choices[0].delta.tool_calls or ()
        ]
        assert deltas, "the stream carried no tool call"
        assert {call.index for call in deltas} == {deltas[0].index}, "more than one tool call"
        call_id, name = deltas[0].id, deltas[0].function and deltas[0].function.name
        arguments = "".join((call.function and call.function.arguments) or "" for call in deltas)
        finish = [
            c.choices[0].finish_reason for c in chunks if c.choices and c.choices[0].finish_reason
        ]
    else:
        completion = await client.chat.completions.create(
            model=model, messages=messages, tools=tools, tool_choice="required"
        )
        made = completion.choices[0].message.tool_calls or []
        assert len(made) == 1, made
        [call] = made
        assert isinstance(call, ChatCompletionMessageFunctionToolCall), call
        call_id, name, arguments = call.id, call.function.name, call.function.arguments
        finish = [completion.choices[0].finish_reason]
    assert finish == ["tool_calls"], finish
    assert call_id and name, (call_id, name)
    messages += [
        {
            "role": "assistant",
            "content": None,
            "tool_calls": [
                {
                    "id": call_id,
                    "type": "function",
                    "function": {"name": name, "arguments": arguments},
                }
            ],
        },
        {"role": "tool", "tool_call_id": call_id, "content": result},
    ]
    answer = await client.chat.completions.create(model=model, messages=messages, tools=tools)
    return ToolRoundTrip(call_id, name, arguments, answer)


def _lowest_free_fd() -> int:
    fd = 0
    while True:
        try:
            os.fstat(fd)  # opens nothing, unlike listing /proc/self/fd
        except OSError:
            return fd
        fd += 1


@contextlib.contextmanager
def out_of_file_handles() -> Iterator[None]:
    """The process cannot open one more file, as when slow connections used them all up.

    ``RLIMIT_NOFILE`` bounds descriptor numbers, not how many are open: the soft
    limit goes to the lowest free number, leaving no handle to spare.
    """
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    resource.setrlimit(resource.RLIMIT_NOFILE, (_lowest_free_fd(), hard))
    try:
        with pytest.raises(OSError) as refused:
            open(os.devnull).close()
        assert refused.value.errno == errno.EMFILE
        yield
    finally:
        resource.setrlimit(resource.RLIMIT_NOFILE, (soft, hard))


def installed_plugins() -> list[str]:
    """The names of the installed plugins (the ``prism_proxy`` entry points)."""
    return sorted({ep.name for ep in importlib.metadata.entry_points(group="prism_proxy")})


def free_port() -> int:
    """A loopback port that was free a moment ago (for a ``listen =`` line)."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


async def serve_process(
    config: Path,
    port: int,
    *,
    env: Mapping[str, str] | None = None,
    stderr: Any = asyncio.subprocess.PIPE,
    timeout_s: float = 40.0,
    args: Sequence[str] = (),
    wrapper: Sequence[str] = (),
    cwd: Path | None = None,
) -> asyncio.subprocess.Process:
    """Start ``prism serve --config config`` and return once its ``/readyz`` answers 200.

    ``port`` must be the one the config listens on.  ``args`` go after
    ``--config``; ``wrapper`` is a command that execs the rest (a sandbox, say).
    The caller stops the process (SIGTERM to drain, SIGKILL to crash it).
    ``timeout_s`` is generous: a start (imports, plugins, the state files)
    takes well under a second alone, but 15 s and more on a machine whose
    cores the rest of the suite keeps busy.
    """
    import aiohttp

    process = await asyncio.create_subprocess_exec(
        *wrapper,
        sys.executable,
        "-m",
        "prism_proxy.cli",
        "serve",
        "--config",
        str(config),
        *args,
        stderr=stderr,
        env={**os.environ, **(env or {})},
        cwd=cwd,
    )
    deadline = time.monotonic() + timeout_s
    async with aiohttp.ClientSession() as session:
        while time.monotonic() < deadline and process.returncode is None:
            try:
                async with session.get(f"http://127.0.0.1:{port}/readyz") as response:
                    if response.status == 200:
                        return process
            except aiohttp.ClientConnectionError:
                pass
            await asyncio.sleep(0.05)
    if process.returncode is None:
        process.kill()
    await process.wait()
    raise AssertionError(f"prism serve --config {config} did not become ready")


@pytest.fixture
async def prism_fake() -> AsyncIterator[FakeUpstream]:
    """A fake upstream on a free loopback port; ``fake.base_url("ok")`` for a catalog."""
    from prism_fake_upstream import FakeUpstream

    async with FakeUpstream() as fake:
        yield fake


@pytest.fixture
def prism_plugin() -> PluginRegistry:
    return PluginRegistry()


@pytest.fixture
def prism_clock() -> ManualClock:
    """A manual clock at 1000.0 s; pass it as ``clock=`` and set ``prism_fake.clock`` to it."""
    return ManualClock()


@pytest.fixture
async def prism_gateway(prism_plugin: PluginRegistry) -> AsyncIterator[StartGateway]:
    started: list[GatewayUnderTest] = []

    async def start(
        catalog: Mapping[str, Any],
        *,
        config: Mapping[str, Any] | None = None,
        sections: Mapping[str, Mapping[str, Any]] | None = None,
        plugins: Iterable[tuple[object, str]] = (),
        clock: Clock | Callable[[], float] | None = None,
        sleep: Callable[[float], Awaitable[None]] | None = None,
        random: Callable[[], float] = random_module.random,
        base_dir: Path | None = None,
        load_plugins: Iterable[str] | None = None,
    ) -> GatewayUnderTest:
        core = dict(config or {})
        extra = [*prism_plugin.plugins, *plugins]
        if load_plugins is not None:
            # Every installed plugin not named (nor registered by the test) is
            # disabled, before it is imported.
            wanted = {*load_plugins, *(name for _, name in extra)}
            core["disable"] = sorted(
                {*installed_plugins()} - wanted | set(core.get("disable") or ())
            )
        cfg = config_from_mapping(
            core,
            sections,
            source="<test config>",
            base_dir=base_dir,
            catalog_data=dict(catalog),
        )
        app = create_app(
            cfg,
            plugins=extra,
            clock=clock,
            sleep=sleep,
            random=random,
        )
        listening = await listen(
            app, "127.0.0.1", 0, counters=app[GATEWAY].counters, **listen_options(cfg)
        )
        gateway = GatewayUnderTest(app, listening)
        started.append(gateway)
        return gateway

    yield start
    for gateway in reversed(started):
        await gateway.stop()
