"""A generation: everything built from one loaded configuration.

Configuration, catalog, the plugins' objects, provider pools and the typed
hooks: :func:`build_generation` makes them together, and nothing else in the
process changes when the configuration does.  A reload builds the next
generation beside the running one and swaps it in; calls finish on the
generation they started on, and a generation stops once it is retired and
its last call is done.

What must outlive a configuration (a breaker's state, the ledger writer,
the key ring) is *kept*: :meth:`Generation.keep` hands a new generation the
object a previous one made under the same key, and the :class:`Keeper`
opens it once and closes it after its last generation stopped.
"""

from __future__ import annotations

import asyncio
import collections
import contextlib
import logging
import os
import random as random_module
import warnings
from collections.abc import (
    AsyncIterator,
    Awaitable,
    Callable,
    Hashable,
    Iterable,
    Iterator,
    Mapping,
)
from typing import Any, Protocol, TypeVar, cast

import attrs
import pluggy

from .capacity import Capacity
from .catalog import Binding, Catalog, load_catalog
from .clock import Clock, LoopClock
from .config import Config
from .deadlines import Deadlines
from .errors import ConfigError
from .hotpath import TRACE_ENV, Hooks, trace_hooks
from .orgs import OrgSetting
from .plugins import (
    disabled_owner,
    make_plugin_manager,
    org_settings,
    param_profiles,
    provider_kinds,
)
from .providers import ParamProfile, Provider
from .selflink import SelfLink
from .services import CAPACITY, TELEMETRY, Offer, Services
from .telemetry import Telemetry
from .wire import Wires, default_wires

__all__ = ["Generation", "Keeper", "Lifecycle", "build_generation"]

log = logging.getLogger("prism")

T = TypeVar("T")


class Lifecycle(Protocol):
    """An object with an async ``lifecycle()``: open, yield while in use, then close."""

    def lifecycle(self) -> AsyncIterator[None]: ...


L = TypeVar("L", bound=Lifecycle)


@attrs.define(eq=False)
class _Kept:
    resource: Lifecycle
    users: set[int]
    running: AsyncIterator[None] | None = None


@attrs.define(eq=False)
class Keeper:
    """Objects shared by every generation that asks for the same key, opened once."""

    _held: dict[Hashable, _Kept] = attrs.field(factory=dict)

    def take(self, key: Hashable, make: Callable[[], L], user: int) -> L:
        kept = self._held.get(key)
        if kept is None:
            kept = self._held[key] = _Kept(make(), set())
        kept.users.add(user)
        resource: L = kept.resource  # type: ignore[assignment]
        return resource

    def abandon(self, user: int) -> None:
        """Forget ``user``, a generation that was never started (its build failed)."""
        for key, kept in list(self._held.items()):
            kept.users.discard(user)
            if not kept.users and kept.running is None:
                del self._held[key]

    async def open(self, user: int) -> None:
        for kept in list(self._held.values()):
            if user in kept.users and kept.running is None:
                running = kept.resource.lifecycle()
                await anext(running)
                kept.running = running

    async def release(self, user: int) -> None:
        """Close what ``user`` alone still held, last taken first."""
        for key, kept in reversed(list(self._held.items())):
            if user not in kept.users:
                continue
            kept.users.discard(user)
            if kept.users:
                continue
            del self._held[key]
            if kept.running is not None:
                with contextlib.suppress(StopAsyncIteration):
                    await anext(kept.running)
                    log.error("%r: lifecycle did not stop after one yield", kept.resource)


