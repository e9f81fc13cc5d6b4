"""The model catalog: providers, models, and the bindings that join them.

A *binding* is one line of a model's chain: (provider, upstream model) plus
whatever that line declares (price, parameter adjustments, region ...).
Breakers, statistics and bills are keyed on ``Binding.id``, never on the
provider alone.
"""

from __future__ import annotations

import re
import tomllib
from collections.abc import Callable, Iterable, Mapping
from pathlib import Path
from typing import Any, Literal

import attrs
import orjson

from .errors import ConfigError

__all__ = [
    "Binding",
    "Catalog",
    "CatalogKeys",
    "ModelSpec",
    "ProviderSpec",
    "is_region",
    "load_catalog",
]

_MODEL_KEYS = frozenset(
    {
        "tier",
        "chain",
        "description",
        "retries",
        "call_budget_ms",
        "empty",
        "fallback_models",
        "cross_tier_fallback",
        "degraded",
    }
)
EMPTY_POLICIES = ("return", "fallback")
_BINDING_KEYS = frozenset({"provider", "model"})
#: Chain-line options the core itself reads (kept in ``Binding.options``).
_CORE_LINE_OPTIONS = frozenset(
    {
        "max_output_tokens",
        "max_context_tokens",
        "capabilities",
        "max_concurrency",
        "queue_ms",
        "region",
    }
)
#: A region's name, as clouds spell them (``eu-west-1``, ``europe-west4``, ``westeurope``).
REGION_NAME = re.compile(r"[a-z][a-z0-9]*(?:-[a-z0-9]+)*")
#: What a line may declare it can do (``capabilities``); see :mod:`prism_proxy.gate`.
LINE_CAPABILITIES = ("tools", "vision", "json_mode", "audio")
_TOP_KEYS = frozenset({"providers", "models"})


@attrs.frozen
class CatalogKeys:
    """Extra catalog keys a plugin understands (it validates their values itself)."""

    model: frozenset[str] = frozenset()
    binding: frozenset[str] = frozenset()


@attrs.frozen(eq=False)
class ProviderSpec:
    """One ``[providers.<name>]`` table: the kind plus the kind's own options.

    ``region`` (where the upstream serves from) is the core's, not the kind's:
    it is not among ``options``.
    """

    name: str
    kind: str
    options: Mapping[str, Any]
    source: str
    region: str | None = None

    def where(self, key: str) -> str:
        return f"providers.{self.name}.{key}"

    def error(self, key: str, problem: str) -> ConfigError:
        return ConfigError(self.source, self.where(key), problem)


@attrs.frozen(eq=False)
class Binding:
    """One catalog line: an upstream model reached through one provider.

    ``region`` is the line's own ``region`` option, else its provider's.
    """

    provider: str
    model: str
    options: Mapping[str, Any] = attrs.field(factory=dict)
    region: str | None = None
    #: ``provider/model``: made once, it keys the breaker's, metrics' and billing's state.
    id: str = attrs.field(init=False)

    @id.default
    def _id(self) -> str:
        return f"{self.provider}/{self.model}"


@attrs.frozen(eq=False)
class ModelSpec:
    """A model name callers use, with its tier and its chain of bindings.

    ``pinned`` is true for the synthetic spec made when a caller names a
    binding directly (``"provider/upstream-model"``): one attempt, no fallback.
    Policy fields left None take the ``[prism]`` defaults.
    """

    name: str
    tier: str
    chain: tuple[Binding, ...]
    options: Mapping[str, Any] = attrs.field(factory=dict)
    pinned: bool = False
    retries: int | None = None
    call_budget_ms: int | None = None
    #: ``return`` an empty completion to the caller (flagged), or ``fallback`` past it.
    empty: str = "return"
    fallback_models: tuple[str, ...] = ()
    #: True, False, ``"caller"`` (only for calls that send ``x-prism-fallback: allow``),
    #: or None for the ``[prism]`` default.
    cross_tier_fallback: bool | Literal["caller"] | None = None
    #: A templated answer served instead of a 504 when the call budget runs out.
    degraded: str | None = None


