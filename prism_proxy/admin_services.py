"""What the admin API (prism-admin) asks of other plugins: the ``key-admin``, ``usage``,
``overrides`` and ``limits`` services.

The admin API serves organisations, keys, usage and an audit trail over
HTTP, but it keeps none of them: the plugin that keeps keys (prism-keys)
provides :class:`KeyAdmin`, the plugin that keeps the ledger (prism-billing)
provides :class:`UsageReport`, the breaker (prism-breaker) provides
:class:`BreakerOverrides`.  None is imported by the admin plugin; it
asks ``generation.services.get(KEY_ADMIN)``.

Records cross the service as JSON-ready mappings whose members the admin
API's OpenAPI document describes (``Organisation``, ``Key``, ``AuditEntry``,
``UsageRow``).  A provider refuses bad input with :class:`~prism_proxy.PrismError`
(400 ``invalid_request`` naming the field in ``param``, 404 ``not_found``,
409 ``conflict``): the admin API passes it to the caller as it is.  A
refused write changes nothing.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any, Protocol, runtime_checkable

import attrs
from aiohttp import web

__all__ = [
    "Actor",
    "AdminCaller",
    "BreakerOverrides",
    "KeyAdmin",
    "LimitsView",
    "NewSecret",
    "UsageQuery",
    "UsageReport",
]

#: A JSON object as the admin API answers it.
Record = dict[str, Any]


@attrs.frozen
class Actor:
    """Who makes a write, as the audit log records it.

    ``kind`` is ``admin`` (the operator's admin token), ``key`` (an
    ``admin``-scoped key: ``key_id`` names it, never its text) or ``sso`` (a
    person signed in through single sign-on: ``email`` names them);
    ``address`` is the caller's address as the gateway saw it.
    """

    kind: str
    key_id: str | None = None
    address: str | None = None
    email: str | None = None

    @property
    def name(self) -> str:
        """``admin``, ``key:ID`` or ``sso:EMAIL``: the audit log's ``actor``."""
        if self.kind == "sso":
            return f"sso:{self.email}"
        return "admin" if self.kind == "admin" else f"key:{self.key_id}"


@attrs.frozen
class AdminCaller:
    """The active, unexpired key behind a credential, as the admin API authorises it."""

    key_id: str
    org: str
    scopes: frozenset[str]
    #: Its organisation is disabled: the admin API refuses it (403 ``org_disabled``).
    org_disabled: bool = False


@attrs.frozen(repr=False)
class NewSecret:
    """A key record and its text, shown once (created or rotated): ``key`` is never stored."""

    record: Record
    key: str

    def __repr__(self) -> str:
        return f"NewSecret(id={self.record.get('id')!r}, key=<hidden>)"


@runtime_checkable
class KeyAdmin(Protocol):
    """Organisations, keys and the audit trail, for the admin API (``key-admin``).

    Every write takes the :class:`Actor` making it and records, in the same
    transaction, an audit entry with the record before and after (never a
    key's text or hash).  Times are UTC, ISO 8601 text (``...Z``); ``now``
    follows the generation's clock.
    """

    async def caller(self, presented: str) -> AdminCaller | None:
        """The active, unexpired key whose text is ``presented`` (None: no such key); a key
        of a disabled organisation is answered with ``org_disabled`` set."""
        ...

    def now(self) -> float:
        """The wall time (Unix seconds) expiries and grace periods are measured on."""
        ...

    async def list_orgs(self, org: str | None = None) -> list[Record]:
        """Every organisation (or only ``org``), by name."""
        ...

    async def get_org(self, name: str) -> Record | None: ...

    async def create_org(
        self, name: str, tags: Sequence[str], settings: Mapping[str, str], actor: Actor
    ) -> Record:
        """409 ``conflict`` when it exists; settings checked by their declarations."""
        ...

    async def update_org(self, name: str, changes: Mapping[str, Any], actor: Actor) -> Record:
        """``changes``: ``tags`` (list), ``settings`` (name → text, None unsets), ``disabled``
        (bool).  All or nothing; 404 when there is no such organisation."""
        ...

    async def list_keys(self, org: str | None = None) -> list[Record]: ...

    async def get_key(self, key_id: str) -> Record | None: ...

    async def create_key(self, org: str, fields: Mapping[str, Any], actor: Actor) -> NewSecret:
        """``fields``: ``scopes`` (list, required), ``settings``, ``expires_at`` (Unix
        seconds or None), ``description``, ``owner``.  The organisation must exist."""
        ...

    async def update_key(self, key_id: str, changes: Mapping[str, Any], actor: Actor) -> Record:
        """``changes``: any of ``create_key``'s fields but the organisation; None unsets."""
        ...

    async def revoke_key(self, key_id: str, actor: Actor) -> Record: ...

    async def rotate_key(self, key_id: str, grace_s: float, actor: Actor) -> NewSecret:
        """A new text for the key (its id stays); the old text works ``grace_s`` more."""
        ...

    async def audit(
        self, *, org: str | None = None, limit: int = 100, before: int | None = None
    ) -> list[Record]:
        """Audit entries, newest first (``before``: only ids below it)."""
        ...

    async def record(
        self,
        actor: Actor,
        action: str,
        subject: str,
        *,
        org: str | None = None,
        before: Record | None = None,
        after: Record | None = None,
    ) -> None:
        """An audit entry for a write another service made (a breaker override): the
        admin API records it after that write succeeded."""
        ...


