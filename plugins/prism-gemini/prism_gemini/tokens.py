"""OAuth bearer tokens for Vertex AI, through google-auth, cached until shortly before expiry.

google-auth's refresh is blocking (it signs a JWT and posts it to the token
endpoint, or asks the metadata server): it runs in a worker thread, once for
all the calls that need a token at that moment.
"""

from __future__ import annotations

import asyncio
import datetime
from collections.abc import Callable
from typing import Any

import google.auth
import google.auth.exceptions
import google.auth.transport.requests
import google.oauth2.service_account
import requests

__all__ = ["SCOPES", "CredentialsMissing", "TokenRefused", "TokenSource"]

SCOPES = ("https://www.googleapis.com/auth/cloud-platform",)
#: A token is replaced this long before it expires (google-auth's own margin is 3m45s).
REFRESH_MARGIN_S = 300.0


class TokenRefused(Exception):
    """The token endpoint refused the credentials (a bad key, a disabled account)."""


class CredentialsMissing(Exception):
    """No usable credentials: the key file cannot be read or parsed, or none in the environment."""


class TokenUnreachable(OSError):
    """The token endpoint could not be reached: a connection failure, as the core counts them."""


def _load(credentials_file: str | None) -> Any:
    if credentials_file is not None:
        load = google.oauth2.service_account.Credentials.from_service_account_file
        return load(credentials_file, scopes=list(SCOPES))  # type: ignore[no-untyped-call]
    credentials, _project = google.auth.default(scopes=list(SCOPES))
    return credentials


class TokenSource:
    """One set of credentials' current token, and the one refresh in progress."""

    def __init__(
        self, credentials: Any, now: Callable[[], float], proxy: str | None = None
    ) -> None:
        self.credentials = credentials
        self.now = now
        self.session = requests.Session()
        # The line's ``proxy`` option reaches the token endpoint too (unset: the environment's).
        if proxy is not None:
            if proxy.strip().lower() in ("", "none"):
                self.session.trust_env = False
            else:
                self.session.proxies = {"http": proxy, "https": proxy}
        self.transport = google.auth.transport.requests.Request(self.session)
        self._token: str | None = None
        self._renew_at = float("-inf")
        self._refreshing: asyncio.Future[str] | None = None
        #: How many times a token was fetched (for tests and the logs).
        self.refreshes = 0

    @classmethod
    async def load(
        cls, credentials_file: str | None, now: Callable[[], float], proxy: str | None = None
    ) -> TokenSource:
        """Read the credentials (a file, or the environment's) off the event loop.

        Raises ``CredentialsMissing`` naming what is wrong (never the key's content).
        """
        try:
            credentials = await asyncio.to_thread(_load, credentials_file)
        except OSError as exc:
            raise CredentialsMissing(
                f"cannot read it: {exc.strerror or type(exc).__name__}"
            ) from None
        except (ValueError, KeyError, google.auth.exceptions.DefaultCredentialsError) as exc:
            what = "not a service account key" if credentials_file else str(exc)[:200]
            raise CredentialsMissing(what) from None
        return cls(credentials, now, proxy)

    def close(self) -> None:
        self.session.close()

    async def token(self) -> str:
        if self._token is not None and self.now() < self._renew_at:
            return self._token
        refreshing = self._refreshing
        if refreshing is None:
            refreshing = self._refreshing = asyncio.ensure_future(self._refresh())
        # Shielded: a caller that gives up must not cancel the others' refresh.
        return await asyncio.shield(refreshing)

    async def _refresh(self) -> str:
        try:
            await asyncio.to_thread(self._refresh_blocking)
        finally:
            self._refreshing = None
        token = self.credentials.token
        assert isinstance(token, str)
        return token

    def _refresh_blocking(self) -> None:
        started = self.now()
        try:
            self.credentials.refresh(self.transport)
        except google.auth.exceptions.RefreshError as exc:
            # Its message quotes the endpoint's answer (an error code), never the key.
            raise TokenRefused(
                f"the token endpoint refused the credentials: {exc.args[0]}"
            ) from None
        except google.auth.exceptions.TransportError as exc:
            raise TokenUnreachable(f"token endpoint unreachable: {type(exc).__name__}") from None
        expiry = self.credentials.expiry
        lifetime = 3600.0
        if isinstance(expiry, datetime.datetime):
            now = datetime.datetime.now(datetime.UTC).replace(tzinfo=None)
            lifetime = (expiry.replace(tzinfo=None) - now).total_seconds()
        self.refreshes += 1
        self._token = self.credentials.token
        self._renew_at = started + lifetime - REFRESH_MARGIN_S
