"""The attempt record, as response headers and as the error body's ``attempts`` list."""

from __future__ import annotations

from typing import Any

from .call import Call, Skip

__all__ = ["REQUEST_ID_HEADER", "attempt_log", "attempt_record", "prism_headers"]

#: The header every response carries: a call's id, or one of its own for any other answer.
REQUEST_ID_HEADER = "x-prism-request-id"


def attempt_record(call: Call) -> list[dict[str, Any]]:
    """Everything dispatch did, in order, as JSON-ready dicts (the error body's ``attempts``)."""
    record: list[dict[str, Any]] = []
    for entry in call.record:
        if isinstance(entry, Skip):
            item = {"outcome": entry.kind, "reason": entry.reason}
            if entry.binding is not None:
                item["binding"] = entry.binding.id
            record.append(item)
            continue
        verdict = entry.verdict
        record.append(
            {
                "binding": entry.binding.id,
                "outcome": str(verdict.outcome) if verdict else "pending",
                "status": entry.status,
                "ms": round(entry.elapsed_ms),
                "reason": verdict.reason if verdict else "",
            }
        )
        if entry.sent_as is not None:
            record[-1]["sent_as"] = entry.sent_as
    return record


def attempt_log(call: Call) -> str:
    """Compact one-line record, in order, entries joined by ``; ``.

    An attempt is ``binding outcome status ms``, then how the line got the call
    when not plainly (``native responses``, ``translated to anthropic``); a binding left out is
    ``binding skipped reason`` or ``binding vetoed reason``; a note is
    ``note text``.  Reasons and notes keep their spaces (a reader splits an
    entry on its first two spaces, or its first one for a note); a ``;`` in
    them becomes ``,`` so that entries still split on ``; ``.
    """
    parts = []
    for entry in call.record:
        if isinstance(entry, Skip):
            if entry.binding is None:
                parts.append(f"note {_token(entry.reason)}")
            else:
                parts.append(f"{entry.binding.id} {entry.kind} {_token(entry.reason)}")
            continue
        outcome = entry.verdict.outcome if entry.verdict else "pending"
        status = entry.status if entry.status is not None else "-"
        sent_as = f" {entry.sent_as}" if entry.sent_as is not None else ""
        parts.append(f"{entry.binding.id} {outcome} {status} {round(entry.elapsed_ms)}ms{sent_as}")
    return _header_safe("; ".join(parts))


def prism_headers(call: Call) -> dict[str, str]:
    """The x-prism-* headers every response carries, success or error."""
    headers = {REQUEST_ID_HEADER: call.request_id}
    last = call.served or (call.attempts[-1] if call.attempts else None)
    if last is not None:
        headers["x-prism-provider"] = _header_safe(last.binding.provider)
        headers["x-prism-model"] = _header_safe(last.binding.model)
        if last.binding.region is not None:
            headers["x-prism-region"] = last.binding.region
        if last.params_adjusted:
            headers["x-prism-params-adjusted"] = _header_safe("; ".join(last.params_adjusted))
    headers["x-prism-attempts"] = str(len(call.attempts))
    if call.record:
        headers["x-prism-attempt-log"] = attempt_log(call)
    if call.route is not None and call.route.name != "default":
        headers["x-prism-route"] = _header_safe(call.route.name)
    headers.update(call.response_headers)
    return headers


def _token(text: str) -> str:
    # One line, one space between words, and no "; " that would end the entry early.
    return " ".join(text.replace(";", ",").split()) or "-"


def _header_safe(text: str) -> str:
    """Header values must be one line of latin-1; catalog names are operator-written."""
    if text.isascii() and "\n" not in text and "\r" not in text:
        return text
    return text.encode("latin-1", "replace").decode("latin-1").replace("\r", " ").replace("\n", " ")
