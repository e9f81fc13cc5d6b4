"""Operator overrides: quarantine and cap, their scopes, and reading times people type.

Overrides take precedence over automation: a quarantined binding gets no
ordinary traffic whatever its state, and only an explicit release lifts it.
A cap limits a binding's in-flight attempts and may expire on its own.
"""

from __future__ import annotations

import datetime as dt
import os
import re
from collections.abc import Iterable, Mapping
from typing import Any

import attrs

from prism_proxy import Binding, Override, OverrideKind, OverrideScope

__all__ = [
    "KINDS",
    "SCOPES",
    "OverrideBook",
    "OverrideError",
    "audit_subjects",
    "build_override",
    "check_target",
    "describe",
    "iso",
    "new_override_id",
    "override_json",
    "parse_when",
    "subject",
]

KINDS: tuple[OverrideKind, ...] = ("quarantine", "cap")
SCOPES: tuple[OverrideScope, ...] = ("binding", "provider", "model")
MAX_REASON = 500
MAX_OWNER = 100


class OverrideError(ValueError):
    """Bad override input; ``field`` names what was wrong."""

    def __init__(self, field: str, problem: str) -> None:
        super().__init__(f"{field}: {problem}")
        self.field = field
        self.problem = problem


def build_override(
    *,
    kind: str,
    scope: str,
    target: str,
    reason: str,
    owner: str,
    created_at: float,
    review_by: str | None,
    review_default_s: float,
    max_in_flight: int | None = None,
    expires: str | None = None,
) -> Override:
    """Validate operator input (admin API and CLI alike); raises :class:`OverrideError`."""
    if kind not in KINDS:
        raise OverrideError("kind", f"expected one of {', '.join(KINDS)}, got {kind!r}")
    if scope not in SCOPES:
        raise OverrideError("scope", f"expected one of {', '.join(SCOPES)}, got {scope!r}")
    target = _text("target", target, 300)
    reason = _text("reason", reason, MAX_REASON)
    owner = _text("owner", owner, MAX_OWNER)
    review_at = (
        created_at + review_default_s
        if review_by is None
        else parse_when("review_by", review_by, created_at)
    )
    expires_at = None if expires is None else parse_when("expires", expires, created_at)
    if kind == "cap":
        if max_in_flight is None:
            raise OverrideError("max_in_flight", "a cap needs max_in_flight")
        if isinstance(max_in_flight, bool) or not isinstance(max_in_flight, int):
            raise OverrideError("max_in_flight", f"expected a whole number, got {max_in_flight!r}")
        if not 0 <= max_in_flight <= 100_000:
            raise OverrideError("max_in_flight", f"must be 0..100000, got {max_in_flight}")
    else:
        if max_in_flight is not None:
            raise OverrideError("max_in_flight", "only a cap has max_in_flight")
        if expires_at is not None:
            raise OverrideError(
                "expires", "a quarantine never expires on its own: release it explicitly"
            )
    return Override(
        id=new_override_id(),
        kind=kind,
        scope=scope,
        target=target,
        reason=reason,
        owner=owner,
        created_at=created_at,
        review_by=review_at,
        expires_at=expires_at,
        max_in_flight=max_in_flight,
    )


def override_json(override: Override, wall_now: float, *, with_text: bool = True) -> dict[str, Any]:
    """JSON form; ``with_text`` False leaves out the operator's reason and name."""
    out: dict[str, Any] = {
        "id": override.id,
        "kind": override.kind,
        "scope": override.scope,
        "target": override.target,
        "created": iso(override.created_at),
        "review_by": iso(override.review_by),
        "review_overdue": override.review_overdue(wall_now),
    }
    if override.kind == "cap":
        out["max_in_flight"] = override.max_in_flight
        out["expires"] = iso(override.expires_at) if override.expires_at is not None else None
        out["expired"] = override.expired(wall_now)
    if with_text:
        out["reason"] = override.reason
        out["owner"] = override.owner
    return out


def describe(override: Override) -> str:
    what = "quarantine" if override.kind == "quarantine" else f"cap {override.max_in_flight}"
    return f"{what} ({override.id})"