@attrs.define(eq=False)
class Generation:
    """Everything built from one configuration.

    Plugins build their objects for it in ``prism_generation`` and
    :meth:`register` them; the per-call hooks are methods of those objects.
    ``time`` (the :class:`~prism_proxy.clock.Clock` deadlines, pauses and
    the stream watchdog keep to) and ``random`` are the process's (tests
    inject their own); ``clock`` and ``sleep`` are ``time.now`` and
    ``time.sleep`` unless given apart; ``counters`` outlive generations.
    """

    number: int
    config: Config
    catalog: Catalog
    pm: pluggy.PluginManager
    keeper: Keeper
    time: Clock = attrs.field(factory=LoopClock)
    #: What calls and attempts are stamped with (``time.now``).
    clock: Callable[[], float] = attrs.field(
        default=attrs.Factory(lambda self: self.time.now, takes_self=True)
    )
    #: The pause between retries (``time.sleep``).
    sleep: Callable[[float], Awaitable[None]] = attrs.field(
        default=attrs.Factory(lambda self: self.time.sleep, takes_self=True)
    )
    random: Callable[[], float] = random_module.random
    counters: collections.Counter[str] = attrs.field(factory=collections.Counter)
    providers: dict[str, Provider] = attrs.field(factory=dict)
    #: The organisation settings plugins declare (``prism_org_settings``), by name.
    org_settings: dict[str, OrgSetting] = attrs.field(factory=dict)
    #: Capacity slots of lines with ``max_concurrency`` (the ``CAPACITY`` service).
    _capacity: Capacity = attrs.field(factory=Capacity)
    #: The attempts' deadlines (one timer per tenth of a second, not one per attempt).
    deadlines: Deadlines = attrs.field(
        default=attrs.Factory(lambda self: Deadlines(self.time), takes_self=True)
    )
    #: Where plugins report measurements (the ``TELEMETRY`` service).
    _telemetry: Telemetry = attrs.field(factory=Telemetry)
    #: What the plugins provide to each other (``prism_services``), typed.
    services: Services = attrs.field(
        default=attrs.Factory(lambda self: Services(self.config, self), takes_self=True)
    )
    #: How the gateway reaches itself (shared by its generations).
    self_link: SelfLink = attrs.field(factory=SelfLink)
    #: The wire formats and translations the plugins registered (``prism_wires``).
    wires: Wires = attrs.field(factory=lambda: Wires.of(default_wires()))
    #: The parameter profiles the plugins ship (``prism_param_profiles``), by family.
    param_profiles: Mapping[str, ParamProfile] = attrs.field(factory=dict)
    #: The operator traffic kinds plugins register (``prism_traffic_kinds``): the
    #: values ``x-prism-traffic`` may take.
    traffic_kinds: frozenset[str] = frozenset()
    #: Per-generation tasks and resources: like aiohttp's ``cleanup_ctx``, each
    #: runs to its ``yield`` when the generation starts and on when it stops.
    cleanup_ctx: list[Callable[[], AsyncIterator[None]]] = attrs.field(factory=list)
    #: Calls started on this generation and not yet settled.
    in_flight: int = 0
    #: A newer generation serves new calls; this one stops when ``in_flight`` is 0.
    retired: bool = False
    #: Names of the objects plugins registered for this generation.
    objects: list[str] = attrs.field(factory=list)
    #: Registered names other plugins should no longer look up, with what to use instead.
    _deprecated_names: dict[str, str] = attrs.field(factory=dict)
    _hooks: Hooks | None = None
    _memos: dict[str, Any] = attrs.field(factory=dict)
    _running: list[AsyncIterator[None]] = attrs.field(factory=list)
    _stopped: asyncio.Event | None = None

    @property
    def capacity(self) -> Capacity:
        """The ``CAPACITY`` service, read on every attempt (hence kept on an attribute)."""
        return self._capacity

    @capacity.setter
    def capacity(self, value: Capacity) -> None:
        warnings.warn(
            "assigning generation.capacity is deprecated: provide the CAPACITY service "
            "from prism_services (provide(CAPACITY, make))",
            DeprecationWarning,
            stacklevel=2,
        )
        self._capacity = value

    @property
    def telemetry(self) -> Telemetry:
        """The ``TELEMETRY`` service."""
        return self._telemetry

    @telemetry.setter
    def telemetry(self, value: Telemetry) -> None:
        warnings.warn(
            "assigning generation.telemetry is deprecated: provide the TELEMETRY service "
            "from prism_services (provide(TELEMETRY, make))",
            DeprecationWarning,
            stacklevel=2,
        )
        self._telemetry = value

    @property
    def hooks(self) -> Hooks:
        if self._hooks is None:
            self._hooks = Hooks.of(self.pm, trace=bool(os.environ.get(TRACE_ENV)))
        return self._hooks

    def register(self, plugin: object, name: str, *, deprecated: str | None = None) -> None:
        """Register a plugin's object for this generation, checked as at start-up.

        An unknown ``prism_*`` hook name on it (``prism_setle``) stops the
        build with a configuration error naming the plugin.  ``deprecated``
        says what other plugins should use instead of looking the object up
        by ``name`` (:meth:`plugin` then warns them).
        """
        if deprecated is not None:
            self._deprecated_names[name] = deprecated
        self.pm.register(plugin, name)
        try:
            self.pm.check_pending()
        except pluggy.PluginValidationError as exc:
            self.pm.unregister(plugin)
            raise ConfigError(self.config.source, f"plugin {name}", str(exc)) from None
        self.objects.append(name)
        self._hooks = None

    def loaded(self) -> list[str]:
        """The plugins loaded for this configuration (not their per-generation objects)."""
        return sorted(
            name
            for name, plugin in self.pm.list_name_plugin()
            if plugin is not None and name not in self.objects
        )

    def plugin(self, name: str) -> Any:
        """The object registered under ``name`` in this generation, or None.

        For a plugin's own objects: what plugins share goes through
        :attr:`services`.
        """
        instead = self._deprecated_names.get(name)
        if instead is not None:
            warnings.warn(
                f"generation.plugin({name!r}) is deprecated: {instead}",
                DeprecationWarning,
                stacklevel=2,
            )
        return self.pm.get_plugin(name)

    def keep(self, key: Hashable, make: Callable[[], L]) -> L:
        """The object a previous generation kept under ``key``, else ``make()``.

        Kept objects are opened (their ``lifecycle()`` run to its yield)
        when the first generation holding them starts, and closed when the
        last one stops.  Put into the key whatever makes an object unfit to
        share: the file it writes, not the thresholds it applies.
        """
        return self.keeper.take(key, make, self.number)

    def added_lines(self) -> list[tuple[str, Binding]]:
        """Every chain line plugins add beyond the models' chains (``prism_catalog_lines``),
        with its catalog address; asked once per generation."""
        return self.memo(
            "prism.added_lines",
            lambda: [
                line
                for answer in self.pm.hook.prism_catalog_lines(generation=self)
                for line in answer or ()
            ],
        )

    def memo(self, key: str, make: Callable[[], T]) -> T:
        """``make()`` once per generation: a value several of one plugin's hooks share."""
        if key not in self._memos:
            self._memos[key] = make()
        value: T = self._memos[key]
        return value

    async def start(self) -> None:
        """Open kept objects, provider pools and per-generation tasks; undo all on failure."""
        try:
            await self.keeper.open(self.number)
            await asyncio.gather(*(provider.start() for provider in self.providers.values()))
            for context in self.cleanup_ctx:
                running = context()
                await anext(running)
                self._running.append(running)
        except BaseException:
            await self.stop()
            raise

    async def stop(self) -> None:
        """Stop per-generation tasks, close provider pools, release kept objects."""
        if self._stopped is not None:
            await self._stopped.wait()
            return
        self._stopped = asyncio.Event()
        try:
            while self._running:
                running = self._running.pop()
                with contextlib.suppress(StopAsyncIteration):
                    await anext(running)
            await asyncio.gather(*(provider.close() for provider in self.providers.values()))
            await self.keeper.release(self.number)
        finally:
            self._stopped.set()


