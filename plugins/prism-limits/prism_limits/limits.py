"""What can be limited, how an operator writes it, and which limits apply to a call.

Four settings, each on an organisation (``prism keys org-set``), on a key
(``prism keys set``) and, for either, on one model (``rpm@gpt-4o``):

- ``rpm``: requests in any 60 seconds;
- ``tpm``: tokens (prompt and output) in any 60 seconds;
- ``max_parallel``: calls in flight at once;
- ``budget``: an amount in the catalog's currency per calendar ``hour``,
  ``day``, ``week`` (from Monday), ``month`` (UTC) or in ``total``:
  ``250/month``.

``budget_mode`` (``hard``, the default, or ``soft``) says whether a spent
budget refuses calls or only alerts.  A call must fit every limit that
applies: its organisation's, its key's, and the per-model ones of both.
``[prism:limits]`` gives the limits of callers without an organisation.
"""

from __future__ import annotations

import enum
from collections.abc import Iterator, Mapping
from decimal import Decimal, InvalidOperation
from typing import Any, Final

import attrs

from prism_proxy import NANOS, OrgSetting, per_model_name

__all__ = [
    "BUDGET",
    "BUDGET_MODE",
    "MAX_PARALLEL",
    "METRICS",
    "RPM",
    "TPM",
    "Budget",
    "Kind",
    "Limit",
    "Owner",
    "Period",
    "applying",
    "declarations",
    "format_money",
    "parse_budget",
    "parse_count",
    "parse_mode",
]

RPM: Final = "rpm"
TPM: Final = "tpm"
MAX_PARALLEL: Final = "max_parallel"
BUDGET: Final = "budget"
BUDGET_MODE: Final = "budget_mode"
METRICS: Final = (RPM, TPM, MAX_PARALLEL, BUDGET)
#: Far above any real limit, low enough that no counter can overflow 64 bits.
_MAX_COUNT = 10**12
_MAX_AMOUNT = Decimal(10**9)


class Kind(enum.Enum):
    """How a limit counts."""

    WINDOW = "window"  # rpm, tpm: a sliding 60-second window
    PARALLEL = "parallel"  # calls in flight
    BUDGET = "budget"  # money per calendar period

    # Members are singletons: hashed by identity, in C (Enum's own hash is Python code,
    # paid on every dict lookup keyed by one, several per limited call).
    __hash__ = object.__hash__


class Period(enum.Enum):
    HOUR = "hour"
    DAY = "day"
    WEEK = "week"
    MONTH = "month"
    TOTAL = "total"

    __hash__ = object.__hash__  # as Kind's


@attrs.frozen
class Budget:
    """An amount (nano-units of the catalog's currency) per period."""

    nanos: int
    period: Period

    def __str__(self) -> str:
        return f"{format_money(self.nanos)}/{self.period.value}"


def format_money(nanos: int) -> str:
    """Nano-units as the operator wrote them: ``250``, ``0.05`` (exact, no float)."""
    whole, part = divmod(abs(nanos), NANOS)
    sign = "-" if nanos < 0 else ""
    if not part:
        return f"{sign}{whole}"
    return f"{sign}{whole}.{part:09d}".rstrip("0")


def parse_count(text: str) -> int:
    """A whole number from 0 (0 refuses every call) up to a trillion."""
    try:
        value = int(text.strip())
    except ValueError:
        raise ValueError(f"expected a whole number, got {text.strip()[:32]!r}") from None
    if not 0 <= value <= _MAX_COUNT:
        raise ValueError(f"expected a whole number from 0 to {_MAX_COUNT}, got {value}")
    return value


def parse_budget(text: str) -> Budget:
    """``250/month``, ``5/day``, ``0.5/hour``, ``1000/week``, ``90/total``."""
    amount_text, sep, period_text = text.strip().partition("/")
    periods = ", ".join(period.value for period in Period)
    if not sep:
        raise ValueError(f"expected AMOUNT/PERIOD (PERIOD one of {periods}), got {text[:32]!r}")
    try:
        period = Period(period_text.strip())
    except ValueError:
        raise ValueError(
            f"expected a period from {periods}, got {period_text.strip()[:32]!r}"
        ) from None
    try:
        amount = Decimal(amount_text.strip())
    except InvalidOperation:
        raise ValueError(
            f"expected an amount such as 250 or 0.5, got {amount_text[:32]!r}"
        ) from None
    if not amount.is_finite() or amount < 0 or amount > _MAX_AMOUNT:
        raise ValueError(f"expected an amount from 0 to {_MAX_AMOUNT}, got {amount_text!r}")
    nanos = amount.scaleb(9)
    if nanos != nanos.to_integral_value():
        raise ValueError(f"an amount has at most 9 decimals, got {amount_text!r}")
    return Budget(int(nanos), period)


