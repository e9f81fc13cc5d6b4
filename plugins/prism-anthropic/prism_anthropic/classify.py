"""The Anthropic error model, for attempts on Anthropic bindings.

Anthropic names its errors by ``error.type``; billing exhaustion arrives
as a 400 ``invalid_request_error`` whose message says the credit balance is
too low, which is why the body decides before the status.
"""

from __future__ import annotations

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

_QUOTA = "upstream_quota_exhausted"


def _error_type(payload: Any) -> str | None:
    if isinstance(payload, dict) and payload.get("type") == "error":
        error = payload.get("error")
        if isinstance(error, dict):
            kind = error.get("type")
            return kind if isinstance(kind, str) else "unknown"
    return None


def _empty(payload: Any) -> bool:
    """Cut by max_tokens with nothing in it: a whole message or the committing stream event."""
    if not isinstance(payload, dict):
        return False
    if payload.get("type") == "message_delta":
        return (payload.get("delta") or {}).get("stop_reason") == "max_tokens"
    if payload.get("type") == "message" and payload.get("stop_reason") == "max_tokens":
        return not any(
            block.get("text") or block.get("type") == "tool_use"
            for block in payload.get("content") or ()
        )
    return False


@error_model
def classify_anthropic(
    result: UpstreamResult, extra_markers: tuple[str, ...] = (), /
) -> Verdict | None:
    """A verdict for an Anthropic upstream result, or None to let the default decide."""
    payload = result.json
    error_type = _error_type(payload)
    if result.status == 200 and error_type is None:
        if result.stream_broken:
            return Verdict(Outcome.BROKEN_STREAM, "stream broke before content")
        if not isinstance(payload, dict):
            return Verdict(Outcome.TRANSIENT, "200 without a JSON answer")
        if _empty(payload):
            return Verdict(Outcome.EMPTY, "empty content, stop_reason max_tokens")
        return Verdict(Outcome.OK)
    marked = permanent_marker(result, extra_markers)
    if marked is not None:
        return marked
    retry_after = parse_retry_after(result.headers)
    if error_type == "overloaded_error" or result.status == 529:
        return Verdict(Outcome.TRANSIENT, "overloaded", retry_after)
    if error_type == "rate_limit_error" or result.status == 429:
        return Verdict(Outcome.RATE_LIMITED, "rate limited", retry_after)
    if error_type in ("authentication_error", "permission_error") or result.status in (401, 403):
        return refused_credentials(result.status)
    if error_type == "billing_error" or result.status == 402:
        return Verdict(Outcome.PERMANENT, "billing error", code=_QUOTA)
    if error_type == "not_found_error" or result.status == 404:
        return model_not_found()
    if error_type in ("invalid_request_error", "request_too_large") or result.status in (
        400,
        413,
        422,
    ):
        return rejected_request(result.status)
    return Verdict(Outcome.TRANSIENT, f"upstream {error_type or result.status}", retry_after)