@attrs.frozen
class UsageQuery:
    """Which ledger rows, grouped how: days are UTC ``YYYY-MM-DD``, ``until`` exclusive."""

    since: str | None = None
    until: str | None = None
    #: Among ``org``, ``key``, ``model``, ``day``, ``hour``.
    group_by: tuple[str, ...] = ("org", "key", "model", "day")
    org: str | None = None
    key_id: str | None = None
    model: str | None = None


@runtime_checkable
class UsageReport(Protocol):
    """Customer usage from the ledger, for the admin API (``usage``): the numbers
    ``prism ledger export`` gives, summed."""

    currency: str

    async def usage(self, query: UsageQuery) -> tuple[list[Record], Record]:
        """One record per group (its dimensions, ``calls``, ``input_tokens``,
        ``output_tokens``, ``cost`` as a decimal string, ...) and the total of all of them.

        Raises PrismError 503 ``ledger_unavailable`` when the ledger cannot be read.
        """
        ...


@runtime_checkable
class BreakerOverrides(Protocol):
    """The breaker's operator overrides, for the admin API (``overrides``): what
    ``prism breaker quarantine|cap|release`` and ``/prism/breaker/overrides`` do.

    Records are the breaker's JSON form of an override (``id``, ``kind``,
    ``scope``, ``target``, ``reason``, ``owner``, ``created``, ``review_by``,
    ``review_overdue``; a cap adds ``max_in_flight``, ``expires``, ``expired``).
    Bad input raises PrismError 400 ``invalid_request`` naming the field; no
    breaker serving raises 404 ``breaker_off``.  The breaker keeps its own
    audit of each override (actor: the override's owner); the admin API adds
    its entry, with the :class:`Actor`, to the key database's audit log.
    """

    async def list_overrides(self) -> Record:
        """``{"overrides": [...], "overdue_reviews": [ids]}``: the active ones, oldest first."""
        ...

    async def create_override(self, fields: Mapping[str, Any], actor: Actor) -> Record:
        """``fields``: ``kind`` (quarantine or cap), ``scope`` (binding, provider or model),
        ``target``, ``reason``, ``owner``, and optionally ``review_by`` (``36h`` or an ISO
        time; the breaker's default otherwise), ``max_in_flight`` and ``expires`` (a cap)."""
        ...

    async def release_override(
        self, override_id: str, fields: Mapping[str, Any], actor: Actor
    ) -> Record:
        """End an active override (``fields``: ``owner``, ``reason``); 404
        ``override_not_found`` when there is no such active override."""
        ...


@runtime_checkable
class LimitsView(Protocol):
    """How much of each limit an organisation and its keys have left now, for the admin
    API (``limits``): what ``GET /prism/me`` tells a key's holder, for the operator.

    prism-limits provides it.  Each record is one limit set on the organisation
    or on one of the keys, not per model: ``org``, ``key`` (None: the
    organisation's own), ``limit`` (``rpm``, ``tpm``, ``max_parallel`` or
    ``budget``), ``value`` (a count, or a budget's amount as decimal text),
    ``remaining`` (the same unit), ``used`` (``value`` less ``remaining``) and,
    for a budget, ``period``, ``mode`` and ``resets_at``.  Counts are the
    limiter's own (across the fleet when it shares them), as calls are admitted.
    """

    async def readings(
        self, request: web.Request, org: str, key_ids: Sequence[str]
    ) -> list[Record]:
        """The limits of ``org`` and of its keys ``key_ids``; ``request`` is the admin
        API's, which the reading is made for (it carries no caller's body)."""
        ...
