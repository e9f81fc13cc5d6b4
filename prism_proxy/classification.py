"""Shared pieces of classification: billing/credential markers and Retry-After.

Provider plugins that override ``prism_classify`` reuse these so every
classifier agrees on what "permanent" means and how long to wait.
"""

from __future__ import annotations

import email.utils
import time
from collections.abc import Callable, Iterable, Mapping

__all__ = ["PERMANENT_MARKERS", "find_permanent_marker", "marker_code", "parse_retry_after"]

#: Phrases that mean money or credentials.  Deliberately narrow: the bare word
#: "quota" is not here, because a per-minute quota message is transient.
PERMANENT_MARKERS: tuple[str, ...] = (
    "insufficient_quota",
    "credit_balance_exhausted",
    "billing_hard_limit_reached",
    "exceeded your current quota",
    "credit balance is too low",
    "no credits remaining",
    "invalid_api_key",
    "incorrect api key",
    "account_deactivated",
)


def find_permanent_marker(text_lower: str, extra: Iterable[str] = ()) -> str | None:
    """The first marker found in an already lower-cased body, or None."""
    for marker in PERMANENT_MARKERS:
        if marker in text_lower:
            return marker
    for marker in extra:
        if marker in text_lower:
            return marker
    return None


def marker_code(marker: str) -> str:
    """The caller-facing code a permanent marker stands for: credentials or money."""
    return "upstream_auth_failed" if "key" in marker else "upstream_quota_exhausted"


def parse_retry_after(
    headers: Mapping[str, str], now: Callable[[], float] = time.time
) -> float | None:
    """Seconds to wait as the upstream asked: ``retry-after-ms``, then ``Retry-After``.

    ``Retry-After`` may be delay-seconds or an HTTP-date (RFC 9110 §10.2.3).
    Unparseable or negative values are ignored (None).
    """
    millis = headers.get("retry-after-ms")
    if millis is not None:
        try:
            value = float(millis) / 1000
        except ValueError:
            value = -1
        if value >= 0:
            return value
    raw = headers.get("retry-after")
    if raw is None:
        return None
    raw = raw.strip()
    try:
        seconds = float(raw)
    except ValueError:
        try:
            when = email.utils.parsedate_to_datetime(raw)
        except (TypeError, ValueError, IndexError):
            return None
        if when is None:
            return None
        return max(0.0, when.timestamp() - now())
    return seconds if seconds >= 0 else None
