"""Single sign-on: OpenID Connect's authorization-code flow with PKCE, for the console.

Authlib builds the request (state, nonce and the PKCE verifier from its
token generator, the S256 challenge, the authorization URL); joserfc,
Authlib's JOSE library, verifies the ID token: its signature by a key of
the issuer's JWKS, then ``iss`` (the configured issuer), ``aud`` (our client
id), ``exp`` and ``iat`` (on the key database's wall clock, a minute's
leeway), ``nonce`` (the one this browser's sign-in sent) and ``sub``.
Anything else refuses the sign-in and signs nobody in.

The discovery document is read once per generation; the JWKS at every
sign-in (sign-ins are rare, and a provider's rotated key is then picked up
at once).
"""

from __future__ import annotations

import base64
import hmac
import urllib.parse
from collections.abc import Mapping
from typing import Any

import aiohttp
import attrs

# Authlib ships no type information.
from authlib.common.security import generate_token  # type: ignore[import-untyped]
from authlib.oauth2.rfc6749.parameters import prepare_grant_uri  # type: ignore[import-untyped]
from authlib.oauth2.rfc7636 import create_s256_code_challenge  # type: ignore[import-untyped]
from joserfc import jwt
from joserfc.errors import JoseError
from joserfc.jwk import KeySet

from .sessions import Identity, Pending
from .settings import AdminSettings

__all__ = ["ALGORITHMS", "OidcClient", "Pending", "SsoError"]

#: Signature algorithms an ID token may use (never ``none``, never a shared secret).
ALGORITHMS = ("RS256", "RS384", "RS512", "PS256", "ES256", "ES384", "EdDSA")
#: How long a browser has to come back from the provider.
PENDING_S = 600.0
LEEWAY_S = 60
_TIMEOUT = aiohttp.ClientTimeout(total=10)


class SsoError(Exception):
    """A refused sign-in; the message says why (it never holds a token)."""

    def __init__(self, message: str, status: int = 401) -> None:
        super().__init__(message)
        self.status = status


