"""prism-billing: a durable ledger that bills exactly the catalog line that served."""

from .billing import COST_HEADER, Billing, billing_of
from .ledger import LedgerWriter
from .prices import Price, PriceBook, format_nanos, parse_price
from .rows import LedgerRow

__all__ = [
    "COST_HEADER",
    "Billing",
    "LedgerRow",
    "LedgerWriter",
    "Price",
    "PriceBook",
    "format_nanos",
    "billing_of",
    "parse_price",
]
