"""The model catalog: providers, models, and the bindings that join them.

A *binding* is one line of a model's chain: (provider, upstream model) plus
whatever that line declares (price, parameter adjustments, region ...).
Breakers, statistics and bills are keyed on ``Binding.id``, never on the
provider alone.
"""

from __future__ import annotations

import fnmatch
import re
import tomllib
from collections.abc import Callable, Iterable, Mapping
from pathlib import Path
from typing import Any, Literal

import attrs
import cachetools
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
        "context_fallback",
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
_TOP_KEYS = frozenset({"providers", "models", "aliases"})
#: The placeholder a wildcard model's lines put the caller's name in.
NAME_FIELD = "{name}"
#: What a wildcard may stand for: an upstream model's name, not a path or a query.
_WILDCARD_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9._:@/+-]{0,199}")
#: Wildcard models resolved so far, kept per catalog (the oldest go first): their
#: lines keep one identity per name, as breakers, prices and caches key them.
_WILDCARD_CACHE = 4096


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
    #: An upstream's context-length refusal moves on to a line with a larger
    #: ``max_context_tokens`` instead of going back to the caller.
    context_fallback: bool = False


@attrs.frozen(eq=False)
class Wildcard:
    """``[models."<prefix>*"]``: any ``<prefix><name>``, by lines whose model has ``{name}``."""

    prefix: str
    spec: ModelSpec

    def resolve(self, catalog: Catalog, name: str) -> ModelSpec | None:
        rest = name[len(self.prefix) :]
        if not _WILDCARD_NAME.fullmatch(rest):
            return None
        chain = tuple(
            catalog.line(
                line.provider,
                line.model.replace(NAME_FIELD, rest),
                _priced(line.options, rest),
            )
            for line in self.spec.chain
        )
        return attrs.evolve(self.spec, name=name, chain=chain)


def _priced(options: Mapping[str, Any], name: str) -> Mapping[str, Any]:
    """A wildcard line's options for one name: its ``price`` picked by glob, first match wins."""
    table = options.get("price")
    if not _is_price_table(table):
        return options
    assert isinstance(table, dict)
    picked = next((price for glob, price in table.items() if fnmatch.fnmatchcase(name, glob)), None)
    out = {key: value for key, value in options.items() if key != "price"}
    if picked is not None:
        out["price"] = picked
    return out


def _is_price_table(value: Any) -> bool:
    """A price keyed by glob (every value a table), not one price (numbers)."""
    if not isinstance(value, dict) or not value:
        return False
    return all(isinstance(v, dict) for v in value.values())


