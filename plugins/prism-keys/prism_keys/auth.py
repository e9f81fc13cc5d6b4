"""Authentication and scope checks, registered only when ``[prism:keys] db_path`` is set.

These hooks live on the generation's object, registered only when keys are
configured: the core warns at start-up that the gateway is open to anyone
when no plugin implements ``prism_authenticate``, and an
installed-but-unconfigured prism-keys must not silence that warning.

The principal a key stands for carries its organisation's settings
(``settings``, ``NAME@MODEL`` ones included) and the key's own
(``key_settings``), parsed with the declarations (``prism_org_settings``) of
the generation serving the call.  They are parsed once per key-ring
snapshot, not per call: a value that no longer parses (a declaration changed
since it was set) and a name no loaded declaration accepts (undeclared, or
set per key or per model where the declaration no longer allows it) are left
out and logged once, never failing a call.
"""

from __future__ import annotations

import collections
import logging
import time
import types
from collections.abc import Callable, Mapping
from typing import Any

import attrs

from prism_proxy import (
    Call,
    Endpoint,
    ModelSpec,
    OrgSetting,
    Principal,
    PrismError,
    Telemetry,
    hookimpl,
)

from .keyring import NO_SETTINGS, ActiveKey, KeyRing, Snapshot
from .names import Unusable, declaration_for
from .scopes import Grants

__all__ = ["AUTH_PLUGIN_NAME", "KeysAuth", "Owner", "SettingsParser", "presented_key"]

AUTH_PLUGIN_NAME = "keys.auth"
EXTENSION = "keys"
INVALID_CODE = "invalid_api_key"
#: One message for missing, malformed, unknown and revoked keys: no hint of which.
INVALID_MESSAGE = (
    "the API key is missing, invalid or revoked; send it as 'Authorization: Bearer <key>' "
    "or 'x-api-key: <key>'"
)
SCOPE_CODE = "insufficient_scope"
EXPIRED_CODE = "key_expired"
DISABLED_CODE = "org_disabled"

log = logging.getLogger("prism.keys")


def presented_key(headers: Mapping[str, str]) -> str | None:
    """The credential a caller sent: ``Authorization: Bearer`` first, else ``x-api-key``."""
    authorization = headers.get("Authorization")
    if authorization:
        scheme, _, value = authorization.strip().partition(" ")
        if scheme.lower() == "bearer" and value.strip():
            return value.strip()
    api_key = headers.get("x-api-key")
    return api_key.strip() if api_key else None


@attrs.frozen
class Owner:
    """Whose settings are parsed, as the log names it: an organisation, or a key (its id)."""

    kind: str  # "organisation" or "key"
    name: str

    @property
    def preposition(self) -> str:
        return "on key" if self.kind == "key" else "for"

    @property
    def command(self) -> str:
        """The ``prism keys`` action that shows this owner's settings with their status."""
        return "show" if self.kind == "key" else "org-show"


class SettingsParser:
    """Stored settings (text) parsed with one generation's declarations.

    A value that no longer parses and a name no declaration accepts are left
    out and logged once per parser, never failing whoever asked.
    """

    def __init__(self, declarations: Mapping[str, OrgSetting]) -> None:
        self.declarations: Mapping[str, OrgSetting] = dict(declarations)
        # What was already logged, so that each problem is logged once.
        self._reported: set[tuple[str, ...]] = set()

    def parse(self, owner: Owner, stored: Mapping[str, str]) -> Mapping[str, Any]:
        """``owner``'s stored settings, parsed: what a call carries."""
        per_key = owner.kind == "key"
        values: dict[str, Any] = {}
        for name, text in stored.items():
            declaration = declaration_for(self.declarations, name, per_key=per_key)
            if isinstance(declaration, Unusable):
                # Once per name and reason (a setting name, not an owner, is the problem).
                if (owner.kind, "unusable", name, declaration.reason) not in self._reported:
                    self._reported.add((owner.kind, "unusable", name, declaration.reason))
                    log.info(
                        "keys: %s setting %r (set %s %r) is %s; ignored",
                        owner.kind,
                        name,
                        owner.preposition,
                        owner.name,
                        declaration.reason,
                    )
                continue
            try:
                values[name] = declaration.parse(text)
            except Exception as exc:
                # Set when it parsed; its declaration has changed since.  Names
                # only in the log: `prism keys org-show` / `show` says what is wrong.
                if (owner.kind, "invalid", owner.name, name, text) not in self._reported:
                    self._reported.add((owner.kind, "invalid", owner.name, name, text))
                    log.warning(
                        "keys: %s %r: setting %r no longer parses (%s); left out "
                        "(see `prism keys %s %s`)",
                        owner.kind,
                        owner.name,
                        name,
                        type(exc).__name__,
                        owner.command,
                        owner.name,
                    )
        return types.MappingProxyType(values) if values else NO_SETTINGS


