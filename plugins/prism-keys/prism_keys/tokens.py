"""Key material: making new keys, hashing them, and reading the key id a key carries.

A key looks like ``sk-prism-<id>-<secret>``: ``<id>`` is 12 hex digits that
name the key in the database and in ``prism keys list`` (not a secret), and
``<secret>`` is 32 random bytes, URL-safe base64.  Only the SHA-256 of the
whole key is stored.  A plain (unsalted, unstretched) hash suits a 256-bit
random secret: there is no dictionary to guess from, and it keeps the check
on every request to one fast digest.
"""

from __future__ import annotations

import hashlib
import hmac
import secrets

import attrs

__all__ = [
    "KEY_PREFIX",
    "MAX_KEY_CHARS",
    "NewKey",
    "hash_key",
    "hash_matches",
    "key_id_of",
    "new_key",
    "rekey",
]

KEY_PREFIX = "sk-prism-"
ID_CHARS = 12
SECRET_BYTES = 32
#: Longer credentials are refused before hashing; a real key is 65 characters.
MAX_KEY_CHARS = 256
_HEX = frozenset("0123456789abcdef")
#: Compared against when the key id is unknown, so both paths do the same work.
_NO_MATCH = "0" * 64


@attrs.frozen(repr=False)
class NewKey:
    """A key just made: ``key`` exists only here and in the creator's output."""

    key_id: str
    key: str
    hash: str

    def __repr__(self) -> str:
        return f"NewKey(key_id={self.key_id!r}, key=<hidden>)"


def new_key() -> NewKey:
    key_id = secrets.token_hex(ID_CHARS // 2)
    key = f"{KEY_PREFIX}{key_id}-{secrets.token_urlsafe(SECRET_BYTES)}"
    return NewKey(key_id=key_id, key=key, hash=hash_key(key))


def rekey(key_id: str) -> NewKey:
    """A new text (and hash) for the existing key ``key_id``: what a rotation hands out."""
    key = f"{KEY_PREFIX}{key_id}-{secrets.token_urlsafe(SECRET_BYTES)}"
    return NewKey(key_id=key_id, key=key, hash=hash_key(key))


def hash_key(key: str) -> str:
    return hashlib.sha256(key.encode("utf-8", "surrogateescape")).hexdigest()


def key_id_of(presented: str) -> str | None:
    """The key id inside a presented key, or None when it does not have the shape of one."""
    if not presented.startswith(KEY_PREFIX) or len(presented) > MAX_KEY_CHARS:
        return None
    start = len(KEY_PREFIX)
    key_id = presented[start : start + ID_CHARS]
    if len(key_id) != ID_CHARS or not set(key_id) <= _HEX:
        return None
    if presented[start + ID_CHARS : start + ID_CHARS + 1] != "-":
        return None
    return key_id


def hash_matches(presented: str, stored_hash: str | None) -> bool:
    """Constant-time comparison of the presented key's hash with the stored one."""
    return hmac.compare_digest(hash_key(presented), stored_hash or _NO_MATCH)
