"""Authentication and scope checks, registered only when ``[prism:keys] db_path`` is set.

These hooks live on the generation's object, registered only when keys are
configured: the core warns at start-up that the gateway is open to anyone
when no plugin implements ``prism_authenticate``, and an
installed-but-unconfigured prism-keys must not silence that warning.
"""

from __future__ import annotations

import collections
from collections.abc import Mapping

from prism_proxy import Call, Endpoint, Principal, PrismError, hookimpl

from .keyring import KeyRing
from .scopes import Grants

__all__ = ["AUTH_PLUGIN_NAME", "KeysAuth", "presented_key"]

AUTH_PLUGIN_NAME = "keys.auth"
EXTENSION = "keys"
INVALID_CODE = "invalid_api_key"
#: One message for missing, malformed, unknown and revoked keys: no hint of which.
INVALID_MESSAGE = (
    "the API key is missing, invalid or revoked; send it as 'Authorization: Bearer <key>' "
    "or 'x-api-key: <key>'"
)
SCOPE_CODE = "insufficient_scope"


def presented_key(headers: Mapping[str, str]) -> str | None:
    """The credential a caller sent: ``Authorization: Bearer`` first, else ``x-api-key``."""
    authorization = headers.get("Authorization")
    if authorization:
        scheme, _, value = authorization.strip().partition(" ")
        if scheme.lower() == "bearer" and value.strip():
            return value.strip()
    api_key = headers.get("x-api-key")
    return api_key.strip() if api_key else None


class KeysAuth:
    """The hook implementations that enforce keys and scopes for one gateway."""

    def __init__(self, ring: KeyRing, counters: collections.Counter[str]) -> None:
        self.ring = ring
        self.counters = counters

    @hookimpl
    def prism_authenticate(self, call: Call) -> Principal:
        active = self.ring.verify(presented_key(call.request.headers))
        if active is None:
            self.counters["keys_rejected"] += 1
            raise PrismError(401, INVALID_CODE, INVALID_MESSAGE)
        endpoint = str(call.endpoint)
        # The model list is part of the API: any valid key may read it.
        if call.endpoint is not Endpoint.MODELS and not active.grants.allows_endpoint(endpoint):
            self.counters["keys_scope_denied"] += 1
            raise PrismError(
                403,
                SCOPE_CODE,
                f"this API key may not use the {endpoint} endpoint (it needs the scope "
                f"'{endpoint}')",
            )
        call.extensions[EXTENSION] = active.grants
        return active.principal

    # tryfirst: refuse on scope before other plugins spend effort on the call.
    @hookimpl(tryfirst=True)
    def prism_call_start(self, call: Call) -> None:
        grants = call.extensions.get(EXTENSION)
        if not isinstance(grants, Grants) or call.model is None:
            return  # another authentication plugin answered for this call
        model = call.model.name
        if not grants.allows_model(model):
            self.counters["keys_scope_denied"] += 1
            raise PrismError(
                403,
                SCOPE_CODE,
                f"this API key may not use model '{model}' (it needs the scope "
                f"'model:{model}' or a pattern covering it)",
                param="model",
            )