class KeysAuth:
    """The hook implementations that enforce keys and scopes for one gateway."""

    def __init__(
        self,
        ring: KeyRing,
        counters: collections.Counter[str],
        declarations: Mapping[str, OrgSetting] | None = None,
        telemetry: Telemetry | None = None,
        wall: Callable[[], float] = time.time,
    ) -> None:
        self.ring = ring
        #: Wall time (Unix seconds) expiry and rotation grace are measured on.
        self.wall = wall
        self.counters = counters
        self.telemetry = telemetry if telemetry is not None else Telemetry()
        #: Parses stored settings with this generation's declarations.
        self.parser = SettingsParser(declarations or {})
        # The parse cache: valid for one ring snapshot (compared by identity).
        self._snapshot: Snapshot | None = None
        self._org_settings: dict[str, Mapping[str, Any]] = {}
        self._principals: dict[str, Principal] = {}

    @property
    def declarations(self) -> Mapping[str, OrgSetting]:
        """This generation's organisation setting declarations, by name."""
        return self.parser.declarations

    def key(self, key_id: str) -> Principal | None:
        """The principal the active key ``key_id`` stands for in the loaded snapshot, or
        None (unknown, revoked, or its organisation disabled)."""
        active = self._current().keys.get(key_id)
        if active is None or active.org_disabled:
            return None
        return self.principal_of(active)

    def organisation(self, org: str) -> Principal | None:
        """``org`` with its tags and parsed settings in the loaded snapshot, or None when
        the key database has no such organisation."""
        tags = self._current().orgs.get(org)
        if tags is None:
            return None
        return Principal(
            org=org,
            org_tags=frozenset(tags),
            settings=self.org_settings(org),
            key_settings=NO_SETTINGS,
        )

    def principal_of(self, active: ActiveKey) -> Principal:
        """The principal ``active`` stands for, with its organisation's and its own parsed
        settings (cached per snapshot, like the settings themselves)."""
        snapshot = self._current()
        key_id = active.principal.key_id or ""
        principal = self._principals.get(key_id)
        if principal is None:
            settings = self.org_settings(active.principal.org or "")
            key_settings = self.parser.parse(
                Owner("key", key_id), snapshot.key_settings.get(key_id) or {}
            )
            principal = (
                active.principal
                if settings is NO_SETTINGS and key_settings is NO_SETTINGS
                else attrs.evolve(active.principal, settings=settings, key_settings=key_settings)
            )
            self._principals[key_id] = principal
        return principal

    def org_settings(self, org: str) -> Mapping[str, Any]:
        """``org``'s settings in the ring's current snapshot, parsed (cached per snapshot)."""
        snapshot = self._current()
        parsed = self._org_settings.get(org)
        if parsed is None:
            parsed = self.parser.parse(Owner("organisation", org), snapshot.settings.get(org) or {})
            self._org_settings[org] = parsed
        return parsed

    def _current(self) -> Snapshot:
        """The ring's snapshot; a new one (a refresh swapped it in) empties the cache."""
        snapshot = self.ring.snapshot
        if snapshot is not self._snapshot:
            self._snapshot, self._org_settings, self._principals = snapshot, {}, {}
        return snapshot

    @hookimpl
    def prism_authenticate(self, call: Call) -> Principal:
        now = self.wall()
        active = self.ring.verify(presented_key(call.request.headers), now)
        if active is None:
            self.counters["keys_rejected"] += 1
            self.telemetry.count("prism_keys_rejected_total", reason=INVALID_CODE)
            raise PrismError(401, INVALID_CODE, INVALID_MESSAGE)
        if active.org_disabled:
            # Said only to whoever holds the key's text: the hash matched.
            self.counters["keys_rejected"] += 1
            self.telemetry.count("prism_keys_rejected_total", reason=DISABLED_CODE)
            raise PrismError(
                403,
                DISABLED_CODE,
                f"this API key's organisation {active.principal.org!r} is disabled; "
                "ask the gateway's operator",
            )
        if active.expired(now):
            # Said only to whoever holds the key's text: the hash matched.
            self.counters["keys_rejected"] += 1
            self.telemetry.count("prism_keys_rejected_total", reason=EXPIRED_CODE)
            raise PrismError(
                401, EXPIRED_CODE, "this API key has expired; ask its organisation for a new one"
            )
        self.ring.touch(active.principal.key_id or "", now)
        endpoint = str(call.endpoint)
        # The model list is part of the API: any valid key may read it.
        if call.endpoint is not Endpoint.MODELS and not active.grants.allows_endpoint(endpoint):
            self.counters["keys_scope_denied"] += 1
            self.telemetry.count("prism_keys_rejected_total", reason=SCOPE_CODE)
            raise PrismError(
                403,
                SCOPE_CODE,
                f"this API key may not use the {endpoint} endpoint (it needs the scope "
                f"'{endpoint}')",
            )
        call.extensions[EXTENSION] = active.grants
        return self.principal_of(active)

    @hookimpl
    def prism_model_allowed(self, call: Call, model: ModelSpec) -> bool | None:
        """The model list shows a key what its scopes let it call, by the rule calls meet."""
        grants = call.extensions.get(EXTENSION)
        if not isinstance(grants, Grants):
            return None  # another authentication plugin answered for this caller
        return grants.allows_model(model.name)

    @hookimpl(tryfirst=True)  # the contract's refusal on who the caller is: first
    def prism_call_start(self, call: Call) -> None:
        if call.model is None or self.prism_model_allowed(call, call.model) is not False:
            return
        model = call.model.name
        self.counters["keys_scope_denied"] += 1
        self.telemetry.count("prism_keys_rejected_total", reason=SCOPE_CODE)
        raise PrismError(
            403,
            SCOPE_CODE,
            f"this API key may not use model '{model}' (it needs the scope "
            f"'model:{model}' or a pattern covering it)",
            param="model",
        )
