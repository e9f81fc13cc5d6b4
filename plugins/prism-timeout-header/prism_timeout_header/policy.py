"""Reading ``x-prism-timeout-ms``: whole milliseconds, clamped to the server's bounds."""

from __future__ import annotations

import re

import attrs

from prism_proxy import Config

__all__ = ["HEADER", "TimeoutPolicy", "apply_header"]

HEADER = "x-prism-timeout-ms"
_WHOLE_MS = re.compile(r"[0-9]{1,9}")


@attrs.frozen
class TimeoutPolicy:
    """The server default (``[prism] attempt_timeout_ms``) and the clamp bounds."""

    default_ms: int
    min_ms: int
    max_ms: int

    @classmethod
    def from_config(cls, config: Config) -> TimeoutPolicy:
        section = config.section("timeout-header")
        section.check_keys({"timeout_min_ms", "timeout_max_ms"})
        min_ms = section.get_int("timeout_min_ms", 1000, min=1000)
        max_ms = section.get_int(
            "timeout_max_ms", max(300_000, config.attempt_timeout_ms), min=min_ms
        )
        if not min_ms <= config.attempt_timeout_ms <= max_ms:
            raise section.error(
                "timeout_max_ms",
                f"[prism] attempt_timeout_ms ({config.attempt_timeout_ms}) must lie within "
                f"[{min_ms}, {max_ms}]",
            )
        return cls(config.attempt_timeout_ms, min_ms, max_ms)


@attrs.frozen
class Applied:
    """What one request's header amounted to."""

    timeout_ms: int
    timeout_retry: bool
    ignored: str | None = None


def apply_header(policy: TimeoutPolicy, value: str | None) -> Applied | None:
    """None when the header is absent; otherwise the effective timeout and retry rule.

    A value that is not a whole number of milliseconds is ignored (the default
    applies and ``ignored`` says why).  A value below the server default
    disables the timeout retry: a short timeout on a long non-streaming
    answer must not cost two generations.
    """
    if value is None:
        return None
    text = value.strip()
    if not _WHOLE_MS.fullmatch(text):
        return Applied(policy.default_ms, True, "not a whole number of milliseconds")
    wanted = int(text)
    effective = min(max(wanted, policy.min_ms), policy.max_ms)
    return Applied(effective, effective >= policy.default_ms)
