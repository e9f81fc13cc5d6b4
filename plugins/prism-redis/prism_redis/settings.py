"""``[prism:redis]``: where the shared state lives and how often gateways exchange it."""

from __future__ import annotations

import re
import urllib.parse

import attrs

from prism_proxy import Config, Section, read_settings, redact_url, setting

__all__ = ["SECTION", "RedisSettings"]

SECTION = "redis"
_SCHEMES = ("redis://", "rediss://", "unix://")
_PREFIX = re.compile(r"[A-Za-z0-9_.:-]{1,64}")


def _url(section: Section, key: str, default: object) -> str:
    url = section.get_str(key)
    if not url:
        raise section.error(
            key,
            "missing: name the Redis to share state through (url = redis://host:6379/0); "
            "without it prism-redis is off and every gateway keeps its own breaker "
            "state and line capacity (to leave it off, remove the section)",
        )
    if not url.startswith(_SCHEMES):
        raise section.error(key, f"must start with {', '.join(_SCHEMES)} (got {_shown(url)!r})")
    return url


def _prefix(section: Section, key: str, default: str) -> str:
    prefix = section.get_str(key) or default
    if not _PREFIX.fullmatch(prefix):
        raise section.error(key, "1 to 64 characters from letters, digits and _ . : -")
    return prefix


@attrs.frozen
class RedisSettings:
    url: str = setting(
        help="`redis://`, `rediss://` (TLS) or `unix://`; a password in it never reaches logs, "
        "errors or `/readyz`",
        parse=_url,
        type_text="URL",
        default_text="required in the section (no section: plugin inactive)",
    )
    key_prefix: str = setting(
        "prism",
        help="every key starts with `<key_prefix>:`; gateways that share state share the prefix",
        parse=_prefix,
        type_text="text: 1 to 64 of letters, digits and `_ . : -`",
    )
    sync_s: float = setting(
        0.5,
        min=0.05,
        max=10.0,
        help="how often each gateway exchanges window counts, latency baselines and trial "
        "successes, and pings a Redis that stopped answering",
    )
    timeout_ms: int = setting(
        250,
        min=10,
        max=10_000,
        help="the longest one Redis command may take before Redis counts as down (no retries: "
        "a dead Redis costs one timeout)",
    )
    lease_s: float = setting(
        60.0,
        min=5.0,
        max=3600.0,
        help="a capacity lease of a gateway that died is reclaimed after at most this (leases "
        "held are renewed every `lease_s / 3`)",
    )

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
        if not section.written:
            return None
        return read_settings(cls, section)


def _shown(url: str) -> str:
    """``url`` safe to show: no password, and no query (``unix://...?password=`` has one)."""
    shown = redact_url(url)
    try:
        return urllib.parse.urlunsplit(urllib.parse.urlsplit(shown)._replace(query=""))
    except ValueError:
        return shown