def parse_mode(text: str) -> bool:
    """``hard`` (refuse) → False, ``soft`` (serve and alert) → True."""
    value = text.strip().lower()
    if value not in ("hard", "soft"):
        raise ValueError(f"expected hard or soft, got {text.strip()[:32]!r}")
    return value == "soft"


def declarations() -> list[OrgSetting]:
    """The settings prism-keys stores for organisations and keys."""
    return [
        OrgSetting(RPM, parse_count, "requests in any 60 seconds", per_key=True, per_model=True),
        OrgSetting(
            TPM,
            parse_count,
            "tokens (prompt and output) in any 60 seconds",
            per_key=True,
            per_model=True,
        ),
        OrgSetting(
            MAX_PARALLEL, parse_count, "calls in flight at once", per_key=True, per_model=True
        ),
        OrgSetting(
            BUDGET,
            parse_budget,
            "spend per period in the catalog's currency: 250/month (hour, day, week, month, "
            "total; calendar periods in UTC)",
            per_key=True,
            per_model=True,
        ),
        OrgSetting(
            BUDGET_MODE,
            parse_mode,
            "hard (a spent budget refuses calls, the default) or soft (serve and alert)",
            per_key=True,
        ),
    ]


@attrs.frozen
class Owner:
    """Whose limit: an organisation, a key, or the callers without an organisation."""

    #: ``organisation``, ``key`` or ``default``.
    scope: str
    #: The organisation's name, the key id, or ``anonymous``.
    name: str


_KINDS: Mapping[str, Kind] = {
    RPM: Kind.WINDOW,
    TPM: Kind.WINDOW,
    MAX_PARALLEL: Kind.PARALLEL,
    BUDGET: Kind.BUDGET,
}


@attrs.frozen
class Limit:
    """One limit that applies to a call."""

    owner: Owner
    metric: str
    #: Requests, tokens, calls in flight, or nano-units.
    value: int
    model: str | None = None
    period: Period | None = None
    soft: bool = False
    #: How it counts (from ``metric``; stored: read on every call).
    kind: Kind = attrs.field(init=False, eq=False, repr=False)
    #: The counter's name, the same on every gateway (a budget's period is added to it).
    counter: str = attrs.field(init=False, eq=False, repr=False)

    @kind.default
    def _kind(self) -> Kind:
        return _KINDS[self.metric]

    @counter.default
    def _counter(self) -> str:
        return f"{self.owner.scope}:{self.owner.name}:{self.model or '*'}:{self.metric}"

    @property
    def setting(self) -> str:
        return self.metric if self.model is None else per_model_name(self.metric, self.model)

    def describe(self) -> str:
        """``organisation acme rpm 600``, ``key k_1 budget@gpt-4o 5/day`` (no caller data)."""
        if self.period is not None:
            amount = f"{format_money(self.value)}/{self.period.value}"
        else:
            amount = str(self.value)
        return f"{self.owner.scope} {self.owner.name} {self.setting} {amount}"


def _from(owner: Owner, settings: Mapping[str, Any], model: str, soft: bool) -> Iterator[Limit]:
    # Over the settings the owner has (few), not over every name a limit could have.
    for name, value in settings.items():
        metric, _, for_model = name.partition("@")
        if metric not in _KINDS or (for_model and for_model != model):
            continue
        if isinstance(value, Budget):
            yield Limit(owner, metric, value.nanos, for_model or None, value.period, soft)
        elif isinstance(value, int):
            yield Limit(owner, metric, value, for_model or None)


def applying(
    org: str | None,
    key_id: str | None,
    org_settings: Mapping[str, Any],
    key_settings: Mapping[str, Any],
    defaults: Mapping[str, Any],
    model: str,
) -> list[Limit]:
    """Every limit a call on ``model`` must fit, its organisation's first."""
    found: list[Limit] = []
    if org is not None:
        soft = bool(org_settings.get(BUDGET_MODE, False))
        found.extend(_from(Owner("organisation", org), org_settings, model, soft))
    elif defaults:
        # Callers without an organisation: each key on its own, anonymous callers together.
        owner = Owner("default", key_id or "anonymous")
        found.extend(_from(owner, defaults, model, bool(defaults.get(BUDGET_MODE, False))))
    if key_id is not None and key_settings:
        soft = bool(key_settings.get(BUDGET_MODE, org_settings.get(BUDGET_MODE, False)))
        found.extend(_from(Owner("key", key_id), key_settings, model, soft))
    return found
