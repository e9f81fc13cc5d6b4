"""Prices on catalog chain lines, and the exact cost of one call's usage.

Money is counted in integer nano-units (10^-9 of the currency): exact to sum
in SQLite, and exact for any price with up to three decimals per million
tokens.  A cost is rounded once, per call, half to even.
"""

from __future__ import annotations

import decimal
import logging
import math
from collections.abc import Iterable, Iterator, Mapping
from decimal import Decimal
from typing import Any

import attrs
import cachetools

from prism_proxy import Binding, Catalog, ConfigError, Usage

__all__ = [
    "MAX_PRICE",
    "MAX_TOKENS",
    "NANOS",
    "Price",
    "PriceBook",
    "format_nanos",
    "parse_price",
    "price_lines",
]

log = logging.getLogger("prism.billing")

#: Nano-units per currency unit.
NANOS = 10**9
#: The largest price accepted per field: far above any real model, and low
#: enough that no cost can overflow SQLite's 64-bit integers.
MAX_PRICE = 1_000_000
#: Token counts above this are taken as an upstream reporting error and clamped.
MAX_TOKENS = 10**9
#: The most prices of lines outside the catalog's chains a price book keeps.
EXTRA_LINES = 4096

PRICE_FIELDS = ("input", "output", "cached_input", "cache_write", "request")
_REQUIRED = ("input", "output")
_PER_MILLION = Decimal(1_000_000)
# Wide enough that tokens x price never rounds before the one final rounding.
_EXACT = decimal.Context(prec=60, rounding=decimal.ROUND_HALF_EVEN)
_NANO = Decimal(1).scaleb(-9)


@attrs.frozen
class Price:
    """One line's price: per million tokens, plus a flat fee per served call.

    ``cached_input`` prices prompt tokens read from the provider's cache and
    ``cache_write`` those written to it; the rest of the prompt is ``input``.
    """

    input: Decimal
    output: Decimal
    cached_input: Decimal
    cache_write: Decimal
    request: Decimal = Decimal(0)
    #: Nano-units per token (input, cached input, cache write, output) and per
    #: call, when all are whole numbers (prices with up to three decimals): the
    #: cost is then exact in integers, as the Decimal path would make it.
    whole_nanos: tuple[int, int, int, int, int] | None = attrs.field(
        init=False, eq=False, repr=False
    )

    @whole_nanos.default
    def _whole_nanos(self) -> tuple[int, int, int, int, int] | None:
        per_token = [
            rate * 1000 for rate in (self.input, self.cached_input, self.cache_write, self.output)
        ]
        fee = self.request * NANOS
        if any(value != value.to_integral_value() for value in (*per_token, fee)):
            return None
        a, b, c, d = (int(value) for value in per_token)
        return a, b, c, d, int(fee)

    def cost_nanos(self, usage: Usage | None) -> int:
        """What the serving line charges for ``usage`` (None: the request fee alone)."""
        if usage is None:
            return self.cost_of_tokens(None)
        return self.cost_of_tokens(
            (
                clamp_tokens(usage.input_tokens),
                clamp_tokens(usage.cached_input_tokens),
                clamp_tokens(usage.cache_creation_tokens),
                clamp_tokens(usage.output_tokens),
            )
        )

    def cost_of_tokens(self, tokens: tuple[int, int, int, int] | None) -> int:
        """The charge for already clamped (input, cached input, cache write, output) tokens.

        None: the request fee alone.  The ledger row holds the same clamped
        counts, so a call's are clamped once.
        """
        whole = self.whole_nanos
        if whole is not None:
            if tokens is None:
                return whole[4]
            prompt, cached, written, output = tokens
            fresh = max(prompt - cached - written, 0)
            return (
                fresh * whole[0] + cached * whole[1] + written * whole[2] + output * whole[3]
            ) + whole[4]
        if tokens is None:
            total_tokens = Decimal(0)
        else:
            prompt, cached, written, output = tokens
            fresh = max(prompt - cached - written, 0)
            total_tokens = Decimal(0)
            for count, rate in (
                (fresh, self.input),
                (cached, self.cached_input),
                (written, self.cache_write),
                (output, self.output),
            ):
                total_tokens = _EXACT.add(total_tokens, _EXACT.multiply(Decimal(count), rate))
        total = _EXACT.add(_EXACT.divide(total_tokens, _PER_MILLION), self.request)
        return int(total.quantize(_NANO, context=_EXACT).scaleb(9, context=_EXACT))


def clamp_tokens(value: int) -> int:
    return min(max(value, 0), MAX_TOKENS)