def subject(override: Override) -> str:
    """What an audit row about ``override`` names: a binding id, or ``scope:target``."""
    if override.scope == "binding":
        return override.target
    return f"{override.scope}:{override.target}"


def audit_subjects(binding: Binding) -> list[str]:
    """What the audit rows about ``binding`` name: it, or a scope that covers it."""
    return [binding.id, f"provider:{binding.provider}", f"model:{binding.model}"]


def check_target(override: Override, bindings: Mapping[str, Binding]) -> None:
    """Refuse a scope that matches nothing in the catalog: a typo must not quarantine nothing."""
    if not any(override.covers(b) for b in bindings.values()):
        known = {
            "binding": sorted(bindings),
            "provider": sorted({b.provider for b in bindings.values()}),
            "model": sorted({b.model for b in bindings.values()}),
        }[override.scope]
        shown = ", ".join(known[:20]) + (" ..." if len(known) > 20 else "")
        raise OverrideError(
            "target", f"no {override.scope} {override.target!r} in the catalog (known: {shown})"
        )


@attrs.define
class OverrideBook:
    """The active overrides, indexed for the hot path (usually empty)."""

    active: dict[str, Override] = attrs.field(factory=dict)

    def replace(self, overrides: Iterable[Override]) -> None:
        self.active = {o.id: o for o in overrides}

    def add(self, override: Override) -> None:
        self.active[override.id] = override

    def remove(self, override_id: str) -> Override | None:
        return self.active.pop(override_id, None)

    def for_binding(self, binding: Binding, wall_now: float) -> list[Override]:
        if not self.active:
            return []
        return [o for o in self.active.values() if o.covers(binding) and not o.expired(wall_now)]

    def expired(self, wall_now: float) -> list[Override]:
        return [o for o in self.active.values() if o.expired(wall_now)]

    def overdue(self, wall_now: float) -> list[Override]:
        return [o for o in self.active.values() if o.review_overdue(wall_now)]

    def review_soon(self, wall_now: float, warn_s: float) -> list[Override]:
        """Not overdue yet, but due within ``warn_s``."""
        return [
            o
            for o in self.active.values()
            if not o.review_overdue(wall_now) and wall_now >= o.review_by - warn_s
        ]


_DURATION = re.compile(r"([0-9]+(?:\.[0-9]+)?)\s*(s|m|h|d|w)")
_UNIT_S = {"s": 1, "m": 60, "h": 3600, "d": 86400, "w": 7 * 86400}


def parse_when(field: str, text: str, now: float) -> float:
    """A future wall-clock time: a duration from now (``90m``, ``36h``, ``7d``) or ISO 8601.

    An ISO time without a zone is taken as UTC.
    """
    if not isinstance(text, str) or not text.strip():
        raise OverrideError(field, "expected a duration like 36h or an ISO 8601 time")
    raw = text.strip()
    match = _DURATION.fullmatch(raw)
    if match:
        when = now + float(match.group(1)) * _UNIT_S[match.group(2)]
    else:
        try:
            parsed = dt.datetime.fromisoformat(raw.replace("Z", "+00:00"))
        except ValueError:
            raise OverrideError(
                field, f"expected a duration like 36h or an ISO 8601 time, got {raw!r}"
            ) from None
        if parsed.tzinfo is None:
            parsed = parsed.replace(tzinfo=dt.UTC)
        when = parsed.timestamp()
    if when <= now:
        raise OverrideError(field, f"must be in the future, got {raw!r}")
    return when


def iso(epoch: float) -> str:
    return (
        dt.datetime.fromtimestamp(epoch, dt.UTC)
        .isoformat(timespec="seconds")
        .replace("+00:00", "Z")
    )


def new_override_id() -> str:
    # Random rather than a row number: ids stay unique across stores and replicas.
    return "ovr_" + os.urandom(6).hex()


def _text(field: str, value: object, limit: int) -> str:
    if not isinstance(value, str) or not value.strip():
        raise OverrideError(field, "required, a non-empty string")
    text = value.strip()
    if len(text) > limit:
        raise OverrideError(field, f"at most {limit} characters, got {len(text)}")
    if any(ch in text for ch in "\r\n\x00"):
        raise OverrideError(field, "must be a single line")
    return text
