"""``[prism:redis]``: where the shared state lives and how often gateways exchange it."""

from __future__ import annotations

import re
import urllib.parse

import attrs

from prism_proxy import Config, redact_url

__all__ = ["SECTION", "RedisSettings"]

SECTION = "redis"
_KEYS = frozenset({"url", "key_prefix", "sync_s", "timeout_ms", "lease_s"})
_SCHEMES = ("redis://", "rediss://", "unix://")
_PREFIX = re.compile(r"[A-Za-z0-9_.:-]{1,64}")


@attrs.frozen
class RedisSettings:
    url: str
    #: Every key this gateway writes starts with ``<key_prefix>:``.
    key_prefix: str = "prism"
    #: How often window counts, latency baselines and trial successes are exchanged,
    #: and how often an unreachable Redis is tried again.
    sync_s: float = 0.5
    #: The longest one Redis command may take before it counts as Redis being down.
    timeout_ms: int = 250
    #: A capacity lease outlives a gateway that died holding it by at most this.
    lease_s: float = 60.0

    @property
    def where(self) -> str:
        """The URL without its password, and the prefix: for logs, health and errors."""
        return f"{_shown(self.url)} (prefix {self.key_prefix})"

    @classmethod
    def from_config(cls, config: Config) -> RedisSettings | None:
        """None when there is no section: the plugin then stays out of the way.

        A section without ``url`` is an error: each gateway would keep its own
        breaker state and line capacity, so a fleet's ``max_concurrency`` would
        silently multiply by the number of gateways.
        """
        section = config.section(SECTION)
        section.check_keys(_KEYS)
        url = section.get_str("url")
        if not url:
            if section.written:
                raise section.error(
                    "url",
                    "missing: name the Redis to share state through (url = redis://host:6379/0); "
                    "without it prism-redis is off and every gateway keeps its own breaker "
                    "state and line capacity (to leave it off, remove the section)",
                )
            return None
        if not url.startswith(_SCHEMES):
            raise section.error(
                "url", f"must start with {', '.join(_SCHEMES)} (got {_shown(url)!r})"
            )
        prefix = section.get_str("key_prefix") or "prism"
        if not _PREFIX.fullmatch(prefix):
            raise section.error("key_prefix", "1 to 64 characters from letters, digits and _ . : -")
        return cls(
            url=url,
            key_prefix=prefix,
            sync_s=section.get_float("sync_s", 0.5, min=0.05, max=10.0),
            timeout_ms=section.get_int("timeout_ms", 250, min=10, max=10_000),
            lease_s=section.get_float("lease_s", 60.0, min=5.0, max=3600.0),
        )


def _shown(url: str) -> str:
    """``url`` safe to show: no password, and no query (``unix://...?password=`` has one)."""
    shown = redact_url(url)
    try:
        return urllib.parse.urlunsplit(urllib.parse.urlsplit(shown)._replace(query=""))
    except ValueError:
        return shown
