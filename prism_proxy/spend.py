"""What a call costs and what has been spent: the types of the ``pricing`` and ``spend`` services.

prism-billing provides both: it prices the catalog's lines and keeps the
ledger.  A plugin that limits spending (prism-limits) consumes them, so that
what it counts is what billing bills, to the nano-unit, and so that its
counters can be rebuilt from the ledger, which is the truth.

Money is an ``int`` of nano-units (10^-9 of the catalog's currency): exact to
add and compare, in Python, Redis and SQL alike.
"""

from __future__ import annotations

import datetime
from collections.abc import Mapping
from typing import Protocol, runtime_checkable

import attrs

from .call import Usage
from .catalog import Binding

__all__ = ["NANOS", "Pricing", "Spend", "SpendLedger", "SpendSnapshot", "SpendTotals"]

#: Nano-units per unit of the catalog's currency.
NANOS = 10**9


@runtime_checkable
class Pricing(Protocol):
    """The catalog's prices, as billing charges them."""

    #: The currency the prices are in (a label such as ``USD``).
    currency: str

    def priced(self, binding: Binding) -> bool:
        """Does ``binding`` carry a price?  (An unpriced line costs 0.)"""
        ...

    def cost(self, binding: Binding, usage: Usage | None) -> int:
        """What billing charges for ``usage`` served by ``binding``, in nano-units."""
        ...


@attrs.frozen
class Spend:
    """What one ``(org, key_id, model)`` spent in a window: served calls, tokens, cost."""

    calls: int = 0
    tokens: int = 0
    nanos: int = 0


#: Spend per ``(org, key_id, model)``; ``org`` and ``key_id`` are None where the
#: ledger row has none (an anonymous caller, a key without an organisation).
SpendTotals = Mapping[tuple[str | None, str | None, str], Spend]


@attrs.frozen
class SpendSnapshot:
    """The ledger's totals and, read in the same snapshot, which recent calls they hold.

    A counter rebuilt from the ledger while calls are settling cannot tell,
    from a total alone, whether a call it saw settle a moment ago is in that
    total (its row committed before the read) or not yet: ``recent`` names the
    calls (by request id) whose rows the total counts among those settled at
    or after the read's ``recent_since``, per ``(org, key_id, model)``.
    """

    totals: SpendTotals
    recent: Mapping[tuple[str | None, str | None, str], frozenset[str]]


@runtime_checkable
class SpendLedger(Protocol):
    """The ledger's totals, for rebuilding counters from the truth."""

    async def spend_since(self, since: datetime.datetime | None) -> SpendTotals:
        """Customer calls settled at or after ``since`` (UTC; None: ever), summed.

        Counts what was billed: served calls only, operator traffic excluded.
        Raises the engine's error when the ledger cannot be read.
        """
        ...

    async def spend_snapshot(
        self, since: datetime.datetime | None, recent_since: datetime.datetime
    ) -> SpendSnapshot:
        """``spend_since(since)`` and, from the same read of the ledger (one snapshot),
        the request ids of the counted rows settled at or after ``recent_since``."""
        ...
