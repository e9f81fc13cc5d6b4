"""Shared pieces of classification: billing/credential markers and Retry-After.

Provider plugins that override ``prism_classify`` reuse these so every
classifier agrees on what "permanent" means and how long to wait.
"""

from __future__ import annotations

import email.utils
import time
from collections.abc import Callable, Iterable, Mapping
from typing import Any

from .call import Outcome, Verdict

__all__ = [
    "CONTENT_FILTERED",
    "CONTEXT_MARKERS",
    "PERMANENT_MARKERS",
    "content_filtered",
    "find_permanent_marker",
    "is_context_refusal",
    "marker_code",
    "parse_retry_after",
]

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


#: What an upstream's 400 says when the prompt does not fit the model's context
#: window: OpenAI's error code, and Anthropic's invalid_request_error message
#: ("prompt is too long: 208310 tokens > 200000 maximum").
CONTEXT_MARKERS: tuple[str, ...] = ("context_length_exceeded", "prompt is too long")


def is_context_refusal(result: Any) -> bool:
    """Whether an upstream answer (an ``UpstreamResult``) refused the prompt as too long.

    Read only for a request error of a model with ``context_fallback``: a 400
    (413 for a body that big) whose body names the context window.
    """
    if result.status not in (400, 413):
        return False
    text: str = result.text_lower
    return any(marker in text for marker in CONTEXT_MARKERS)


#: The outcome and caller-facing code of a prompt or answer a content filter stopped.
CONTENT_FILTERED = "content_filtered"


def content_filtered(reason: str) -> Verdict:
    """The verdict for a content filter's refusal: of the prompt (a provider's own
    error, which its classifier recognises) or of the answer (a finish reason in
    the wire's ``filtered``, which the core recognises itself).

    Never retried on the same line; the model's ``empty`` policy decides
    whether the caller is told (``return``) or the next line tried (``fallback``).
    """
    return Verdict(Outcome.CONTENT_FILTERED, reason, code=CONTENT_FILTERED)


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
