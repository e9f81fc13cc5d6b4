"""The Bedrock error model: ``x-amzn-ErrorType`` and the JSON ``{"message": ...}`` body.

Bedrock names its errors in the ``x-amzn-ErrorType`` header
(``ThrottlingException:http://internal.amazon.com/...``; some answers carry
``__type`` or ``code`` in the body instead), and a stream's exception frames by
their ``:exception-type`` (``throttlingException``), which the provider
presents as a one-key event. Both are read case-insensitively.
"""

from __future__ import annotations

from typing import Any

from prism_proxy import (
    Outcome,
    UpstreamResult,
    Verdict,
    content_filtered,
    error_model,
    model_not_found,
    parse_retry_after,
    permanent_marker,
    refused_credentials,
    rejected_request,
)

from .wire import FILTERED, event_name

__all__ = ["classify_bedrock", "error_type"]

_QUOTA = "upstream_quota_exhausted"

#: Refused credentials or signatures: a broken line, never the caller's fault.
_AUTH_ERRORS = frozenset(
    {
        "accessdeniedexception",
        "unrecognizedclientexception",
        "invalidsignatureexception",
        "incompletesignatureexception",
        "missingauthenticationtokenexception",
        "expiredtokenexception",
        "signaturedoesnotmatch",
    }
)
_TRANSIENT = frozenset(
    {
        "modelnotreadyexception",
        "modeltimeoutexception",
        "modelerrorexception",
        "modelstreamerrorexception",
        "internalserverexception",
        "serviceunavailableexception",
    }
)


def error_type(result: UpstreamResult) -> str | None:
    """The error's type, lower-cased, from the header, the body or an exception event."""
    header = result.headers.get("x-amzn-ErrorType") or result.headers.get("x-amzn-errortype")
    if header:
        return header.split(":", 1)[0].strip().lower()
    payload = result.json
    if isinstance(payload, dict):
        for key in ("__type", "code"):
            value = payload.get(key)
            if isinstance(value, str) and value:
                return value.rsplit("#", 1)[-1].lower()
        named = event_name(payload)
        if named is not None and named[0].endswith("Exception"):
            return named[0].lower()
    return None


def _empty(payload: Any) -> bool:
    """Cut by maxTokens with nothing in it: a whole answer, or the committing messageStop."""
    if not isinstance(payload, dict):
        return False
    named = event_name(payload)
    if named is not None and named[0] == "messageStop" and isinstance(named[1], dict):
        return named[1].get("stopReason") == "max_tokens"
    if payload.get("stopReason") != "max_tokens":
        return False
    output = payload.get("output")
    message = output.get("message") if isinstance(output, dict) else None
    content = message.get("content") if isinstance(message, dict) else None
    return not any(
        isinstance(block, dict) and (block.get("text") or block.get("toolUse"))
        for block in content or ()
    )


def _stop_reason(payload: Any) -> str | None:
    if not isinstance(payload, dict):
        return None
    named = event_name(payload)
    if named is not None and named[0] == "messageStop" and isinstance(named[1], dict):
        reason = named[1].get("stopReason")
    else:
        reason = payload.get("stopReason")
    return reason if isinstance(reason, str) else None


@error_model
def classify_bedrock(
    result: UpstreamResult, extra_markers: tuple[str, ...] = (), /
) -> Verdict | None:
    """A verdict for a Bedrock upstream result, or None to let the default decide."""
    kind = error_type(result)
    if result.status == 200 and kind is None:
        if result.stream_broken:
            return Verdict(Outcome.BROKEN_STREAM, "stream broke before content")
        payload = result.json
        if not isinstance(payload, dict):
            return Verdict(Outcome.TRANSIENT, "200 without a JSON answer")
        reason = _stop_reason(payload)
        if reason in FILTERED:
            return content_filtered(f"stopReason {reason}")
        if _empty(payload):
            return Verdict(Outcome.EMPTY, "empty content, stopReason max_tokens")
        return Verdict(Outcome.OK)
    retry_after = parse_retry_after(result.headers)
    if kind == "throttlingexception" or (kind is None and result.status == 429):
        return Verdict(Outcome.RATE_LIMITED, "throttled", retry_after)
    if kind == "servicequotaexceededexception":
        return Verdict(Outcome.PERMANENT, "service quota exceeded", code=_QUOTA)
    if kind in _AUTH_ERRORS or (kind is None and result.status in (401, 403)):
        return refused_credentials(kind or result.status)
    if kind == "resourcenotfoundexception" or (kind is None and result.status == 404):
        return model_not_found()
    if kind in _TRANSIENT:
        return Verdict(Outcome.TRANSIENT, f"upstream {kind}", retry_after)
    marked = permanent_marker(result, extra_markers)
    if marked is not None:
        return marked
    if kind == "validationexception" or (kind is None and result.status in (400, 413, 422)):
        return rejected_request(result.status)
    return Verdict(Outcome.TRANSIENT, f"upstream {kind or result.status}", retry_after)
