"""``[prism:cache]``: where answers are kept, for how long, and how much of them."""

from __future__ import annotations

from typing import Any

import attrs

from prism_proxy import Config, Section, read_settings, setting

__all__ = ["SECTION", "CacheSettings"]

SECTION = "cache"
_STORES = ("", "memory", "redis")


def _store(section: Section, key: str, default: str) -> str:
    value = (section.get_str(key, default) or "").strip().lower()
    if value not in _STORES:
        raise section.error(key, f"expected memory or redis, got {value[:32]!r}")
    return value


@attrs.frozen
class CacheSettings:
    store: str = setting(
        "",
        parse=_store,
        help="memory (this process) or redis (the fleet, through prism-redis); unset: off",
        type_text="memory | redis",
        default_text="unset (off)",
    )
    ttl_s: int = setting(
        300, min=1, max=30 * 86400, help="how long an answer is kept (a model's cache_ttl_s wins)"
    )
    max_bytes: int = setting(
        64 * 1024 * 1024,
        min=1024,
        help="memory store: the most bytes of entries kept; the least recently used go first",
    )
    max_entry_bytes: int = setting(
        256 * 1024,
        min=256,
        max=16 * 1024 * 1024,
        help="the longest answer kept (as the caller got it); longer ones are not cached",
    )
    redis_timeout_ms: int = setting(
        250, min=1, max=10_000, help="redis store: a lookup slower than this is a miss"
    )

    @property
    def enabled(self) -> bool:
        return bool(self.store)

    @classmethod
    def from_config(cls, config: Config) -> CacheSettings:
        return read_settings(cls, config.section(SECTION))

    @classmethod
    def describe(cls) -> dict[str, type[Any]]:
        return {SECTION: cls}