@attrs.frozen(eq=False)
class Catalog:
    source: str
    providers: Mapping[str, ProviderSpec]
    models: Mapping[str, ModelSpec]
    bindings: Mapping[str, Binding]
    #: Every key a chain line may carry: the core's and those plugins declared.
    line_keys: frozenset[str] = _BINDING_KEYS | _CORE_LINE_OPTIONS

    def fingerprint(self, binding: Binding) -> str:
        """What makes a line the same upstream: its provider's kind and options, its model.

        Two generations' lines with one id and one fingerprint are one upstream;
        a changed URL, credential or model makes another one.
        """
        spec = self.providers.get(binding.provider)
        provider = (spec.kind, dict(spec.options)) if spec is not None else None
        return orjson.dumps(
            [provider, binding.model], option=orjson.OPT_SORT_KEYS, default=str
        ).decode()

    def line(self, provider: str, model: str, options: Mapping[str, Any]) -> Binding:
        """A chain line as the catalog makes them (its region resolved); for lines plugins build."""
        spec = self.providers.get(provider)
        region = options.get("region") or (spec.region if spec is not None else None)
        return Binding(provider=provider, model=model, options=options, region=region)

    def check_line_options(self, where: str, options: Mapping[str, Any]) -> None:
        """Check the values of the line options the core reads (for lines plugins build)."""
        region = options.get("region")
        if region is not None and not is_region(region):
            raise ConfigError(self.source, f"{where}.region", _REGION_PROBLEM.format(region))
        for key in ("max_output_tokens", "max_context_tokens", "max_concurrency", "queue_ms"):
            limit = options.get(key)
            if limit is not None and (type(limit) is not int or limit < 1):
                raise ConfigError(
                    self.source, f"{where}.{key}", f"expected a whole number >= 1, got {limit!r}"
                )
        if "queue_ms" in options and "max_concurrency" not in options:
            raise ConfigError(
                self.source,
                f"{where}.queue_ms",
                "a queue needs max_concurrency on the same line: there is nothing to wait for",
            )
        capabilities = options.get("capabilities")
        if capabilities is not None and (
            not isinstance(capabilities, list)
            or not all(item in LINE_CAPABILITIES for item in capabilities)
        ):
            raise ConfigError(
                self.source,
                f"{where}.capabilities",
                f"expected a list of {', '.join(LINE_CAPABILITIES)}, got {capabilities!r}",
            )

    def resolve(self, name: str) -> ModelSpec | None:
        """The model a caller asked for: a catalog model, or a pinned binding."""
        model = self.models.get(name)
        if model is not None:
            return model
        binding = self.bindings.get(name)
        if binding is None:
            return None
        tier = next(
            (m.tier for m in self.models.values() if any(b.id == name for b in m.chain)),
            "standard",
        )
        return ModelSpec(name=name, tier=tier, chain=(binding,), pinned=True, retries=0)


_REGION_PROBLEM = (
    "expected a region name of lowercase letters, digits and single dashes "
    "(eu-west-1, europe-west4), got {!r}"
)


def is_region(value: Any) -> bool:
    return isinstance(value, str) and len(value) <= 64 and REGION_NAME.fullmatch(value) is not None


