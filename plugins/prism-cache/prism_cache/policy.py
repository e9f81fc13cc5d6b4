"""What may be cached, under which key: the catalog's say, the caller's say, the request's shape.

The key is the organisation (or, for a caller without one, its key), the
resolved model, a fingerprint of that model's chain as this generation's
catalog describes it, the endpoint, and the request as canonical JSON with
the fields that do not change the answer left out.  So two organisations
never share an entry, and a reload that changes a model's lines makes its
old entries unreachable (they expire unread).
"""

from __future__ import annotations

import hashlib
import math
from collections.abc import Mapping
from decimal import Decimal
from typing import Any

import attrs
import cachetools
import orjson

from prism_proxy import Binding, Call, Catalog, ConfigError, ModelSpec, PrismError

__all__ = [
    "BINDING_KEYS",
    "CONTROL_HEADER",
    "MODEL_KEYS",
    "TTL_HEADER",
    "CallerSay",
    "ModelPolicy",
    "Policy",
    "cache_price",
    "caller_say",
    "check_catalog",
]

#: ``cache = "deterministic" | "all" | "off"``, ``cache_ttl_s``, ``cache_tools`` on models.
MODEL_KEYS = frozenset({"cache", "cache_ttl_s", "cache_tools"})
#: ``cache_price = { input = .., output = .., request = .. }`` on chain lines.
BINDING_KEYS = frozenset({"cache_price"})
CONTROL_HEADER = "Cache-Control"
TTL_HEADER = "x-prism-cache-ttl"
_MODES = ("deterministic", "all", "off")
_PRICE_FIELDS = ("input", "output", "cached_input", "cache_write", "request")
#: Fields that never change the answer: who asks, how it is delivered, what Prism strips.
_IGNORED = frozenset({"user", "stream", "stream_options", "metadata", "store"})
#: Fingerprints of models met at call time (wildcard names are the caller's choice).
_FINGERPRINTS = 4096


@attrs.frozen
class ModelPolicy:
    mode: str = "deterministic"
    ttl_s: int | None = None
    tools: bool = False


def check_catalog(catalog: Catalog) -> None:
    """Refuse a mistaken ``cache*`` key on any model or line, naming it."""
    for name, model in catalog.models.items():
        model_policy(model, f"models.{name}", catalog.source)
        for index, binding in enumerate(model.chain):
            cache_price(binding, f"models.{name}.chain[{index}]", catalog.source)


def model_policy(model: ModelSpec, where: str, source: str) -> ModelPolicy:
    options = model.options
    mode = options.get("cache", "deterministic")
    if mode not in _MODES:
        raise ConfigError(source, f"{where}.cache", f"expected one of {', '.join(_MODES)}")
    ttl = options.get("cache_ttl_s")
    if ttl is not None and (type(ttl) is not int or not 1 <= ttl <= 30 * 86400):
        raise ConfigError(source, f"{where}.cache_ttl_s", "expected whole seconds, 1 to 2592000")
    tools = options.get("cache_tools", False)
    if type(tools) is not bool:
        raise ConfigError(source, f"{where}.cache_tools", "expected true or false")
    return ModelPolicy(mode, ttl, tools)


def cache_price(binding: Binding, where: str, source: str) -> dict[str, float]:
    """The line's ``cache_price`` as a ``price`` table (billing's shape); unset: all 0."""
    raw = binding.options.get("cache_price")
    if raw is None:
        return {"input": 0, "output": 0}
    if not isinstance(raw, Mapping):
        raise ConfigError(
            source, f"{where}.cache_price", "expected a table like { request = 0.0001 }"
        )
    table: dict[str, float] = {"input": 0, "output": 0}
    for key, value in raw.items():
        if key not in _PRICE_FIELDS:
            raise ConfigError(
                source,
                f"{where}.cache_price.{key}",
                f"unknown price field (known: {', '.join(_PRICE_FIELDS)})",
            )
        if isinstance(value, bool) or not isinstance(value, int | float):
            raise ConfigError(source, f"{where}.cache_price.{key}", "expected a number")
        if not math.isfinite(value) or value < 0:
            raise ConfigError(source, f"{where}.cache_price.{key}", "expected a number >= 0")
        table[key] = value
    return table


