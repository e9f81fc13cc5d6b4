"""prism-billing: a durable ledger (SQLite or PostgreSQL) billing the line that served."""

from .billing import COST_HEADER, Billing, billing_of
from .ledger import LedgerWriter
from .pg_ledger import PostgresLedgerWriter
from .prices import Price, PriceBook, format_nanos, parse_price
from .rows import LedgerRow

__all__ = [
    "COST_HEADER",
    "Billing",
    "LedgerRow",
    "LedgerWriter",
    "PostgresLedgerWriter",
    "Price",
    "PriceBook",
    "format_nanos",
    "billing_of",
    "parse_price",
]
