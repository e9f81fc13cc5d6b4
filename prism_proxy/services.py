"""Services: what one plugin provides and others consume, declared by the core, typed.

A :class:`Service` names a thing one plugin may provide to the others (the
capacity slots, the telemetry exporter, the breaker's state store, the link
to the engine gateways share state through) and the type consumers get.
Providing and consuming are two phases of building a generation:

1. **Provide.**  Every loaded plugin's ``prism_services(generation)`` returns
   its offers, ``provide(SERVICE, make)``.  Two plugins offering one service
   stop the build naming both, unless ``[prism] services`` names the one to
   use (``services = capacity:redis``).
2. **Consume.**  In ``prism_generation`` (and later) a plugin asks
   ``generation.services.get(SERVICE)``: the provider's ``make()`` runs
   once, on first use, and may itself ask for other services; the answer
   is checked against the service's type.  ``require`` is ``get`` that
   refuses to start without one, naming the plugins that would provide it.

Nothing depends on the order plugins are registered in: a plugin that
consumes a service never has to run after the one providing it.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Iterator, Mapping
from contextlib import AbstractContextManager
from typing import TYPE_CHECKING, Any, Generic, Protocol, TypeVar, runtime_checkable

import attrs

from .admin_services import BreakerOverrides, KeyAdmin, LimitsView, UsageReport
from .breakerstate import BreakerView, StoreProvider
from .capacity import Capacity
from .errors import ConfigError
from .principals import Principals
from .response_store import ResponseStore, default_store
from .spend import Pricing, SpendLedger
from .telemetry import Telemetry

if TYPE_CHECKING:
    from .config import Config

__all__ = [
    "BREAKER",
    "BREAKER_STORE",
    "CAPACITY",
    "KEY_ADMIN",
    "LIMITS",
    "OVERRIDES",
    "PRICING",
    "PRINCIPALS",
    "RESPONSE_STORE",
    "SERVICES",
    "SHARED_STATE",
    "SPEND",
    "TELEMETRY",
    "USAGE",
    "Offer",
    "Service",
    "Services",
    "SharedState",
    "provide",
]

T = TypeVar("T")


@runtime_checkable
class SharedState(Protocol):
    """The link to the engine every gateway of a fleet shares state through.

    prism-redis provides it (``engine`` is ``"redis"`` and ``connect()`` a
    ``redis.asyncio.Redis``).  A consumer keeps its keys under ``prefix``,
    names this gateway ``me`` in what it writes for the others, runs each
    round trip inside ``guard("what")`` (which marks the link degraded and
    logs the outage once, then re-raises), and keeps every promise it can
    without the engine while ``healthy`` is False.
    """

    #: The engine's name (``redis``).
    engine: str
    #: Every key of this fleet starts with it (``[prism:redis] key_prefix``).
    prefix: str
    #: This gateway's name in the fleet: unique per process.
    me: str
    #: False while the engine does not answer (the link says so on ``/readyz``).
    healthy: bool

    def connect(self) -> Any:
        """The engine's client (made on first use, without I/O); typed by its library."""
        ...

    def guard(self, kind: str) -> AbstractContextManager[None]:
        """Wrap one round trip: an engine error marks the link degraded, then re-raises."""
        ...

    async def take_lease(
        self,
        kind: str,
        key: str,
        member: str,
        *,
        limit: int,
        lease_s: float,
        spacing_s: float = 0.0,
    ) -> bool:
        """One of ``limit`` slots under ``key`` for ``member``, leased for ``lease_s`` and
        no sooner than ``spacing_s`` after the last one went (the engine's clock decides);
        raises the engine's error when it does not answer (after marking the link)."""
        ...

    def release(self, kind: str, key: str, member: str) -> None:
        """Give a lease back, in the background (an outage gives it back on return)."""
        ...


@attrs.frozen(eq=False)
class Service(Generic[T]):
    """One service: its name (what ``[prism] services`` and messages say), the type its
    providers must give, what it is for, and who ships a provider.

    ``default``, when given, is what consumers get when no plugin provides it
    (the core's own: per-process capacity, telemetry that drops everything).
    """

    name: str
    type: type[T]
    help: str
    #: The distributions that provide it, for the message when it is required and missing.
    provided_by: tuple[str, ...] = ()
    default: Callable[[Any], T] | None = None


@attrs.frozen(eq=False)
class Offer(Generic[T]):
    """A plugin's offer of ``service``: ``make()`` builds it on first use."""

    service: Service[T]
    make: Callable[[], T]


def provide(service: Service[T], make: Callable[[], T]) -> Offer[T]:
    """What ``prism_services`` returns for each service a plugin provides."""
    return Offer(service, make)


