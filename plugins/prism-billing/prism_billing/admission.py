"""No answer without its row: a call nobody could record is refused before any provider is called.

The PostgreSQL ledger's writer knows, from memory, whether a row settled now
would be kept (PostgreSQL answered last time, or else the spool can take it).
When neither can, the call is refused at its start with 503
``ledger_unavailable``: no upstream is called, nothing is served unbilled, and
the caller may retry once the ledger is back.
"""

from __future__ import annotations

import math
from collections.abc import Mapping

import attrs

from prism_proxy import Call, Generation, PrismError, hookimpl

from .pg_ledger import PostgresLedgerWriter

__all__ = ["GUARD_OBJECT", "REFUSED", "LedgerGuard"]

#: The name each generation's guard is registered under.
GUARD_OBJECT = "billing.admission"
#: ``call.extensions`` key of a call the guard refused: it was never served, so no row.
REFUSED = "billing.refused"


@attrs.define(eq=False)
class LedgerGuard:
    """The admission check and the ledger's ``/readyz`` facts, for one generation."""

    writer: PostgresLedgerWriter

    @hookimpl
    def prism_call_start(self, call: Call) -> None:
        writer = self.writer
        if writer.can_take():
            return
        writer.counters["billing_refusals"] += 1
        call.extensions[REFUSED] = True
        # The ledger is retried this often: a caller retrying sooner meets the same refusal.
        call.response_headers["Retry-After"] = str(max(1, math.ceil(writer.retry_s)))
        raise PrismError(
            503,
            "ledger_unavailable",
            "Prism cannot record calls right now (its ledger is unreachable and its spool "
            "cannot take rows), so it refused this call before calling any provider; "
            "retry shortly",
            type="api_error",
        )

    @hookimpl
    def prism_readyz(self, generation: Generation) -> Mapping[str, object]:
        return {"ledger": self.writer.report()}