def format_nanos(nanos: int) -> str:
    """A cost as a plain decimal string without exponent: ``0.000042``, ``0``."""
    if nanos >= 0:
        # Integers: the Decimal path below costs several times more, once per call.
        whole, fraction = divmod(nanos, NANOS)
        if not fraction:
            return str(whole)
        return f"{whole}.{fraction:09d}".rstrip("0")
    text = format(Decimal(nanos).scaleb(-9).normalize(), "f")
    return text


def parse_price(value: Any, where: str, source: str) -> Price:
    """Read ``price = { input = .., output = .., cached_input = .., request = .. }``.

    ``cached_input`` and ``cache_write`` default to ``input`` (a provider
    without cache pricing); ``request`` defaults to 0.  Every mistake names
    its field.
    """
    if not isinstance(value, Mapping):
        raise ConfigError(
            source,
            where,
            f"expected a table like {{ input = 3.0, output = 15.0 }} (per million tokens), "
            f"got {value!r}",
        )
    for key in value:
        if key not in PRICE_FIELDS:
            raise ConfigError(
                source, f"{where}.{key}", f"unknown price field (known: {', '.join(PRICE_FIELDS)})"
            )
    for key in _REQUIRED:
        if key not in value:
            raise ConfigError(
                source, f"{where}.{key}", "missing: the price per million tokens is required"
            )
    amounts = {key: _amount(value[key], f"{where}.{key}", source) for key in value}
    return Price(
        input=amounts["input"],
        output=amounts["output"],
        cached_input=amounts.get("cached_input", amounts["input"]),
        cache_write=amounts.get("cache_write", amounts["input"]),
        request=amounts.get("request", Decimal(0)),
    )


def _amount(value: Any, where: str, source: str) -> Decimal:
    if isinstance(value, bool) or not isinstance(value, int | float):
        raise ConfigError(source, where, f"expected a number, got {value!r}")
    if not math.isfinite(value) or value < 0:
        raise ConfigError(source, where, f"expected a number >= 0, got {value!r}")
    if value > MAX_PRICE:
        raise ConfigError(source, where, f"must be at most {MAX_PRICE}, got {value!r}")
    # repr() is the shortest text that round-trips: 0.3 stays 0.3, not 0.29999...
    return Decimal(repr(value))


def price_lines(catalog: Catalog) -> Iterator[tuple[str, Binding]]:
    """Every chain line with its catalog address, ``models.<m>.chain[<i>]``."""
    for name, model in catalog.models.items():
        for index, binding in enumerate(model.chain):
            yield f"models.{name}.chain[{index}]", binding


@attrs.frozen
class PriceBook:
    """Every chain line's parsed price, looked up by the line itself.

    Bindings compare by identity, so two lines for the same provider and
    upstream model in different models keep their own prices.
    """

    by_line: Mapping[Binding, Price | None]
    #: Lines met at call time that are not catalog chain lines (a routing
    #: plugin's own lines, a wildcard model's line per name), parsed once and
    #: kept while recently used: callers choose wildcard names, so they are unbounded.
    _extra: cachetools.LRUCache[Binding, Price | None] = attrs.field(
        factory=lambda: cachetools.LRUCache(EXTRA_LINES), init=False
    )

    @classmethod
    def from_catalog(cls, catalog: Catalog, *, require: bool) -> PriceBook:
        return cls.from_lines(catalog.source, price_lines(catalog), require=require)

    @classmethod
    def from_lines(
        cls, source: str, lines: Iterable[tuple[str, Binding]], *, require: bool
    ) -> PriceBook:
        """Each line's price, checked; ``require``: a line without one stops start-up."""
        prices: dict[Binding, Price | None] = {}
        for where, binding in lines:
            raw = binding.options.get("price")
            if raw is None:
                if require:
                    raise ConfigError(
                        source,
                        f"{where}.price",
                        "missing: billing is on and every chain line needs a price "
                        "(or set [prism:billing] require_prices = false to bill it at 0)",
                    )
                prices[binding] = None
                continue
            prices[binding] = parse_price(raw, f"{where}.price", source)
        return cls(prices)

    def price_of(self, binding: Binding) -> Price | None:
        if binding in self.by_line:
            return self.by_line[binding]
        try:
            return self._extra[binding]
        except KeyError:
            price = self._extra[binding] = _late_price(binding)
            return price


def _late_price(binding: Binding) -> Price | None:
    """The price of a line no start-up check saw; a bad one bills 0 rather than losing the row."""
    raw = binding.options.get("price")
    if raw is None:
        log.error("billing: %s has no price; billed 0 and flagged unpriced", binding.id)
        return None
    try:
        return parse_price(raw, f"{binding.id}.price", "<route>")
    except ConfigError as exc:
        log.error("billing: %s; billed 0 and flagged unpriced", exc)
        return None
