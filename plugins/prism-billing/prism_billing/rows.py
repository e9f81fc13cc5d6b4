"""One ledger row per call: who, what was asked, what served, what it used and cost.

A row holds identifiers, names and counts only: never prompt or completion
text, never a credential (``key_id`` is the key's public identifier).
"""

from __future__ import annotations

import datetime
import functools
import math
import operator
from typing import Any

import attrs

from prism_proxy import Call, Settlement

from .prices import PriceBook, clamp_tokens

__all__ = ["COLUMNS", "LedgerRow", "build_row", "utc_day"]


# Not frozen: a frozen attrs class sets each of its 25 fields through
# ``object.__setattr__``, about 18,000 instructions a row on the serving path
# (three times a plain slot store). A row is built once and only read after.
@attrs.define
class LedgerRow:
    request_id: str
    #: Wall-clock time the call settled, ISO 8601 UTC with milliseconds.
    ts: str
    #: The UTC day of ``ts``; bills and usage totals group by it.
    day: str
    key_id: str | None
    org: str | None
    #: The model the caller asked for (a catalog model, or a pinned ``provider/model``).
    model: str
    endpoint: str
    stream: bool
    #: ``customer``, ``probe`` or ``preflight``; only ``customer`` rows are ever billed.
    traffic: str
    #: ``ok``, ``empty``, ``error`` or ``aborted``, as the core settled the call.
    outcome: str
    status: int
    error_code: str | None
    #: The serving line (None when nothing served): the only one billed.
    provider: str | None
    upstream_model: str | None
    input_tokens: int
    cached_input_tokens: int
    cache_creation_tokens: int
    output_tokens: int
    #: Usage not reported by the provider (estimated from delivered text, or missing).
    estimated: bool
    #: The serving line has no price (``require_prices = false``): billed at 0.
    unpriced: bool
    cost_nanos: int
    attempts: int
    duration_ms: int
    #: The provider's usage report could not be true (not whole numbers, more output
    #: than allowed or delivered): the counts billed are Prism's estimate instead.
    usage_suspect: bool = False
    #: The serving line's region, when the catalog names one.
    region: str | None = None

    def as_tuple(self) -> tuple[Any, ...]:
        values: tuple[Any, ...] = _COLUMN_VALUES(self)
        return values


COLUMNS: tuple[str, ...] = tuple(field.name for field in attrs.fields(LedgerRow))
#: The row's values in column order, read in C (``attrs.astuple`` walks its fields
#: in Python: a sizeable share of a row's cost).
_COLUMN_VALUES = operator.attrgetter(*COLUMNS)


def utc_day(timestamp: float) -> tuple[str, str]:
    """``(ts, day)`` for a POSIX timestamp, in UTC: ``2026-11-30T16:31:11.042Z``."""
    # Rounded to the microsecond as datetime.fromtimestamp rounds (half to even on
    # the fraction), then cut to the millisecond as isoformat(timespec=...) cuts.
    fraction, whole = math.modf(timestamp)
    micro = round(fraction * 1_000_000)
    second = int(whole)
    if micro >= 1_000_000:
        second, micro = second + 1, micro - 1_000_000
    elif micro < 0:
        second, micro = second - 1, micro + 1_000_000
    prefix, day = _utc_second(second)
    return f"{prefix}.{micro // 1000:03d}Z", day


@functools.lru_cache(maxsize=4)
def _utc_second(second: int) -> tuple[str, str]:
    """The formatted second and day: every call in the same second shares them."""
    moment = datetime.datetime.fromtimestamp(second, datetime.UTC)
    return moment.strftime("%Y-%m-%dT%H:%M:%S"), moment.date().isoformat()


def build_row(
    call: Call, settlement: Settlement, prices: PriceBook, *, now: float, duration_ms: int
) -> LedgerRow:
    """The row for a settled call; only ``settlement.served`` is priced."""
    served = settlement.served
    usage = settlement.usage
    ts, day = utc_day(now)
    cost = 0
    unpriced = False
    estimated = False
    suspect = False
    tokens: tuple[int, int, int, int] | None = None
    if served is not None:
        price = prices.price_of(served.binding)
        unpriced = price is None
        if usage is None:
            # Served, but the provider reported nothing and nothing could be estimated.
            estimated = True
        else:
            estimated = usage.estimated
            suspect = usage.suspect
            tokens = (
                clamp_tokens(usage.input_tokens),
                clamp_tokens(usage.cached_input_tokens),
                clamp_tokens(usage.cache_creation_tokens),
                clamp_tokens(usage.output_tokens),
            )
        if price is not None:
            cost = price.cost_of_tokens(tokens)
    if tokens is None:
        tokens = (0, 0, 0, 0)
    return LedgerRow(
        request_id=call.request_id,
        ts=ts,
        day=day,
        key_id=call.principal.key_id,
        org=call.principal.org,
        model=call.model_name,
        endpoint=str(call.endpoint),
        stream=call.stream,
        traffic=call.traffic,
        outcome=settlement.outcome,
        status=settlement.status,
        error_code=settlement.error_code,
        provider=served.binding.provider if served else None,
        upstream_model=served.binding.model if served else None,
        input_tokens=tokens[0],
        cached_input_tokens=tokens[1],
        cache_creation_tokens=tokens[2],
        output_tokens=tokens[3],
        estimated=estimated,
        unpriced=unpriced,
        cost_nanos=cost,
        attempts=len(call.attempts),
        duration_ms=max(duration_ms, 0),
        usage_suspect=suspect,
        region=served.binding.region if served else None,
    )
