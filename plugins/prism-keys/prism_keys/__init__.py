"""prism-keys: API keys that belong to organisations, with scopes, stored hashed in SQLite."""

from .keyring import ActiveKey, KeyRing
from .plugin import ring_of
from .scopes import Grants, ScopeError, parse_scopes
from .store import KeyStore
from .tokens import hash_key

__all__ = [
    "ring_of",
    "ActiveKey",
    "Grants",
    "KeyRing",
    "KeyStore",
    "ScopeError",
    "hash_key",
    "parse_scopes",
]
