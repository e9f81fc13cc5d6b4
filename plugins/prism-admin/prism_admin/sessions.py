"""Console sessions: a credential typed once (or a single sign-on) exchanged for a cookie.

The cookie (:data:`COOKIE`) holds only a random session id; the session
itself (who signed in, its CSRF token, its expiry) is kept by the gateway,
so signing out ends it at once.  The cookie is ``HttpOnly`` (no script
reads it), ``SameSite=Strict`` (no other site's page sends it) and
``Secure`` over TLS; every write made with it must also carry the session's
CSRF token in :data:`CSRF_HEADER`, which only a page of this origin can read
(``GET /prism/admin/session``).

Where sessions (and single sign-ons under way) are kept: in this process's
memory (:class:`SessionBook`: a restart signs everyone out, and another
worker or gateway does not know them), or, when the fleet shares state
(prism-redis provides ``shared-state``), in Redis (:class:`SharedSessions`),
where every worker and gateway of the fleet finds them and they expire on
their own.  :func:`sessions_of` picks, per request.
"""

from __future__ import annotations

import hmac
import secrets
from typing import Any, Protocol

import attrs
import orjson
from aiohttp import web

from prism_proxy import GATEWAY, SHARED_STATE, PrismError, SharedState

__all__ = [
    "COOKIE",
    "CSRF_HEADER",
    "SESSIONS",
    "Identity",
    "Pending",
    "Session",
    "SessionBook",
    "SessionStore",
    "SharedSessions",
    "clear_cookie",
    "sessions_of",
    "set_cookie",
]

COOKIE = "prism_console"
CSRF_HEADER = "X-Prism-CSRF"
#: Sessions kept at most (the oldest go first): a flood of sign-ins cannot grow memory.
MAX_SESSIONS = 10_000


@attrs.frozen
class Identity:
    """Who signed in: the operator (``org`` None), an admin key (``key_id``) or an SSO user
    (``email``) with the operator's role or one organisation's."""

    org: str | None = None
    key_id: str | None = None
    email: str | None = None

    @property
    def name(self) -> str:
        if self.email is not None:
            return f"sso:{self.email}"
        return f"key:{self.key_id}" if self.key_id is not None else "admin"


@attrs.frozen
class Session:
    id: str
    identity: Identity
    csrf: str
    expires_at: float

    def csrf_ok(self, presented: str | None) -> bool:
        return presented is not None and hmac.compare_digest(presented.encode(), self.csrf.encode())


@attrs.frozen
class Pending:
    """A sign-in the browser left for the provider: what its return must match."""

    nonce: str
    verifier: str
    redirect_uri: str
    expires_at: float


class SessionStore(Protocol):
    """Where sessions and single sign-ons under way are kept."""

    async def open(self, identity: Identity, now: float, lifetime_s: float) -> Session: ...

    async def find(self, session_id: str | None, now: float) -> Session | None: ...

    async def close(self, session_id: str | None) -> None: ...

    async def hold(self, state: str, pending: Pending, now: float) -> None: ...

    async def take(self, state: str | None, now: float) -> Pending | None:
        """The sign-in ``state`` names, once (None: unknown, used or too old)."""
        ...


def _new_session(identity: Identity, now: float, lifetime_s: float) -> Session:
    return Session(secrets.token_urlsafe(32), identity, secrets.token_urlsafe(24), now + lifetime_s)


@attrs.define
class SessionBook:
    """The sessions of this gateway process (kept on the app: reloads keep them)."""

    sessions: dict[str, Session] = attrs.field(factory=dict)
    #: Single sign-ons under way, by state.
    pending: dict[str, Pending] = attrs.field(factory=dict)

    async def hold(self, state: str, pending: Pending, now: float) -> None:
        for old in [k for k, p in self.pending.items() if now >= p.expires_at]:
            del self.pending[old]
        while len(self.pending) >= MAX_SESSIONS:
            self.pending.pop(next(iter(self.pending)))
        self.pending[state] = pending

    async def take(self, state: str | None, now: float) -> Pending | None:
        found = self.pending.pop(state, None) if state else None
        return found if found is not None and now < found.expires_at else None

    async def open(self, identity: Identity, now: float, lifetime_s: float) -> Session:
        self._expire(now)
        while len(self.sessions) >= MAX_SESSIONS:
            self.sessions.pop(next(iter(self.sessions)))
        session = _new_session(identity, now, lifetime_s)
        self.sessions[session.id] = session
        return session

    async def find(self, session_id: str | None, now: float) -> Session | None:
        if not session_id:
            return None
        session = self.sessions.get(session_id)
        if session is None:
            return None
        if now >= session.expires_at:
            del self.sessions[session_id]
            return None
        return session

    async def close(self, session_id: str | None) -> None:
        if session_id:
            self.sessions.pop(session_id, None)

    def _expire(self, now: float) -> None:
        for sid in [s.id for s in self.sessions.values() if now >= s.expires_at]:
            del self.sessions[sid]


