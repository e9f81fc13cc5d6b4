"""Google's error model (``google.rpc.Status``), for attempts on Gemini and Vertex lines.

Errors are ``{"error": {"code", "message", "status", "details"}}``.  A
``RESOURCE_EXHAUSTED`` (429) is either a per-minute rate limit (retry, after
the ``RetryInfo`` delay when given) or a spent quota: a ``QuotaFailure``
whose violation is a per-day or billing quota, or a message saying the
quota or billing is exhausted, which no retry fixes today.
"""

from __future__ import annotations

import re
from typing import Any

from prism_proxy import (
    Outcome,
    UpstreamResult,
    Verdict,
    error_model,
    model_not_found,
    parse_retry_after,
    permanent_marker,
    refused_credentials,
    rejected_request,
)

from .wire import finish_reason, parts_of

__all__ = ["classify_gemini"]

_AUTH = "upstream_auth_failed"
_QUOTA = "upstream_quota_exhausted"
_TYPE = "type.googleapis.com/google.rpc."
#: Words in a quota's id or the message that mean a quota no retry will outlast today.
_SPENT = ("perday", "per_day", "per day", "daily", "billing")
_SPENT_MESSAGES = ("per day", "daily", "billing account")
_QUOTA_KEYS = ("quotaId", "quotaMetric", "subject", "description")
_KEY_REASONS = ("API_KEY_INVALID", "API_KEY_EXPIRED", "API_KEY_SERVICE_BLOCKED")
_DURATION = re.compile(r"^([0-9]+(?:\.[0-9]+)?)s$")


def _error(payload: Any) -> dict[str, Any] | None:
    if isinstance(payload, list) and payload:
        payload = payload[0]  # a JSON-array stream's error comes as its only element
    error = payload.get("error") if isinstance(payload, dict) else None
    return error if isinstance(error, dict) else None


def _details(error: dict[str, Any], kind: str) -> list[dict[str, Any]]:
    details = error.get("details")
    return (
        [d for d in details if isinstance(d, dict) and d.get("@type") == _TYPE + kind]
        if isinstance(details, list)
        else []
    )


def _retry_delay(error: dict[str, Any]) -> float | None:
    for info in _details(error, "RetryInfo"):
        match = _DURATION.match(str(info.get("retryDelay", "")))
        if match:
            return float(match.group(1))
    return None


def _bad_key(error: dict[str, Any]) -> bool:
    """Google answers a bad API key as a 400 INVALID_ARGUMENT, its ErrorInfo says which."""
    return any(
        str(info.get("reason", "")).startswith(_KEY_REASONS)
        for info in _details(error, "ErrorInfo")
    )


def _quota_spent(error: dict[str, Any]) -> bool:
    """Whether a RESOURCE_EXHAUSTED is a spent daily or billing quota, not a rate limit.

    The violations decide when there are any: Google's message is the same
    for both ("You exceeded your current quota, please check your plan and
    billing details"), only the quota's id says per minute or per day.
    """
    violations = [
        violation
        for failure in _details(error, "QuotaFailure")
        for violation in failure.get("violations") or ()
        if isinstance(violation, dict)
    ]
    if violations:
        return any(
            word in " ".join(str(v.get(key, "")) for key in _QUOTA_KEYS).lower()
            for v in violations
            for word in _SPENT
        )
    message = str(error.get("message", "")).lower()
    return any(words in message for words in _SPENT_MESSAGES)


def _empty(payload: Any) -> bool:
    """Cut by the token limit before any visible content (thinking may have spent it)."""
    if not isinstance(payload, dict) or finish_reason(payload) != "MAX_TOKENS":
        return False
    candidates = payload.get("candidates") or [{}]
    return not any(
        isinstance(part, dict)
        and not part.get("thought")
        and (part.get("text") or "functionCall" in part)
        for part in parts_of(candidates[0])
    )


@error_model
def classify_gemini(
    result: UpstreamResult, extra_markers: tuple[str, ...] = (), /
) -> Verdict | None:
    """A verdict for a Gemini or Vertex result, or None to let the default decide."""
    error = _error(result.json)
    if result.status == 200 and error is None:
        if result.stream_broken:
            return Verdict(Outcome.BROKEN_STREAM, "stream broke before content")
        if _empty(result.json):
            return Verdict(Outcome.EMPTY, "empty content, finishReason MAX_TOKENS")
        return None  # an answer: the core judges the rest (a filtered one too)
    status = str((error or {}).get("status", ""))
    retry_after = parse_retry_after(result.headers)
    if error is not None and retry_after is None:
        retry_after = _retry_delay(error)
    # Before the markers: a per-minute limit says "exceeded your current quota" too.
    if status == "RESOURCE_EXHAUSTED" or result.status == 429:
        if error is not None and _quota_spent(error):
            return Verdict(Outcome.PERMANENT, "quota exhausted", code=_QUOTA)
        return Verdict(Outcome.RATE_LIMITED, "rate limited", retry_after)
    marked = permanent_marker(result, extra_markers)
    if marked is not None:
        return marked
    if status in ("UNAVAILABLE", "INTERNAL", "DEADLINE_EXCEEDED", "ABORTED") or (
        result.status is not None and result.status >= 500
    ):
        return Verdict(Outcome.TRANSIENT, f"upstream {status or result.status}", retry_after)
    if error is not None and _bad_key(error):
        return Verdict(Outcome.PERMANENT, "upstream refused the API key", code=_AUTH)
    if status in ("UNAUTHENTICATED", "PERMISSION_DENIED") or result.status in (401, 403):
        return refused_credentials(status or result.status)
    if status == "NOT_FOUND" or result.status == 404:
        return model_not_found()
    if status == "FAILED_PRECONDITION":
        # The account, not the call: billing not enabled, a region the API does not serve.
        return Verdict(Outcome.PERMANENT, "upstream account cannot serve this", code=_QUOTA)
    if status in ("INVALID_ARGUMENT", "OUT_OF_RANGE") or result.status in (400, 413):
        return rejected_request(status or result.status)
    if result.status == 200:
        # An error event inside a stream, before its first content.
        return Verdict(
            Outcome.TRANSIENT, f"upstream error event {status or ''}".strip(), retry_after
        )
    return Verdict(Outcome.TRANSIENT, f"upstream {status or result.status}", retry_after)