@attrs.frozen(eq=False)
class Catalog:
    source: str
    providers: Mapping[str, ProviderSpec]
    models: Mapping[str, ModelSpec]
    bindings: Mapping[str, Binding]
    #: Every key a chain line may carry: the core's and those plugins declared.
    line_keys: frozenset[str] = _BINDING_KEYS | _CORE_LINE_OPTIONS
    #: ``[aliases]``: another name for a model, resolved to the very same spec.
    aliases: Mapping[str, ModelSpec] = attrs.field(factory=dict)
    #: Wildcard models, longest prefix first.
    wildcards: tuple[Wildcard, ...] = ()
    _resolved: cachetools.FIFOCache[str, ModelSpec] = attrs.field(
        factory=lambda: cachetools.FIFOCache(_WILDCARD_CACHE), init=False
    )

    def names(self) -> list[str]:
        """Every name a caller may use (``/v1/models``): models, then aliases."""
        return [*self.models, *self.aliases]

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
        """The model a caller asked for: a catalog model, an alias's, a pinned binding,
        or a wildcard model's (made once per name, then kept)."""
        model = self.models.get(name)
        if model is not None:
            return model
        model = self.aliases.get(name)
        if model is not None:
            return model
        binding = self.bindings.get(name)
        if binding is None:
            return self._wildcard(name) if self.wildcards else None
        tier = next(
            (m.tier for m in self.models.values() if any(b.id == name for b in m.chain)),
            "standard",
        )
        return ModelSpec(name=name, tier=tier, chain=(binding,), pinned=True, retries=0)

    def _wildcard(self, name: str) -> ModelSpec | None:
        model = self._resolved.get(name)
        if model is not None:
            return model
        for wildcard in self.wildcards:
            if name.startswith(wildcard.prefix):
                model = wildcard.resolve(self, name)
                if model is not None:
                    self._resolved[name] = model
                return model
        return None


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
            raise err(key, "unknown table (expected [providers.*], [models.*] and [aliases])")
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
    aliases: dict[str, ModelSpec] = {}
    wildcards: list[Wildcard] = []
    catalog = Catalog(source, providers, models, bindings, frozenset(binding_keys), aliases)
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
            if "*" not in name:  # a wildcard's lines are templates, not lines to pin
                bindings.setdefault(binding.id, binding)
            chain.append(binding)
        options = {k: v for k, v in table.items() if k not in _MODEL_KEYS}
        spec = ModelSpec(
            name=name, tier=tier, chain=tuple(chain), options=options, **_policy(name, table, err)
        )
        if "*" in name:
            wildcards.append(_wildcard(spec, err))
        else:
            models[name] = spec
    for name, model in [*models.items(), *((w.spec.name, w.spec) for w in wildcards)]:
        for index, other in enumerate(model.fallback_models):
            if other not in models or other == name:
                raise err(
                    f"models.{name}.fallback_models[{index}]",
                    f"{other!r} is not another model of this catalog",
                )
    aliases.update(_aliases(data.get("aliases", {}), models, bindings, err))
    if wildcards:
        # The longest prefix is the most specific: "acme/big-*" before "acme/*".
        wildcards.sort(key=lambda wildcard: -len(wildcard.prefix))
        catalog = attrs.evolve(catalog, wildcards=tuple(wildcards))
    return catalog


def _wildcard(spec: ModelSpec, err: Any) -> Wildcard:
    name = spec.name
    if name.count("*") != 1 or not name.endswith("*") or name == "*":
        raise err(
            f"models.{name}",
            'a wildcard model is a prefix then one * at the end, e.g. "acme/*"',
        )
    for index, line in enumerate(spec.chain):
        if NAME_FIELD not in line.model:
            raise err(
                f"models.{name}.chain[{index}].model",
                f"a wildcard model's line names its upstream model with {NAME_FIELD}, "
                f'e.g. model = "{NAME_FIELD}"',
            )
        price = line.options.get("price")
        if isinstance(price, dict) and any(isinstance(v, dict) for v in price.values()):
            if not _is_price_table(price):
                raise err(
                    f"models.{name}.chain[{index}].price",
                    "expected one price, or prices keyed by glob: "
                    '{ "big-*" = { ... }, "*" = { ... } }',
                )
    return Wildcard(prefix=name[:-1], spec=spec)


def _aliases(
    table: Any, models: Mapping[str, ModelSpec], bindings: Mapping[str, Binding], err: Any
) -> dict[str, ModelSpec]:
    """``[aliases]``: ``"gpt-4o" = "chat-a"``, each resolved to its model once, at load."""
    if not isinstance(table, dict):
        raise err("aliases", 'expected a table of "alias" = "model"')
    out: dict[str, ModelSpec] = {}
    for alias, target in table.items():
        if alias in models or alias in bindings or "*" in alias:
            raise err(f"aliases.{alias}", "is already a model's name (or a pattern)")
        if not isinstance(target, str) or target not in models:
            raise err(f"aliases.{alias}", f"{target!r} is not a model of this catalog")
        out[alias] = models[target]
    return out


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
    context_fallback = table.get("context_fallback", False)
    if not isinstance(context_fallback, bool):
        raise err(
            f"models.{name}.context_fallback", f"expected true or false, got {context_fallback!r}"
        )
    policy["context_fallback"] = context_fallback
    return policy


def _tables(data: Mapping[str, Any], key: str, err: Any) -> dict[str, dict[str, Any]]:
    group = data.get(key, {})
    if not isinstance(group, dict):
        raise err(key, "expected tables like [" + key + ".<name>]")
    for name, table in group.items():
        if not isinstance(table, dict):
            raise err(f"{key}.{name}", "expected a table")
    return group
