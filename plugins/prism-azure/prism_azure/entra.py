"""Microsoft Entra ID bearer tokens for one provider: fetched once, reused, refreshed early.

A token lives about an hour.  Asking the credential on every call would put
a lock, a cache lookup (and, with some credentials, a subprocess or an HTTP
round trip) on the hot path, so the provider holds the token itself: calls
use it as it is until its refresh point (the credential's ``refresh_on``, else
:data:`REFRESH_MARGIN_S` before it expires), then one background fetch
replaces it while calls go on with the old one.  Only a token missing or
about to expire is waited for, and then by every call at once on one fetch.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable
from typing import Any, Protocol

import aiohttp
import attrs

__all__ = ["ENTRA_SCOPE", "EntraTokenError", "EntraTokens", "TokenSource"]

log = logging.getLogger("prism.azure")

#: The scope of Azure OpenAI (Azure AI services) data-plane tokens.
ENTRA_SCOPE = "https://cognitiveservices.azure.com/.default"
#: How long before expiry a token is replaced, when the credential names no refresh point.
REFRESH_MARGIN_S = 300.0
#: A token this close to expiry is not used: a request might arrive after it expired.
EXPIRY_SLACK_S = 30.0
#: After a failed background refresh, how long calls go on with the old token before
#: the next try (an Entra outage must not be asked once per call).
RETRY_AFTER_FAILURE_S = 10.0


class TokenSource(Protocol):
    """What an ``azure.identity.aio`` credential offers (``AsyncSupportsTokenInfo``)."""

    async def get_token_info(self, *scopes: str, options: Any = None) -> Any: ...

    async def close(self) -> None: ...


class EntraTokenError(aiohttp.ClientConnectionError):
    """No token could be had: the attempt fails like an unreachable upstream.

    A connection error by the provider contract (``Provider.send``): the
    attempt is retried and failed over like one, and its record names this
    class.  The message names the credential's error class only: Entra's
    messages may quote the client id or tenant.
    """


@attrs.frozen
class _Token:
    header: str
    expires_on: float
    refresh_at: float


class EntraTokens:
    """``Authorization`` header values for ``scope`` from ``credential``.

    ``now`` is the wall clock tokens' expiry times are on (seconds since the epoch).
    """

    def __init__(
        self,
        credential: TokenSource,
        scope: str = ENTRA_SCOPE,
        *,
        now: Callable[[], float] | None = None,
    ) -> None:
        self.credential = credential
        self.scope = scope
        # Looked up at each call rather than bound now: a test that moves the
        # wall clock moves it for the credential and for us alike.
        self._now = now or (lambda: time.time())
        self._token: _Token | None = None
        self._fetch: asyncio.Task[_Token] | None = None
        self._quiet_until = 0.0
        #: Tokens fetched so far (for /prism/stats-style reporting and tests).
        self.fetched = 0

    async def header(self) -> str:
        """The header value to send now, fetching or refreshing only when due."""
        token = self._token
        now = self._now()
        if token is not None:
            if now < token.refresh_at:
                return token.header
            if now < token.expires_on - EXPIRY_SLACK_S:
                if self._fetch is None and now >= self._quiet_until:
                    self._start_fetch().add_done_callback(self._background_done)
                return token.header
        # No token, or one about to expire: every call waits on one fetch.
        fetch = self._fetch or self._start_fetch()
        try:
            # Shielded: a caller that leaves must not cancel the others' fetch.
            token = await asyncio.shield(fetch)
        except asyncio.CancelledError:
            raise
        except Exception as exc:
            raise EntraTokenError(f"no Microsoft Entra ID token ({type(exc).__name__})") from None
        return token.header

    def _start_fetch(self) -> asyncio.Task[_Token]:
        task = asyncio.get_running_loop().create_task(self._fetch_token())
        task.add_done_callback(_retrieve)
        self._fetch = task
        return task

    async def _fetch_token(self) -> _Token:
        try:
            info = await self.credential.get_token_info(self.scope)
            now = self._now()
            expires_on = float(info.expires_on)
            refresh_on = getattr(info, "refresh_on", None)
            lifetime = max(expires_on - now, 0.0)
            early = expires_on - min(REFRESH_MARGIN_S, lifetime / 2)
            refresh_at = min(float(refresh_on), early) if refresh_on else early
            token = _Token(f"Bearer {info.token}", expires_on, refresh_at)
            self._token = token
            self.fetched += 1
            return token
        finally:
            self._fetch = None

    def _background_done(self, task: asyncio.Task[_Token]) -> None:
        if task.cancelled():
            return
        exc = task.exception()
        if exc is not None:
            self._quiet_until = self._now() + RETRY_AFTER_FAILURE_S
            log.warning(
                "Entra token refresh failed (%s); the current token is used until it expires",
                type(exc).__name__,
            )

    async def close(self) -> None:
        """Stop any fetch and close the credential (its HTTP session)."""
        fetch, self._fetch = self._fetch, None
        if fetch is not None:
            fetch.cancel()
            await asyncio.gather(fetch, return_exceptions=True)
        await self.credential.close()


def _retrieve(task: asyncio.Task[_Token]) -> None:
    # Whoever awaited it saw the failure; nobody may have (every waiter left).
    if not task.cancelled():
        task.exception()
