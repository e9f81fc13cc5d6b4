"""``/prism/admin/session``: the console's sign-in, who is signed in, and sign-out.

``POST`` takes the admin token or an ``admin`` key once and answers with a
session cookie (see :mod:`.sessions`) and the CSRF token the console sends
with every write; the credential itself is kept nowhere.  It must be JSON
(``Content-Type: application/json``), which another site's form cannot send
without the browser asking this gateway first (and it never agrees).
"""

from __future__ import annotations

import datetime
from typing import Any

from aiohttp import web

from prism_proxy import PrismError

from .access import Credential, identify, keys_or_none, wall_now
from .body import bad, json_body
from .sessions import COOKIE, Session, clear_cookie, sessions_of, set_cookie
from .settings import AdminSettings

__all__ = ["open_session", "session_info", "settings_of", "sign_in", "sign_out", "who_am_i"]


def settings_of(request: web.Request) -> AdminSettings:
    from .plugin import settings_of as current

    return current(request)


def session_info(session: Session) -> dict[str, Any]:
    who = session.identity
    return {
        "who": who.name,
        "org": who.org,
        "operator": who.org is None,
        "csrf": session.csrf,
        "expires": datetime.datetime.fromtimestamp(session.expires_at, datetime.UTC)
        .isoformat(timespec="seconds")
        .replace("+00:00", "Z"),
    }


async def open_session(request: web.Request, identity: Any) -> tuple[Session, AdminSettings]:
    settings = settings_of(request)
    session = await sessions_of(request).open(identity, wall_now(request), settings.session_s)
    return session, settings


async def sign_in(request: web.Request, who: Credential) -> web.StreamResponse:
    if request.content_type != "application/json":
        raise PrismError(
            415, "unsupported_media_type", 'send the credential as JSON: {"token": "..."}'
        )
    body = await json_body(request, ("token",), ("token",))
    token = body["token"]
    if not isinstance(token, str) or not token.strip():
        raise bad("token", "token: the admin token or an admin-scoped API key")
    identity = await identify(request, token.strip(), keys_or_none(request))
    # A sign-in replaces this browser's earlier session rather than leaving it open.
    await sessions_of(request).close(request.cookies.get(COOKIE))
    session, settings = await open_session(request, identity)
    response = web.json_response(session_info(session))
    set_cookie(response, request, session, settings.session_s, secure=settings.cookie_secure)
    response.headers["Cache-Control"] = "no-store"
    return response


async def who_am_i(request: web.Request, who: Credential) -> web.StreamResponse:
    if who.session is None:
        return web.json_response(
            {"who": who.identity.name, "org": who.org, "operator": who.operator, "csrf": None}
        )
    response = web.json_response(session_info(who.session))
    response.headers["Cache-Control"] = "no-store"
    return response


async def sign_out(request: web.Request, who: Credential) -> web.StreamResponse:
    if who.session is not None:
        await sessions_of(request).close(who.session.id)
    response = web.json_response({"signed_out": True})
    clear_cookie(response)
    return response