@attrs.frozen
class CallerSay:
    """What the caller asked of the cache: ``no-store``, ``no-cache``, a shorter TTL."""

    read: bool = True
    write: bool = True
    ttl_s: int | None = None
    reason: str | None = None


_DEFAULT_SAY = CallerSay()


def caller_say(call: Call) -> CallerSay:
    headers = call.request.headers
    control = headers.get(CONTROL_HEADER)
    ttl_text = headers.get(TTL_HEADER)
    if control is None and ttl_text is None:
        return _DEFAULT_SAY
    ttl: int | None = None
    if ttl_text is not None:
        text = ttl_text.strip()
        if not text.isdigit() or len(text) > 9:
            raise PrismError(
                400,
                "invalid_cache_ttl",
                f"{TTL_HEADER} must be whole seconds (0 or more)",
                param=TTL_HEADER,
            )
        ttl = int(text)
    directives = {part.strip().lower() for part in (control or "").split(",")}
    if "no-store" in directives:
        return CallerSay(read=False, write=False, reason="no-store")
    if ttl == 0:
        return CallerSay(read=False, write=False, reason="ttl-0")
    if "no-cache" in directives:
        return CallerSay(read=False, write=True, ttl_s=ttl, reason="no-cache")
    return CallerSay(ttl_s=ttl)


@attrs.define(eq=False)
class Policy:
    """One generation's rules: each model's say, and the fingerprints of their chains."""

    source: str
    default_ttl_s: int
    _models: cachetools.LRUCache[ModelSpec, tuple[ModelPolicy, str]] = attrs.field(
        factory=lambda: cachetools.LRUCache(_FINGERPRINTS), init=False
    )

    def of(self, model: ModelSpec) -> tuple[ModelPolicy, str]:
        """The model's cache policy and its chain's fingerprint."""
        try:
            return self._models[model]
        except KeyError:
            found = self._models[model] = (
                model_policy(model, f"models.{model.name}", self.source),
                _fingerprint(model),
            )
            return found

    def bypass(self, call: Call, policy: ModelPolicy) -> str | None:
        """Why this request is not cached (None: it may be)."""
        settings = call.principal.settings
        if settings and settings.get("cache") is False:
            return "org"
        if policy.mode == "off":
            return "model"
        body = call.body
        if body.get("n", 1) != 1:
            return "n"
        if (body.get("tools") or body.get("functions")) and not policy.tools:
            return "tools"
        if policy.mode == "deterministic" and not _deterministic(body):
            return "nondeterministic"
        return None

    def key(self, call: Call, fingerprint: str) -> str:
        principal = call.principal
        # Nobody shares across organisations; a caller without one keeps its own entries.
        owner = f"org:{principal.org}" if principal.org else f"key:{principal.key_id or ''}"
        request = {k: _numbers(v) for k, v in call.body.items() if k not in _IGNORED}
        canonical = orjson.dumps(request, option=orjson.OPT_SORT_KEYS, default=_plain)
        assert call.model is not None
        head = orjson.dumps([owner, call.model.name, fingerprint, str(call.endpoint)])
        return hashlib.sha256(head + b"\n" + canonical).hexdigest()


def _numbers(value: Any) -> Any:
    """``0.0`` and ``0`` are the same JSON number: written alike, whatever the client sent."""
    if type(value) is float and value.is_integer() and abs(value) < 2**53:
        return int(value)
    if type(value) is dict:
        return {k: _numbers(v) for k, v in value.items()}
    if type(value) is list:
        return [_numbers(v) for v in value]
    return value


def _deterministic(body: Mapping[str, Any]) -> bool:
    temperature = body.get("temperature")
    if not isinstance(temperature, bool) and isinstance(temperature, int | float):
        if temperature == 0:
            return True
    return body.get("seed") is not None


def _fingerprint(model: ModelSpec) -> str:
    lines = [[b.provider, b.model, b.region, dict(b.options)] for b in model.chain]
    blob = orjson.dumps(lines, option=orjson.OPT_SORT_KEYS, default=_plain)
    return hashlib.sha256(blob).hexdigest()[:32]


def _plain(value: Any) -> Any:
    if isinstance(value, Decimal):
        return str(value)
    if isinstance(value, Mapping):
        return dict(value)
    if isinstance(value, tuple | frozenset | set):
        return list(value)
    return repr(value)
