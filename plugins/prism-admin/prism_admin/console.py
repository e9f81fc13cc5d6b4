"""``GET /prism/console``: the administration console, and its single sign-on routes.

The page is ``console.html`` with ``console.css`` and ``console.js`` (files
of this package, no build step) put inline as it is served, so it runs under
the board's content-security policy: nothing is fetched from anywhere but
this gateway.  All it shows it reads from the admin API with the session
cookie; it renders data as text (``textContent``), never as markup.
"""

from __future__ import annotations

import html
import importlib.resources

from aiohttp import web

from .access import wall_now
from .sessions import COOKIE, sessions_of, set_cookie
from .settings import AdminSettings
from .sso import OidcClient, SsoError, client_session

__all__ = ["CSP", "add_console_routes", "page"]

PAGE = "/prism/console"
SSO_START = "/prism/console/sso"
SSO_CALLBACK = "/prism/console/sso/callback"
#: The browser's half of a pending sign-in: Lax, since the provider sends the browser back
#: from another site (a Strict cookie would not come along).
STATE_COOKIE = "prism_sso_state"
#: The board's policy (everything inline, nothing from elsewhere), and no framing.
CSP = (
    "default-src 'none'; script-src 'unsafe-inline'; style-src 'unsafe-inline'; "
    "connect-src 'self'; img-src 'self' data:; frame-ancestors 'none'; base-uri 'none'; "
    "form-action 'self'"
)
_HEADERS = {
    "Content-Security-Policy": CSP,
    "Cache-Control": "no-store",
    "X-Frame-Options": "DENY",
    "Referrer-Policy": "no-referrer",
}


def add_console_routes(app: web.Application) -> None:
    app.router.add_get(PAGE, page)
    app.router.add_get(SSO_START, sso_start)
    app.router.add_get(SSO_CALLBACK, sso_callback)


def _read(name: str) -> str:
    return importlib.resources.files("prism_admin").joinpath("console", name).read_text()


def _settings(request: web.Request) -> tuple[AdminSettings, OidcClient | None]:
    from .plugin import console_state

    state = console_state(request)
    return state.settings, state.sso


async def page(request: web.Request) -> web.Response:
    _, sso = _settings(request)
    text = (
        _read("console.html")
        .replace("/*STYLE*/", _read("console.css"))
        .replace("/*SCRIPT*/", _read("console.js"))
        .replace("{{SSO}}", "" if sso is not None else "hidden")
    )
    return web.Response(text=text, content_type="text/html", headers=_HEADERS)


def _failed(message: str, status: int) -> web.Response:
    body = (
        "<!doctype html><html lang=en><meta charset=utf-8><title>Sign-in refused</title>"
        f"<main><h1>Sign-in refused</h1><p role=alert>{html.escape(message)}</p>"
        f'<p><a href="{PAGE}">Back to the console</a></p></main></html>'
    )
    response = web.Response(text=body, status=status, content_type="text/html", headers=_HEADERS)
    response.del_cookie(STATE_COOKIE, path=SSO_START)
    return response


def _redirect_uri(request: web.Request, settings: AdminSettings) -> str:
    if settings.redirect_uri:
        return settings.redirect_uri
    return f"{request.scheme}://{request.host}{SSO_CALLBACK}"


async def sso_start(request: web.Request) -> web.StreamResponse:
    settings, sso = _settings(request)
    if sso is None:
        return _failed("single sign-on is not configured ([prism:admin] oidc_issuer)", 404)
    now = wall_now(request)
    try:
        async with client_session() as http:
            url, state, pending = await sso.start(http, _redirect_uri(request, settings), now)
    except SsoError as exc:
        return _failed(str(exc), exc.status)
    await sessions_of(request).hold(state, pending, now)
    response = web.Response(status=302, headers={"Location": url, "Cache-Control": "no-store"})
    response.set_cookie(
        STATE_COOKIE,
        state,
        max_age=600,
        path=SSO_START,
        httponly=True,
        samesite="Lax",
        secure=settings.cookie_secure or request.secure,
    )
    return response


async def sso_callback(request: web.Request) -> web.StreamResponse:
    settings, sso = _settings(request)
    if sso is None:
        return _failed("single sign-on is not configured ([prism:admin] oidc_issuer)", 404)
    query = request.query
    if "error" in query:
        return _failed(f"the provider said: {query['error'][:100]}", 401)
    state = query.get("state")
    book = sessions_of(request)
    now = wall_now(request)
    # The state must be the one this browser was sent off with (the cookie), and unused.
    if not state or request.cookies.get(STATE_COOKIE) != state:
        return _failed("this sign-in was not started by this browser", 400)
    pending = await book.take(state, now)
    code = query.get("code")
    if pending is None or not code:
        return _failed("this sign-in is unknown, used already or too old: start again", 400)
    try:
        async with client_session() as http:
            claims = await sso.finish(http, code, pending, now)
        identity = sso.identity(claims)
    except SsoError as exc:
        return _failed(str(exc), exc.status)
    await book.close(request.cookies.get(COOKIE))  # replaces this browser's earlier session
    session = await book.open(identity, now, settings.session_s)
    response = web.Response(status=303, headers={"Location": PAGE, "Cache-Control": "no-store"})
    response.del_cookie(STATE_COOKIE, path=SSO_START)
    set_cookie(response, request, session, settings.session_s, secure=settings.cookie_secure)
    return response
