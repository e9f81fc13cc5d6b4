"""Default classification of an attempt, on status AND body.

The outcomes and what dispatch does with each: the README's "What happens on failure".

Wire-format agnostic where it can be; it understands OpenAI-shaped bodies.
Provider plugins with another error model override it with ``tryfirst``.
"""

from __future__ import annotations

import asyncio
from typing import TYPE_CHECKING, Any

from ..call import Attempt, Call, Outcome, UpstreamResult, Verdict
from ..classification import find_permanent_marker, marker_code, parse_retry_after
from ..egress import ProxyError
from ..hookimpl import hookimpl

if TYPE_CHECKING:
    from ..generation import Generation

_TRANSIENT_STATUSES = frozenset({408, 409, 425, 500, 502, 503, 504, 529})
_REQUEST_ERROR_STATUSES = frozenset({400, 413, 415, 422})
#: Most answers: one verdict (frozen) shared by all of them instead of one made per call.
_OK = Verdict(Outcome.OK)


@hookimpl
def prism_generation(generation: Generation) -> None:
    markers = generation.config.permanent_markers
    generation.register(DefaultClassify(markers), "prism.default-classify")


class DefaultClassify:
    """The default classifier of one generation, with its extra permanent markers."""

    def __init__(self, extra_markers: tuple[str, ...] = ()) -> None:
        self.extra_markers = extra_markers

    @hookimpl(trylast=True)
    def prism_classify(self, call: Call, attempt: Attempt, result: UpstreamResult) -> Verdict:
        if isinstance(result.error, asyncio.CancelledError):
            return Verdict(Outcome.CANCELLED, "client went away")
        if result.timed_out:
            return Verdict(Outcome.TIMEOUT, "no first byte in time")
        if result.error is not None:
            if isinstance(result.error, ProxyError):
                return Verdict(Outcome.TRANSIENT, result.error.reason)
            # The answer broke off (a cut body, a reset): whatever status it had.
            return Verdict(Outcome.TRANSIENT, "connection failed")
        if result.status is None:
            return Verdict(Outcome.TRANSIENT, "no answer")
        status = result.status
        if status == 200 and result.stream_broken:
            return Verdict(Outcome.BROKEN_STREAM, "stream broke before content")
        if status == 200 and result.plain_commit:
            return _OK  # text, and nothing that could make it an error
        if status == 200 and not _is_error_payload(result.json):
            if not isinstance(result.json, dict):
                # A proxy's HTML page or a truncated body is not an answer.
                return Verdict(Outcome.TRANSIENT, "200 without a JSON answer")
            if _is_empty_completion(result.json):
                return Verdict(Outcome.EMPTY, "empty content, finish_reason length")
            return _OK
        marker = find_permanent_marker(result.text_lower, self.extra_markers)
        if marker is not None:
            return Verdict(Outcome.PERMANENT, f"marker: {marker}", code=marker_code(marker))
        if status == 402:
            return Verdict(Outcome.PERMANENT, "payment required", code="upstream_quota_exhausted")
        if status == 200:
            # An error event inside a 200 stream, before any content.
            return Verdict(Outcome.TRANSIENT, "error event before content")
        if status in (401, 403):
            return Verdict(
                Outcome.PERMANENT,
                f"upstream refused credentials ({status})",
                code="upstream_auth_failed",
            )
        if status == 404:
            return Verdict(
                Outcome.PERMANENT, "upstream model not found", code="upstream_model_not_found"
            )
        if status == 429:
            return Verdict(Outcome.RATE_LIMITED, "rate limited", parse_retry_after(result.headers))
        if status in _TRANSIENT_STATUSES or status >= 500:
            return Verdict(
                Outcome.TRANSIENT, f"upstream {status}", parse_retry_after(result.headers)
            )
        if status in _REQUEST_ERROR_STATUSES or 400 <= status < 500:
            return Verdict(Outcome.REQUEST_ERROR, f"upstream rejected the request ({status})")
        return Verdict(Outcome.TRANSIENT, f"unexpected status {status}")


def _is_error_payload(payload: Any) -> bool:
    # ``"error": null`` is no error: every Responses API answer carries it.
    return (
        isinstance(payload, dict) and payload.get("error") is not None and "choices" not in payload
    )


def _is_empty_completion(payload: Any) -> bool:
    """A chat answer (whole body or committing chunk) with nothing in it, cut by length."""
    if not isinstance(payload, dict):
        return False
    choices = payload.get("choices")
    if not isinstance(choices, list) or not choices:
        return False
    choice = choices[0]
    if not isinstance(choice, dict) or choice.get("finish_reason") != "length":
        return False
    message = choice.get("message") or choice.get("delta") or {}
    if not isinstance(message, dict):
        return False
    return not message.get("content") and not message.get("tool_calls")
