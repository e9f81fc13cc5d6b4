"""Who is calling the admin API, and what they may do.

Credentials: ``Authorization: Bearer`` with the operator's admin token
(``[prism] admin_token_env``: everything) or an active, unexpired key with
the scope ``admin`` (prism-keys: its own organisation only: its keys, its
usage, its audit trail); or the console's session cookie, with the rights of
whoever signed in (the token, the key, or a single sign-on user with the
operator's role or one organisation's).  An organisation's administrator may
not create, change or disable organisations (their settings, limits and
budgets included: what the operator set there is the ceiling its keys' own
settings live under), see other organisations, or touch breaker overrides.

Refusals: 401 ``unauthenticated`` (nothing usable presented), 403
``forbidden`` naming the right that is missing, 403 ``org_disabled`` (an
organisation's administrator while the operator has disabled it), 403
``csrf_failed`` (a write with the session cookie but without the session's
CSRF token).
"""

from __future__ import annotations

import hashlib
import hmac
import time

import attrs
from aiohttp import web

from prism_proxy import GATEWAY, KEY_ADMIN, Actor, KeyAdmin, PrismError

from .sessions import COOKIE, CSRF_HEADER, Identity, Session, sessions_of

__all__ = [
    "ADMIN_SCOPE",
    "Credential",
    "authenticate",
    "forbidden",
    "identify",
    "keys_or_none",
    "org_disabled",
    "token_matches",
    "wall_now",
]

ADMIN_SCOPE = "admin"
_SAFE = frozenset({"GET", "HEAD", "OPTIONS"})


@attrs.frozen
class Credential:
    """The operator (``org`` None) or one organisation's administrator: an admin key
    (``key_id``) or a single sign-on user (``email``)."""

    org: str | None = None
    key_id: str | None = None
    address: str | None = None
    email: str | None = None
    #: The console session it came from (None: a bearer credential).
    session: Session | None = None

    @property
    def operator(self) -> bool:
        return self.org is None

    @property
    def identity(self) -> Identity:
        return Identity(self.org, self.key_id, self.email)

    @property
    def actor(self) -> Actor:
        if self.email is not None:
            return Actor("sso", None, self.address, self.email)
        if self.key_id is None:
            return Actor("admin", None, self.address)
        return Actor("key", self.key_id, self.address)

    def require_operator(self, right: str) -> None:
        if not self.operator:
            raise forbidden(
                f"{right} needs the operator's admin token (or the admin role); "
                f"an organisation's administrator may not"
            )

    def require_org(self, org: str | None) -> None:
        """The caller may administer ``org``."""
        if not self.operator and org != self.org:
            raise forbidden(
                f"this credential administers organisation {self.org!r} only, not {org!r}"
            )


def forbidden(message: str) -> PrismError:
    return PrismError(403, "forbidden", message)


def keys_or_none(request: web.Request) -> KeyAdmin | None:
    return request.app[GATEWAY].current.services.get(KEY_ADMIN)


def wall_now(request: web.Request) -> float:
    """Wall time as the key database measures it (it follows the generation's clock)."""
    keys = keys_or_none(request)
    return keys.now() if keys is not None else time.time()


def _bearer(request: web.Request) -> str | None:
    scheme, _, value = request.headers.get("Authorization", "").strip().partition(" ")
    return value.strip() or None if scheme.lower() == "bearer" else None


async def identify(request: web.Request, presented: str, keys: KeyAdmin | None) -> Identity:
    """The operator or the admin key ``presented`` is (401/403 otherwise)."""
    token = request.app[GATEWAY].config.admin_token
    if token and token_matches(presented, token):
        return Identity()
    caller = await keys.caller(presented) if keys is not None else None
    if caller is None:
        raise PrismError(
            401, "unauthenticated", "the admin token or API key is missing, invalid or expired"
        )
    if caller.org_disabled:
        raise org_disabled(caller.org)
    if ADMIN_SCOPE not in caller.scopes:
        raise forbidden(f"this API key lacks the scope {ADMIN_SCOPE!r} the admin API needs")
    return Identity(org=caller.org, key_id=caller.key_id)


def token_matches(presented: str, token: str) -> bool:
    """Whether ``presented`` is the admin token, in time that tells nothing of either.

    Both are hashed first: ``compare_digest`` is constant-time only for inputs of
    equal length, and the digests always are.
    """
    return hmac.compare_digest(
        hashlib.sha256(presented.encode("utf-8", "surrogateescape")).digest(),
        hashlib.sha256(token.encode("utf-8", "surrogateescape")).digest(),
    )


def org_disabled(org: str | None) -> PrismError:
    return PrismError(
        403,
        "org_disabled",
        f"organisation {org!r} is disabled: its administrators and keys are refused until "
        "the operator enables it again",
    )


async def authenticate(request: web.Request, keys: KeyAdmin | None) -> Credential:
    address = request.remote
    presented = _bearer(request)
    if presented is not None:
        who = await identify(request, presented, keys)
        return Credential(org=who.org, key_id=who.key_id, address=address)
    book = sessions_of(request)
    session = await book.find(request.cookies.get(COOKIE), wall_now(request))
    if session is None:
        raise PrismError(
            401,
            "unauthenticated",
            "send the admin token or an admin-scoped API key as 'Authorization: Bearer ...', "
            "or sign in at /prism/console",
        )
    if request.method not in _SAFE and not session.csrf_ok(request.headers.get(CSRF_HEADER)):
        raise PrismError(
            403,
            "csrf_failed",
            f"a write with the console's session needs its {CSRF_HEADER} header",
        )
    who = session.identity
    if who.key_id is not None and not await _key_still_admin(keys, who.key_id):
        await book.close(session.id)
        raise PrismError(
            401, "unauthenticated", "the key this session signed in with is no longer usable"
        )
    if who.org is not None and keys is not None:
        # An organisation's administrators (its keys, its single sign-on role) are refused
        # while it is disabled; the session lasts, so re-enabling it lets them back in.
        record = await keys.get_org(who.org)
        if record is not None and record.get("disabled"):
            raise org_disabled(who.org)
    return Credential(
        org=who.org, key_id=who.key_id, address=address, email=who.email, session=session
    )


async def _key_still_admin(keys: KeyAdmin | None, key_id: str) -> bool:
    """A session signed in with a key ends when the key is revoked, expires or loses ``admin``."""
    record = await keys.get_key(key_id) if keys is not None else None
    return bool(
        record is not None
        and not record.get("revoked")
        and not record.get("expired")
        and ADMIN_SCOPE in record.get("scopes", ())
    )