@attrs.frozen
class SharedSessions:
    """Sessions in the fleet's shared state (Redis): any worker or gateway finds them.

    Each is one key holding JSON, with the session's lifetime as its TTL (the
    expiry in it is checked too, on the gateway's clock).  A Redis that does
    not answer is a 503 ``sessions_unavailable``: nobody is signed in or out
    by a guess.
    """

    shared: SharedState

    def _key(self, kind: str, name: str) -> str:
        return f"{self.shared.prefix}:console:{kind}:{name}"

    async def _run(self, work: Any) -> Any:
        try:
            with self.shared.guard("console-sessions"):
                return await work
        except Exception as exc:
            raise PrismError(
                503,
                "sessions_unavailable",
                "the console's sessions are kept in the shared state, which does not answer "
                f"({type(exc).__name__}); retry shortly",
                type="api_error",
            ) from None

    async def open(self, identity: Identity, now: float, lifetime_s: float) -> Session:
        session = _new_session(identity, now, lifetime_s)
        value = orjson.dumps(
            {**attrs.asdict(identity), "csrf": session.csrf, "expires_at": session.expires_at}
        )
        await self._run(
            self.shared.connect().set(
                self._key("session", session.id), value, px=max(1, int(lifetime_s * 1000))
            )
        )
        return session

    async def find(self, session_id: str | None, now: float) -> Session | None:
        if not session_id:
            return None
        found = await self._run(self.shared.connect().get(self._key("session", session_id)))
        if found is None:
            return None
        data = orjson.loads(found)
        # Redis's TTL counts on its clock; the lifetime is also counted on the gateway's.
        expires_at = float(data["expires_at"])
        if now >= expires_at:
            return None
        identity = Identity(data.get("org"), data.get("key_id"), data.get("email"))
        return Session(session_id, identity, str(data["csrf"]), expires_at)

    async def close(self, session_id: str | None) -> None:
        if session_id:
            await self._run(self.shared.connect().delete(self._key("session", session_id)))

    async def hold(self, state: str, pending: Pending, now: float) -> None:
        ttl_ms = max(1, int((pending.expires_at - now) * 1000))
        value = orjson.dumps(attrs.asdict(pending))
        await self._run(self.shared.connect().set(self._key("sso", state), value, px=ttl_ms))

    async def take(self, state: str | None, now: float) -> Pending | None:
        if not state:
            return None
        found = await self._run(self.shared.connect().getdel(self._key("sso", state)))
        if found is None:
            return None
        pending = Pending(**orjson.loads(found))
        return pending if now < pending.expires_at else None


SESSIONS = web.AppKey("prism_admin.sessions", SessionBook)


def sessions_of(request: web.Request) -> SessionStore:
    """The fleet's shared sessions when it shares state (prism-redis), else this process's."""
    shared = request.app[GATEWAY].current.services.get(SHARED_STATE)
    if shared is not None:
        return SharedSessions(shared)
    return request.app[SESSIONS]


def set_cookie(
    response: web.StreamResponse,
    request: web.Request,
    session: Session,
    lifetime_s: float,
    *,
    secure: bool,
) -> None:
    response.set_cookie(
        COOKIE,
        session.id,
        max_age=int(lifetime_s),
        path="/prism/",
        httponly=True,
        samesite="Strict",
        secure=secure or request.secure,
    )


def clear_cookie(response: web.StreamResponse) -> None:
    response.del_cookie(COOKIE, path="/prism/")