def _keep_capacity(generation: Any) -> Capacity:
    # Kept: calls in flight on an older generation still hold their slots.
    capacity: Capacity = generation.keep(("prism.capacity",), Capacity)
    return capacity


#: Capacity slots of lines with ``max_concurrency`` (the dispatch takes one per attempt).
CAPACITY: Service[Capacity] = Service(
    "capacity",
    Capacity,
    "the slots of lines with max_concurrency; the core's counts per process, a "
    "provider counts across the fleet",
    ("prism-redis",),
    default=_keep_capacity,
)
#: Where measurements go (the core's drops them).
TELEMETRY: Service[Telemetry] = Service(
    "telemetry",
    Telemetry,
    "where plugins report measurements; the core's drops them",
    ("prism-metrics",),
    default=lambda generation: Telemetry(),
)
#: A store for the breaker's state other than its own SQLite file.
BREAKER_STORE: Service[StoreProvider] = Service(
    "breaker-store",
    StoreProvider,  # type: ignore[type-abstract]
    "where the breaker keeps its state when not in its own SQLite file",
    ("prism-redis",),
)
#: The breaker, as other plugins may see it (health, probe verdicts).
BREAKER: Service[BreakerView] = Service(
    "breaker",
    BreakerView,  # type: ignore[type-abstract]
    "the breaker's health report and the door for probe verdicts",
    ("prism-breaker",),
)
#: The link to shared state across gateways.
SHARED_STATE: Service[SharedState] = Service(
    "shared-state",
    SharedState,  # type: ignore[type-abstract]
    "the engine gateways share state through (limits, peaks, leases)",
    ("prism-redis",),
)

#: The services the core declares, by name.
#: The catalog's prices, as billing charges them.
PRICING: Service[Pricing] = Service(
    "pricing",
    Pricing,  # type: ignore[type-abstract]
    "what a call served by a line costs, as billing charges it",
    ("prism-billing",),
)
#: The ledger's totals (the truth counters are rebuilt from).
SPEND: Service[SpendLedger] = Service(
    "spend",
    SpendLedger,  # type: ignore[type-abstract]
    "what the ledger says was spent, by organisation, key and model",
    ("prism-billing",),
)
#: Who an organisation or a key id is, for operator commands.
PRINCIPALS: Service[Principals] = Service(
    "principals",
    Principals,  # type: ignore[type-abstract]
    "who an organisation or a key id is, settings parsed (for operator commands)",
    ("prism-keys",),
)

#: Organisations, keys and their audit trail, for the admin API.
KEY_ADMIN: Service[KeyAdmin] = Service(
    "key-admin",
    KeyAdmin,  # type: ignore[type-abstract]
    "organisations, keys and the audit trail, administered (for the admin API)",
    ("prism-keys",),
)
#: Customer usage summed from the ledger, for the admin API.
USAGE: Service[UsageReport] = Service(
    "usage",
    UsageReport,  # type: ignore[type-abstract]
    "spend, tokens and calls from the ledger, grouped (for the admin API)",
    ("prism-billing",),
)

#: Where the Responses API's conversation state is kept (``previous_response_id``).
RESPONSE_STORE: Service[ResponseStore] = Service(
    "response-store",
    ResponseStore,  # type: ignore[type-abstract]
    "where Responses API answers are kept for previous_response_id; the core's in this "
    "process only",
    ("prism-responses",),
    default=default_store,
)
#: The breaker's operator overrides (quarantine, cap, release), for the admin API.
OVERRIDES: Service[BreakerOverrides] = Service(
    "overrides",
    BreakerOverrides,  # type: ignore[type-abstract]
    "the breaker's operator overrides: list, quarantine, cap, release (for the admin API)",
    ("prism-breaker",),
)
#: What an organisation's and its keys' limits have left now, for the admin API.
LIMITS: Service[LimitsView] = Service(
    "limits",
    LimitsView,  # type: ignore[type-abstract]
    "each limit of an organisation and its keys with what is left now (for the admin API)",
    ("prism-limits",),
)

SERVICES: Mapping[str, Service[Any]] = {
    service.name: service
    for service in (
        CAPACITY,
        TELEMETRY,
        BREAKER_STORE,
        BREAKER,
        SHARED_STATE,
        PRICING,
        SPEND,
        PRINCIPALS,
        KEY_ADMIN,
        USAGE,
        RESPONSE_STORE,
        OVERRIDES,
        LIMITS,
    )
}

_BUILDING = object()


