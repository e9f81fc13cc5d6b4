"""Authorised cost: an organisation's ``max_output_price`` keeps dearer lines out of its calls.

The setting is declared for prism-keys (``prism keys org-set ORG
max_output_price=10``), in the catalog's currency per million output tokens.
A line priced above it is ineligible for that organisation's calls on every
path a call can take: the route a rule or the chain chose (a route wrapper),
and every attempt (a veto), which covers cross-tier fallbacks, the breaker's
stand-down and retries.  A line without a price is not priced above anything.
"""

from __future__ import annotations

from collections.abc import Generator
from decimal import Decimal, InvalidOperation

from prism_proxy import Binding, Call, ModelSpec, OrgSetting, Route, hookimpl

from .prices import MAX_PRICE, PriceBook

__all__ = ["MAX_OUTPUT_PRICE", "PriceGate", "parse_max_output_price"]

MAX_OUTPUT_PRICE = "max_output_price"


def parse_max_output_price(text: str) -> Decimal:
    try:
        value = Decimal(text.strip())
    except InvalidOperation:
        raise ValueError(f"expected a price per million output tokens, got {text!r}") from None
    if not value.is_finite() or value < 0 or value > MAX_PRICE:
        raise ValueError(f"expected a price from 0 to {MAX_PRICE}, got {text!r}")
    return value


SETTING = OrgSetting(
    MAX_OUTPUT_PRICE,
    parse_max_output_price,
    "lines whose output price per million tokens is above this are not used for the org",
)


class PriceGate:
    """One generation's prices, keeping lines above an org's ``max_output_price`` out."""

    def __init__(self, prices: PriceBook) -> None:
        self.prices = prices

    def _refusal(self, call: Call, binding: Binding) -> str | None:
        limit = call.principal.settings.get(MAX_OUTPUT_PRICE)
        if limit is None:
            return None
        price = self.prices.price_of(binding)
        if price is None or price.output <= limit:
            return None
        return f"price: output {price.output} per million > max_output_price {limit}"

    @hookimpl(wrapper=True)
    def prism_select_route(
        self, call: Call, model: ModelSpec
    ) -> Generator[None, Route | None, Route | None]:
        route = yield
        if route is None or MAX_OUTPUT_PRICE not in call.principal.settings:
            return route
        kept = []
        for binding in route.bindings:
            refused = self._refusal(call, binding)
            if refused is None:
                kept.append(binding)
            else:
                route.skipped.append((binding, refused))
        route.bindings = tuple(kept)
        return route

    @hookimpl
    def prism_admit_attempt(self, call: Call, binding: Binding) -> str | None:
        return self._refusal(call, binding)