def build_generation(
    config: Config,
    *,
    number: int = 1,
    keeper: Keeper | None = None,
    self_link: SelfLink | None = None,
    plugins: Iterable[tuple[object, str]] = (),
    load_entrypoints: bool = True,
    time: Clock | None = None,
    clock: Callable[[], float] | None = None,
    sleep: Callable[[float], Awaitable[None]] | None = None,
    random: Callable[[], float] = random_module.random,
    counters: collections.Counter[str] | None = None,
) -> Generation:
    """Build (not start) the generation ``config`` describes; raises ``ConfigError``.

    Nothing here touches a file or the network: ``prism check`` builds a
    generation and never starts it.  ``time`` is the clock (the real one if
    None); ``clock`` and ``sleep`` replace its ``now`` and ``sleep`` alone.
    """
    time = time if time is not None else LoopClock()
    pm = make_plugin_manager(config, extra_plugins=plugins, load_entrypoints=load_entrypoints)
    kinds = provider_kinds(config, pm)
    catalog = load_catalog(
        config.catalog_path,
        data=config.catalog_data,
        kinds=kinds,
        extra_keys=[keys for keys in pm.hook.prism_catalog_keys() if keys is not None],
        disabled_owner=disabled_owner(config),
    )
    try:
        wires = Wires.of(item for answer in pm.hook.prism_wires() for item in answer or ())
    except ValueError as exc:
        raise ConfigError(config.source, "plugins", str(exc)) from None
    profiles = param_profiles(config, pm)
    generation = Generation(
        number=number,
        traffic_kinds=traffic_kinds(config, pm),
        org_settings=org_settings(config, pm),
        wires=wires,
        param_profiles=profiles,
        config=config,
        catalog=catalog,
        pm=pm,
        keeper=keeper if keeper is not None else Keeper(),
        time=time,
        clock=clock if clock is not None else time.now,
        sleep=sleep if sleep is not None else time.sleep,
        random=random,
        counters=counters if counters is not None else collections.Counter(),
        self_link=self_link if self_link is not None else SelfLink(),
    )
    try:
        generation.services = Services.collect(config, generation, _offers(pm, generation))
        # Read on every call: resolved once, before any plugin builds its objects.
        generation._capacity = generation.services.require(CAPACITY, by="core")
        generation._telemetry = generation.services.require(TELEMETRY, by="core")
        pm.hook.prism_generation(generation=generation)
    except BaseException:
        generation.keeper.abandon(number)
        raise
    generation.providers = {
        name: kinds[spec.kind](spec) for name, spec in catalog.providers.items()
    }
    for provider in generation.providers.values():
        provider.param_profiles = profiles
    if os.environ.get(TRACE_ENV):
        trace_hooks(pm)
    return generation


