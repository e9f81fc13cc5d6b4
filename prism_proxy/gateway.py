"""The gateway: the generation serving new calls, and reloading the next one beside it."""

from __future__ import annotations

import asyncio
import collections
import logging
import random
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import Any

import attrs
from aiohttp import web

from .clock import Clock, LoopClock
from .config import Config, load_config
from .errors import ConfigError
from .generation import Generation, Keeper, build_generation
from .selflink import SelfLink

__all__ = ["GATEWAY", "Gateway"]

log = logging.getLogger("prism")


@attrs.define(eq=False)
class Gateway:
    """One app's gateway: its current generation, the retired ones still draining, counters.

    ``time`` is the clock deadlines, pauses and the stream watchdog keep to;
    ``clock`` and ``sleep`` (its ``now`` and ``sleep`` unless given apart)
    stamp calls and pause between retries; ``random`` is the jitter source.
    Tests inject their own; every generation gets the same ones.
    """

    #: The generation new calls run on.
    current: Generation = attrs.field(init=False)
    time: Clock = attrs.field(factory=LoopClock)
    clock: Callable[[], float] = attrs.field(
        default=attrs.Factory(lambda self: self.time.now, takes_self=True)
    )
    sleep: Callable[[float], Awaitable[None]] = attrs.field(
        default=attrs.Factory(lambda self: self.time.sleep, takes_self=True)
    )
    random: Callable[[], float] = random.random
    #: Event counters (``chain_exceeded_max_time``, ``reloads`` …), served at GET /prism/stats.
    counters: collections.Counter[str] = attrs.field(factory=collections.Counter)
    #: What plugins registered beside the installed ones (tests, embedding apps).
    plugins: tuple[tuple[object, str], ...] = ()
    load_entrypoints: bool = True
    ready: bool = False
    #: Retired generations whose calls are still running.
    draining_generations: set[Generation] = attrs.field(factory=set)
    keeper: Keeper = attrs.field(factory=Keeper)
    #: Its own URL and internal token, handed to every generation.
    self_link: SelfLink = attrs.field(factory=SelfLink)
    _reload_lock: asyncio.Lock = attrs.field(factory=asyncio.Lock)
    _stopping: set[asyncio.Task[None]] = attrs.field(factory=set)

    @property
    def draining(self) -> bool:
        """Stopping: ``/readyz`` says 503, and plugins' calls to the gateway itself stop.

        Kept on the :class:`SelfLink` every generation shares, so a plugin learns
        it from its generation (``generation.self_link.draining``).
        """
        return self.self_link.draining

    def start_draining(self) -> None:
        """Mark the gateway draining: done before its port closes (and again at shutdown)."""
        self.self_link.draining = True

    @property
    def config(self) -> Config:
        return self.current.config

    @classmethod
    def for_config(cls, config: Config, **kwargs: Any) -> Gateway:
        """A gateway whose first generation is built (not started) from ``config``."""
        gateway = cls(**kwargs)
        gateway.current = gateway.build(config, number=1)
        return gateway

    def build(self, config: Config, *, number: int | None = None) -> Generation:
        """The next generation for ``config`` (built, not started); raises ``ConfigError``."""
        return build_generation(
            config,
            number=number if number is not None else self.current.number + 1,
            keeper=self.keeper,
            plugins=self.plugins,
            load_entrypoints=self.load_entrypoints,
            time=self.time,
            clock=self.clock,
            sleep=self.sleep,
            random=self.random,
            counters=self.counters,
            self_link=self.self_link,
        )

    async def reload(self, config: Config | None = None) -> Generation:
        """Build and start the next generation, then serve new calls from it.

        ``config`` None re-reads the file the running configuration came
        from.  A configuration that fails to load or start is refused
        (``ConfigError``, logged and counted) and the running generation
        keeps serving; calls in flight finish on the generation they began on.
        """
        async with self._reload_lock:
            try:
                if config is None:
                    config = load_config(self.current.config.source)
                following = self.build(config)
                await following.start()
            except Exception as exc:
                self.counters["reloads_refused"] += 1
                log.error(
                    "reload refused, generation %d keeps serving: %s", self.current.number, exc
                )
                if isinstance(exc, ConfigError):
                    raise
                source = (config or self.current.config).source
                raise ConfigError(source, "reload", str(exc)) from exc
            previous, self.current = self.current, following
            self.counters["reloads"] += 1
            log.info("generation %d serving (reloaded from %s)", following.number, config.source)
            self._retire(previous)
            return following

    def _retire(self, generation: Generation) -> None:
        generation.retired = True
        self.draining_generations.add(generation)
        if generation.in_flight == 0:
            self._stop_soon(generation)

    def enter(self) -> Generation:
        """The generation a new call runs on, counted in flight until :meth:`leave`."""
        generation = self.current
        generation.in_flight += 1
        return generation

    def leave(self, generation: Generation) -> None:
        generation.in_flight -= 1
        if generation.retired and generation.in_flight == 0:
            self._stop_soon(generation)

    def _stop_soon(self, generation: Generation) -> None:
        async def stop() -> None:
            try:
                await generation.stop()
            finally:
                self.draining_generations.discard(generation)
                log.info("generation %d stopped", generation.number)

        task = asyncio.get_running_loop().create_task(
            stop(), name=f"prism-stop-{generation.number}"
        )
        self._stopping.add(task)
        task.add_done_callback(self._stopping.discard)

    async def lifecycle(self, app: web.Application) -> AsyncIterator[None]:
        """cleanup_ctx: start the first generation; at shutdown stop every generation."""
        await self.current.start()
        self.ready = True
        yield
        self.ready = False
        for generation in [*self.draining_generations, self.current]:
            await generation.stop()

    async def on_shutdown(self, app: web.Application) -> None:
        # For an app run by another runner; prism's own drain marked it before closing.
        self.start_draining()


GATEWAY = web.AppKey("prism_gateway", Gateway)
