"""The prism_proxy entry point ``admin``: the admin API's routes, the console, single sign-on."""

from __future__ import annotations

import logging
import os
from typing import Any

import attrs
from aiohttp import web

from prism_proxy import GATEWAY, SHARED_STATE, Config, Generation, hookimpl

from .console import add_console_routes
from .routes import add_routes
from .sessions import SESSIONS, SessionBook
from .settings import SECTION, AdminSettings
from .sso import OidcClient

__all__ = ["ConsoleState", "console_state", "settings_of"]

STATE = "admin.console"

log = logging.getLogger("prism.admin")


@attrs.frozen
class ConsoleState:
    """One generation's ``[prism:admin]``, and its OpenID Connect client (None: no SSO)."""

    settings: AdminSettings
    sso: OidcClient | None = None


@hookimpl
def prism_settings() -> dict[str, type[Any]]:
    return {SECTION: AdminSettings}


@hookimpl
def prism_generation(generation: Generation) -> None:
    settings = AdminSettings.from_config(generation.config)
    sso = None
    if settings.oidc_issuer is not None:
        secret_env = settings.client_secret_env
        secret = os.environ.get(secret_env) if secret_env else None
        if secret_env and not secret:
            raise generation.config.section(SECTION).error(
                "client_secret_env", f"the environment variable {secret_env} is not set"
            )
        sso = OidcClient(settings, secret)
    generation.register(ConsoleState(settings, sso), STATE)


@hookimpl
def prism_workers(generation: Generation, count: int) -> str | None:
    # The admin API itself is sound in any number of workers (the key database is
    # shared); only console sessions kept in one process are not, so say it, not stop.
    if generation.services.get(SHARED_STATE) is None:
        log.warning(
            "admin: console sessions are kept in each process; with %d workers a browser "
            "signed in on one is not on the others. Share them through Redis (install "
            "prism-redis and set [prism:redis] url) or serve the console from one worker",
            count,
        )
    return None


def console_state(request: web.Request) -> ConsoleState:
    found = request.app[GATEWAY].current.plugin(STATE)
    return found if isinstance(found, ConsoleState) else ConsoleState(AdminSettings())


def settings_of(request: web.Request) -> AdminSettings:
    return console_state(request).settings


@hookimpl
def prism_app_setup(app: web.Application, config: Config) -> None:
    app[SESSIONS] = SessionBook()
    add_routes(app)
    add_console_routes(app)