def load_catalog(
    path: Path | None,
    *,
    data: Mapping[str, Any] | None = None,
    kinds: Iterable[str] | None = None,
    extra_keys: Iterable[CatalogKeys] = (),
    disabled_owner: Callable[[str, str], str | None] | None = None,
) -> Catalog:
    """Read and validate the catalog; every mistake names file, key and problem.

    ``disabled_owner(what, name)`` (``what``: ``model``, ``binding`` or
    ``kind``) describes the disabled plugin that would have understood an
    unknown key or provider kind, for the error message.
    """
    source = str(path) if path is not None else "<catalog>"
    if data is None:
        if path is None:
            raise ConfigError(source, "catalog", "no catalog given")
        try:
            text = path.read_text(encoding="utf-8")
        except FileNotFoundError:
            raise ConfigError(source, "catalog", "file not found") from None
        except OSError as exc:
            raise ConfigError(source, "catalog", f"cannot read: {exc.strerror}") from None
        try:
            data = tomllib.loads(text)
        except tomllib.TOMLDecodeError as exc:
            raise ConfigError(source, "(file)", f"not valid TOML: {exc}") from None

    def err(key: str, problem: str) -> ConfigError:
        return ConfigError(source, key, problem)

    def unknown(key: str, what: str, name: str, problem: str) -> ConfigError:
        owner = disabled_owner(what, name) if disabled_owner is not None else None
        if owner is not None:
            problem = f"{problem}: it belongs to {owner}"
        return err(key, problem)

    for key in data:
        if key not in _TOP_KEYS:
            raise err(key, "unknown table (expected [providers.*] and [models.*])")
    model_keys = set(_MODEL_KEYS)
    binding_keys = set(_BINDING_KEYS | _CORE_LINE_OPTIONS)
    for extra in extra_keys:
        model_keys |= extra.model
        binding_keys |= extra.binding
    known_kinds = set(kinds) if kinds is not None else None

    providers: dict[str, ProviderSpec] = {}
    for name, table in _tables(data, "providers", err).items():
        kind = table.get("kind")
        if not isinstance(kind, str) or not kind:
            raise err(f"providers.{name}.kind", 'missing: name the provider kind, e.g. "openai"')
        if known_kinds is not None and kind not in known_kinds:
            installed = ", ".join(sorted(known_kinds)) or "none installed"
            problem = f"unknown provider kind {kind!r} ({installed})"
            raise unknown(f"providers.{name}.kind", "kind", kind, problem)
        region = table.get("region")
        if region is not None and not is_region(region):
            raise err(f"providers.{name}.region", _REGION_PROBLEM.format(region))
        options = {k: v for k, v in table.items() if k not in ("kind", "region")}
        providers[name] = ProviderSpec(
            name=name, kind=kind, options=options, source=source, region=region
        )

    models: dict[str, ModelSpec] = {}
    bindings: dict[str, Binding] = {}
    catalog = Catalog(source, providers, models, bindings, frozenset(binding_keys))
    for name, table in _tables(data, "models", err).items():
        for key in table:
            if key not in model_keys:
                raise unknown(f"models.{name}.{key}", "model", key, "unknown key")
        tier = table.get("tier", "standard")
        if not isinstance(tier, str) or not tier:
            raise err(f"models.{name}.tier", f"expected a name, got {tier!r}")
        chain_data = table.get("chain")
        if not isinstance(chain_data, list) or not chain_data:
            raise err(f"models.{name}.chain", "missing or empty: list at least one binding")
        chain = []
        for index, line in enumerate(chain_data):
            where = f"models.{name}.chain[{index}]"
            if not isinstance(line, dict):
                raise err(where, "expected a table {{ provider = ..., model = ... }}")
            for key in line:
                if key not in binding_keys:
                    raise unknown(f"{where}.{key}", "binding", key, "unknown key")
            provider = line.get("provider")
            if not isinstance(provider, str) or provider not in providers:
                known = ", ".join(sorted(providers)) or "none"
                raise err(f"{where}.provider", f"unknown provider {provider!r} (known: {known})")
            upstream = line.get("model")
            if not isinstance(upstream, str) or not upstream:
                raise err(f"{where}.model", "missing: the upstream model name")
            options = {k: v for k, v in line.items() if k not in _BINDING_KEYS}
            catalog.check_line_options(where, options)
            binding = catalog.line(provider, upstream, options)
            bindings.setdefault(binding.id, binding)
            chain.append(binding)
        options = {k: v for k, v in table.items() if k not in _MODEL_KEYS}
        models[name] = ModelSpec(
            name=name, tier=tier, chain=tuple(chain), options=options, **_policy(name, table, err)
        )
    for name, model in models.items():
        for index, other in enumerate(model.fallback_models):
            if other not in models or other == name:
                raise err(
                    f"models.{name}.fallback_models[{index}]",
                    f"{other!r} is not another model of this catalog",
                )
    return catalog


def _policy(name: str, table: Mapping[str, Any], err: Any) -> dict[str, Any]:
    """The model's own dispatch policy; absent keys stay None (the [prism] defaults apply)."""
    policy: dict[str, Any] = {}
    for key, lo, hi in (("retries", 0, 10), ("call_budget_ms", 1000, 3_600_000)):
        value = table.get(key)
        if value is None:
            continue
        if isinstance(value, bool) or not isinstance(value, int) or not lo <= value <= hi:
            raise err(
                f"models.{name}.{key}", f"expected a whole number from {lo} to {hi}, got {value!r}"
            )
        policy[key] = value
    empty = table.get("empty", "return")
    if empty not in EMPTY_POLICIES:
        raise err(f"models.{name}.empty", f"expected 'return' or 'fallback', got {empty!r}")
    policy["empty"] = empty
    fallbacks = table.get("fallback_models", [])
    if not isinstance(fallbacks, list) or not all(isinstance(f, str) for f in fallbacks):
        raise err(f"models.{name}.fallback_models", "expected a list of model names")
    policy["fallback_models"] = tuple(fallbacks)
    cross = table.get("cross_tier_fallback")
    if cross is not None and not isinstance(cross, bool) and cross != "caller":
        raise err(
            f"models.{name}.cross_tier_fallback",
            f'expected true, false or "caller", got {cross!r}',
        )
    policy["cross_tier_fallback"] = cross
    degraded = table.get("degraded")
    if degraded is not None and (not isinstance(degraded, str) or not degraded.strip()):
        raise err(f"models.{name}.degraded", "expected the text of the degraded answer")
    policy["degraded"] = degraded
    return policy


def _tables(data: Mapping[str, Any], key: str, err: Any) -> dict[str, dict[str, Any]]:
    group = data.get(key, {})
    if not isinstance(group, dict):
        raise err(key, "expected tables like [" + key + ".<name>]")
    for name, table in group.items():
        if not isinstance(table, dict):
            raise err(f"{key}.{name}", "expected a table")
    return group
