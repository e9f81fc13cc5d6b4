"""The prism_proxy entry point ``keys``."""

from __future__ import annotations

import functools
import logging
from collections.abc import Awaitable, Callable
from typing import Any

from prism_proxy import (
    KEY_ADMIN,
    PRINCIPALS,
    CheckLine,
    Commands,
    Generation,
    Offer,
    hookimpl,
    provide,
)

from .admin import KeysAdmin, anchored_wall, write_last_used
from .admin_db import AdminDb
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
    return [
        provide(PRINCIPALS, lambda: KeysPrincipals(generation, settings)),
        provide(KEY_ADMIN, lambda: KeysAdmin(generation, settings, _wall(generation))),
    ]


def _wall(generation: Generation) -> Callable[[], float]:
    """Wall time on the generation's clock: one for auth and administration alike."""
    return generation.memo("keys.wall", lambda: anchored_wall(generation.clock))


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
        KeysAuth(
            ring,
            generation.counters,
            generation.org_settings,
            generation.telemetry,
            wall=_wall(generation),
        ),
        AUTH_PLUGIN_NAME,
    )
    log.info(
        "keys: API keys required, from %s (re-read every %g s%s)",
        settings.name,
        settings.refresh_s,
        ", and at once on NOTIFY" if settings.db_url is not None else "",
    )


def _new_ring(settings: KeysSettings) -> KeyRing:
    # Last use is written once per poll, in one transaction, never per call.
    # The ring checks the schema when it opens the database, before any flush.
    writer = functools.partial(write_last_used, AdminDb(settings, checked=True))
    if settings.db_url is not None:
        return KeyRing(PgKeyStore(settings.db_url), settings.refresh_s, last_used_writer=writer)
    assert settings.db_path is not None
    return KeyRing(KeyStore(settings.db_path), settings.refresh_s, last_used_writer=writer)


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
