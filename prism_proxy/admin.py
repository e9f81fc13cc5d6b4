"""The admin API's one gate: a bearer token named by ``[prism] admin_token_env``.

Plugins wrap their admin handlers with :func:`admin_handler`; with no token
configured every admin route answers 403 ``admin_disabled``.
"""

from __future__ import annotations

import functools
import hmac
import urllib.parse
from collections.abc import Awaitable, Callable

from aiohttp import web

from .answers import error_response
from .errors import PrismError
from .gateway import GATEWAY

__all__ = ["ADMIN_HEADER", "admin_handler", "is_admin", "require_admin"]

#: The admin token on a call to the model API, where ``Authorization`` carries the
#: caller's API key (``x-prism-traffic`` needs it).
ADMIN_HEADER = "x-prism-admin-token"

Handler = Callable[[web.Request], Awaitable[web.StreamResponse]]


def require_admin(request: web.Request) -> None:
    """Raise PrismError unless the request carries the admin token (compared in constant time)."""
    token = request.app[GATEWAY].config.admin_token
    if not token:
        raise PrismError(
            403, "admin_disabled", "the admin API is off: set [prism] admin_token_env to enable it"
        )
    scheme, _, value = request.headers.get("Authorization", "").partition(" ")
    if scheme.lower() != "bearer" or not hmac.compare_digest(value.encode(), token.encode()):
        raise PrismError(401, "invalid_admin_token", "missing or invalid admin token")


def is_admin(request: web.Request, *, cookie: str | None = None, header: str | None = None) -> bool:
    """Whether the request carries the admin token: in ``Authorization``; or in the
    header named ``header`` (a model API call, whose ``Authorization`` is an API
    key); or in the cookie named ``cookie`` (read-only pages a browser opens, whose
    ``EventSource`` cannot send headers)."""
    try:
        require_admin(request)
        return True
    except PrismError:
        pass
    token = request.app[GATEWAY].config.admin_token
    if not token:
        return False
    value = request.headers.get(header, "") if header else ""
    if not value and cookie:
        value = urllib.parse.unquote(request.cookies.get(cookie, ""))
    return bool(value and hmac.compare_digest(value.encode(), token.encode()))


def admin_handler(handler: Handler) -> Handler:
    """Wrap an aiohttp handler: admin token required; PrismError becomes a JSON error
    in the shape the caller reads."""

    @functools.wraps(handler)
    async def wrapped(request: web.Request) -> web.StreamResponse:
        try:
            require_admin(request)
            return await handler(request)
        except PrismError as err:
            return error_response(err, request=request)

    return wrapped
