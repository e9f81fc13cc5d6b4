"""The attempt record, as response headers and as the error body's ``attempts`` list."""

from __future__ import annotations

from typing import Any

from .call import Call

__all__ = ["attempt_log", "attempt_record", "prism_headers"]


def attempt_record(call: Call) -> list[dict[str, Any]]:
    """Every attempt and every binding skipped before dispatch, in order, as JSON-ready dicts."""
    record: list[dict[str, Any]] = []
    if call.route is not None:
        for binding, reason in call.route.skipped:
            record.append({"binding": binding.id, "outcome": "skipped", "reason": reason})
    for attempt in call.attempts:
        verdict = attempt.verdict
        record.append(
            {
                "binding": attempt.binding.id,
                "outcome": str(verdict.outcome) if verdict else "pending",
                "status": attempt.status,
                "ms": round(attempt.elapsed_ms),
                "reason": verdict.reason if verdict else "",
            }
        )
    return record


def attempt_log(call: Call) -> str:
    """Compact one-line record: ``binding outcome status ms`` entries joined by ``; ``."""
    parts = []
    if call.route is not None:
        for binding, reason in call.route.skipped:
            parts.append(f"{binding.id} skipped {_token(reason)}")
        for note in call.route.notes:
            parts.append(f"note {_token(note)}")
    for attempt in call.attempts:
        outcome = attempt.verdict.outcome if attempt.verdict else "pending"
        status = attempt.status if attempt.status is not None else "-"
        parts.append(f"{attempt.binding.id} {outcome} {status} {round(attempt.elapsed_ms)}ms")
    return _header_safe("; ".join(parts))


def prism_headers(call: Call) -> dict[str, str]:
    """The x-prism-* headers every response carries, success or error."""
    headers = {"x-prism-request-id": call.request_id}
    last = call.served or (call.attempts[-1] if call.attempts else None)
    if last is not None:
        headers["x-prism-provider"] = _header_safe(last.binding.provider)
        headers["x-prism-model"] = _header_safe(last.binding.model)
        if last.params_adjusted:
            headers["x-prism-params-adjusted"] = _header_safe("; ".join(last.params_adjusted))
    headers["x-prism-attempts"] = str(len(call.attempts))
    if call.attempts or (call.route is not None and (call.route.skipped or call.route.notes)):
        headers["x-prism-attempt-log"] = attempt_log(call)
    if call.route is not None and call.route.name != "default":
        headers["x-prism-route"] = _header_safe(call.route.name)
    headers.update(call.response_headers)
    return headers


def _token(text: str) -> str:
    return "-".join(text.split()) or "-"


def _header_safe(text: str) -> str:
    """Header values must be one line of latin-1; catalog names are operator-written."""
    return text.encode("latin-1", "replace").decode("latin-1").replace("\r", " ").replace("\n", " ")