@attrs.define(eq=False)
class Services:
    """One generation's services: who provides each, and what they built."""

    config: Config
    generation: Any
    #: The plugin chosen for each service that has a provider.
    chosen: dict[str, tuple[str, Offer[Any]]] = attrs.field(factory=dict)
    _built: dict[str, Any] = attrs.field(factory=dict)

    @classmethod
    def collect(
        cls, config: Config, generation: Any, offers: Iterable[tuple[str, Iterable[Offer[Any]]]]
    ) -> Services:
        """Phase one: every plugin's offers, each service given to one provider."""
        choices = service_choices(config)
        by_service: dict[str, list[tuple[str, Offer[Any]]]] = {}
        for plugin, answer in offers:
            for offer in answer:
                if not isinstance(offer, Offer) or offer.service.name not in SERVICES:
                    raise ConfigError(
                        config.source,
                        f"plugin {plugin}",
                        f"prism_services: {offer!r} is not provide(SERVICE, make) for a "
                        f"service the core declares ({', '.join(SERVICES)})",
                    )
                by_service.setdefault(offer.service.name, []).append((plugin, offer))
        services = cls(config, generation)
        for name, candidates in by_service.items():
            services.chosen[name] = _choose(config, name, candidates, choices.get(name))
        for name, plugin in choices.items():
            if name not in by_service:
                raise config.core.error(
                    "services",
                    f"{plugin} is chosen for {name}, but no loaded plugin provides it",
                )
        return services

    def get(self, service: Service[T]) -> T | None:
        """The service (built on first use), the core's default, or None."""
        name = service.name
        if name in self._built:
            found = self._built[name]
            if found is _BUILDING:
                raise ConfigError(
                    self.config.source, "services", f"{name} needs itself to be built"
                )
            value: T | None = found
            return value
        self._built[name] = _BUILDING
        try:
            value = self._build(service)
        except BaseException:
            del self._built[name]
            raise
        self._built[name] = value
        return value

    def require(self, service: Service[T], *, by: str) -> T:
        """The service, or a configuration error naming who would provide it."""
        value = self.get(service)
        if value is None:
            who = " or ".join(service.provided_by) or "a plugin that provides it"
            raise ConfigError(
                self.config.source,
                f"plugin {by}",
                f"needs the {service.name} service ({service.help}); install and configure {who}",
            )
        return value

    def provider(self, service: Service[Any]) -> str | None:
        """The plugin providing ``service``, or None (the core's default, or nobody)."""
        chosen = self.chosen.get(service.name)
        return chosen[0] if chosen else None

    def listing(self) -> Iterator[tuple[Service[Any], str]]:
        """Every declared service and who provides it, for ``prism check`` and the docs."""
        for service in SERVICES.values():
            provider = self.provider(service)
            if provider is not None:
                yield service, provider
            else:
                yield service, "core (default)" if service.default else "nobody"

    def _build(self, service: Service[T]) -> T | None:
        chosen = self.chosen.get(service.name)
        if chosen is None:
            return service.default(self.generation) if service.default else None
        plugin, offer = chosen
        value = offer.make()
        if not isinstance(value, service.type):
            raise ConfigError(
                self.config.source,
                f"plugin {plugin}",
                f"provided the {service.name} service as {type(value).__name__}, "
                f"which is not a {service.type.__name__}",
            )
        return value


def _choose(
    config: Config, name: str, candidates: list[tuple[str, Offer[Any]]], choice: str | None
) -> tuple[str, Offer[Any]]:
    plugins = sorted(plugin for plugin, _ in candidates)
    if choice is not None:
        for candidate in candidates:
            if candidate[0] == choice:
                return candidate
        raise config.core.error(
            "services", f"{choice} does not provide {name} (provided by: {', '.join(plugins)})"
        )
    if len(candidates) > 1:
        raise ConfigError(
            config.source,
            "services",
            f"{name} is provided by {' and '.join(plugins)}; disable one or choose one "
            f"with [prism] services = {name}:{plugins[0]}",
        )
    return candidates[0]


def service_choices(config: Config) -> dict[str, str]:
    """``[prism] services``: ``service:plugin`` pairs, checked against the declared names."""
    choices: dict[str, str] = {}
    for item in config.core.get_list("services"):
        name, sep, plugin = (part.strip() for part in item.partition(":"))
        if not sep or not name or not plugin:
            raise config.core.error("services", f"expected SERVICE:PLUGIN, got {item!r}")
        if name not in SERVICES:
            raise config.core.error(
                "services", f"unknown service {name!r} (known: {', '.join(SERVICES)})"
            )
        if name in choices:
            raise config.core.error("services", f"{name} is chosen twice")
        choices[name] = plugin
    return choices