def _offers(
    pm: pluggy.PluginManager, generation: Generation
) -> Iterator[tuple[str, Iterable[Offer[Any]]]]:
    """Every plugin's ``prism_services`` answer, with the plugin's name.

    Each implementation is called on its own (not through the hook caller)
    because the answer must be credited to the plugin that gave it.
    """
    for impl in pm.hook.prism_services.get_hookimpls():
        answer = impl.function(**{name: generation for name in impl.argnames})
        if answer is not None:
            yield impl.plugin_name, cast("Iterable[Offer[Any]]", answer)


def traffic_kinds(config: Config, pm: pluggy.PluginManager) -> frozenset[str]:
    """The kinds ``x-prism-traffic`` may name: those the loaded plugins register."""
    kinds = frozenset(kind for answer in pm.hook.prism_traffic_kinds() for kind in answer or ())
    for kind in kinds:
        # Operator traffic is billed to nobody: a plugin registering the callers'
        # own kind (or a blank) would make the mark mean its opposite.
        if not isinstance(kind, str) or not kind.strip() or kind == "customer":
            raise ConfigError(
                config.source,
                "plugins",
                f"prism_traffic_kinds: {kind!r} is not a traffic kind a plugin may "
                "register (a non-empty name other than 'customer')",
            )
    return kinds
