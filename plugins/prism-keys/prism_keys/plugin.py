"""The prism_proxy entry point ``keys``."""

from __future__ import annotations

import logging
from collections.abc import Awaitable
from typing import Any

from prism_proxy import PRINCIPALS, CheckLine, Commands, Generation, Offer, hookimpl, provide

from .auth import AUTH_PLUGIN_NAME, KeysAuth
from .check import check_keys
from .cli import add_commands
from .keyring import KeyRing
from .pg_store import PgKeyStore
from .principals import KeysPrincipals
from .settings import SECTION, KeysSettings
from .store import KeyStore

__all__ = ["AUTH_PLUGIN_NAME", "ring_of"]

log = logging.getLogger("prism.keys")


@hookimpl
def prism_services(generation: Generation) -> list[Offer[Any]] | None:
    settings = KeysSettings.from_config(generation.config)
    if settings is None:
        return None  # no key database: nobody to say who an organisation or a key is
    return [provide(PRINCIPALS, lambda: KeysPrincipals(generation, settings))]


@hookimpl
def prism_generation(generation: Generation) -> None:
    settings = KeysSettings.from_config(generation.config)
    if settings is None:
        # Not configured: implement no authentication at all, so the core's
        # "open to anyone" start-up warning stays true and loud.
        return
    # One ring per key database: a reload keeps the keys it loaded and its poll.
    ring = generation.keep(
        ("keys", settings.ident, settings.refresh_s), lambda: _new_ring(settings)
    )
    generation.register(
        KeysAuth(ring, generation.counters, generation.org_settings, generation.telemetry),
        AUTH_PLUGIN_NAME,
    )
    log.info(
        "keys: API keys required, from %s (re-read every %g s%s)",
        settings.name,
        settings.refresh_s,
        ", and at once on NOTIFY" if settings.db_url is not None else "",
    )


def _new_ring(settings: KeysSettings) -> KeyRing:
    if settings.db_url is not None:
        return KeyRing(PgKeyStore(settings.db_url), settings.refresh_s)
    assert settings.db_path is not None
    return KeyRing(KeyStore(settings.db_path), settings.refresh_s)


@hookimpl
def prism_check(generation: Generation, offline: bool) -> Awaitable[list[CheckLine]]:
    return check_keys(KeysSettings.from_config(generation.config), offline)


@hookimpl
def prism_cli(commands: Commands) -> None:
    add_commands(commands)


def ring_of(generation: Generation) -> KeyRing | None:
    """The key ring ``generation`` authenticates with (None: keys are not configured)."""
    auth = generation.plugin(AUTH_PLUGIN_NAME)
    return auth.ring if isinstance(auth, KeysAuth) else None


@hookimpl
def prism_settings() -> dict[str, type[Any]]:
    return {SECTION: KeysSettings}