@attrs.define(eq=False)
class OidcClient:
    """This generation's OpenID Connect client (``[prism:admin] oidc_issuer``)."""

    settings: AdminSettings
    client_secret: str | None
    _metadata: dict[str, Any] | None = None

    @property
    def issuer(self) -> str:
        assert self.settings.oidc_issuer is not None
        return self.settings.oidc_issuer.rstrip("/")

    async def metadata(self, http: aiohttp.ClientSession) -> dict[str, Any]:
        if self._metadata is None:
            url = self.issuer + "/.well-known/openid-configuration"
            found = await _get_json(http, url, "the provider's discovery document")
            if str(found.get("issuer", "")).rstrip("/") != self.issuer:
                raise SsoError("the provider's discovery document names another issuer", status=502)
            for name in ("authorization_endpoint", "token_endpoint", "jwks_uri"):
                if not isinstance(found.get(name), str):
                    raise SsoError(f"the provider's discovery document lacks {name}", status=502)
            self._metadata = found
        return self._metadata

    async def start(
        self, http: aiohttp.ClientSession, redirect_uri: str, now: float
    ) -> tuple[str, str, Pending]:
        """(the provider's URL to send the browser to, the state, what to keep for its return)."""
        meta = await self.metadata(http)
        state, nonce, verifier = generate_token(32), generate_token(32), generate_token(64)
        url = prepare_grant_uri(
            meta["authorization_endpoint"],
            self.settings.client_id,
            "code",
            redirect_uri=redirect_uri,
            scope="openid email profile",
            state=state,
            nonce=nonce,
            code_challenge=create_s256_code_challenge(verifier),
            code_challenge_method="S256",
        )
        return url, state, Pending(nonce, verifier, redirect_uri, now + PENDING_S)

    async def finish(
        self, http: aiohttp.ClientSession, code: str, pending: Pending, now: float
    ) -> Mapping[str, Any]:
        """Exchange ``code`` (with the PKCE verifier) and verify the ID token: its claims."""
        meta = await self.metadata(http)
        form = {
            "grant_type": "authorization_code",
            "code": code,
            "redirect_uri": pending.redirect_uri,
            "client_id": self.settings.client_id or "",
            "code_verifier": pending.verifier,
        }
        headers = {}
        if self.client_secret is not None:
            methods = meta.get("token_endpoint_auth_methods_supported") or ["client_secret_basic"]
            if "client_secret_basic" in methods:
                headers["Authorization"] = _basic(self.settings.client_id or "", self.client_secret)
            else:
                form["client_secret"] = self.client_secret
        try:
            async with http.post(meta["token_endpoint"], data=form, headers=headers) as response:
                body = await response.json(content_type=None)
                status = response.status
        except (aiohttp.ClientError, TimeoutError, ValueError):
            raise SsoError("the provider's token endpoint did not answer", status=502) from None
        if status != 200 or not isinstance(body, dict) or "id_token" not in body:
            error = body.get("error") if isinstance(body, dict) else None
            raise SsoError(f"the provider refused the code ({error or status})")
        keys = await _get_json(http, meta["jwks_uri"], "the provider's JWKS")
        return self.verify(str(body["id_token"]), keys, pending.nonce, now)

    def verify(
        self, id_token: str, jwks: Mapping[str, Any], nonce: str, now: float
    ) -> Mapping[str, Any]:
        try:
            keyset = KeySet.import_key_set(jwks)  # type: ignore[arg-type]
            token = jwt.decode(id_token, keyset, algorithms=list(ALGORITHMS))
        except (JoseError, ValueError, TypeError):
            raise SsoError("the ID token's signature is not the issuer's") from None
        registry = jwt.JWTClaimsRegistry(
            now=int(now),
            leeway=LEEWAY_S,
            iss={"essential": True, "value": self.issuer},
            aud={"essential": True, "value": self.settings.client_id or ""},
            exp={"essential": True},
            iat={"essential": True},
            sub={"essential": True},
            nonce={"essential": True, "value": nonce},
        )
        claims = token.claims
        try:
            registry.validate(claims)
        except JoseError as exc:
            raise SsoError(f"the ID token is refused: {exc.description or exc.error}") from None
        audience = claims.get("aud")
        if isinstance(audience, list) and len(audience) > 1:
            # Several audiences: OpenID Connect Core 3.1.3.7 wants azp to be us.
            if claims.get("azp") != self.settings.client_id:
                raise SsoError("the ID token is refused: it was issued to another party")
        if not hmac.compare_digest(str(claims.get("nonce")), nonce):
            raise SsoError("the ID token is refused: nonce")
        return claims

    def identity(self, claims: Mapping[str, Any]) -> Identity:
        """The role ``roles`` gives this person (first match); 403 when none does."""
        email = claims.get("email")
        if not isinstance(email, str) or "@" not in email:
            raise SsoError("the ID token carries no email address", status=403)
        if claims.get("email_verified") is False:
            raise SsoError(f"{email}: the provider has not verified this address", status=403)
        email = email.strip().lower()
        raw_groups = claims.get("groups")
        groups = (
            frozenset(g for g in raw_groups if isinstance(g, str))
            if isinstance(raw_groups, list)
            else frozenset()
        )
        for rule in self.settings.role_rules:
            if rule.matches(email, groups):
                return Identity(org=rule.org, email=email)
        raise SsoError(f"{email} has no role here ([prism:admin] roles)", status=403)


async def _get_json(http: aiohttp.ClientSession, url: str, what: str) -> dict[str, Any]:
    try:
        async with http.get(url) as response:
            if response.status != 200:
                raise SsoError(f"{what} answered {response.status}", status=502)
            found = await response.json(content_type=None)
    except (aiohttp.ClientError, TimeoutError, ValueError):
        raise SsoError(f"{what} could not be read", status=502) from None
    if not isinstance(found, dict):
        raise SsoError(f"{what} is not a JSON object", status=502)
    return found


def _basic(client_id: str, secret: str) -> str:
    # RFC 6749 2.3.1: both are form-encoded before they are joined.
    pair = f"{urllib.parse.quote_plus(client_id)}:{urllib.parse.quote_plus(secret)}"
    return "Basic " + base64.b64encode(pair.encode()).decode()


def client_session() -> aiohttp.ClientSession:
    return aiohttp.ClientSession(timeout=_TIMEOUT)
