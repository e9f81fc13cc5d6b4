"""A minimal OpenID provider for the tests, on aiohttp and joserfc (Authlib's JOSE library).

It serves the discovery document, ``/authorize`` (which signs in whoever the
test names at once and sends the browser back with a code), ``/token``
(which checks the client and the PKCE verifier against the challenge, then
answers an RS256 ID token) and ``/jwks``.  ``mint`` lets a test make the next
ID token wrong on purpose: another issuer, another audience, expired, or
signed by a key that is not in the JWKS.
"""

from __future__ import annotations

import base64
import hashlib
import secrets
import time
from typing import Any

import attrs
from aiohttp import web
from joserfc import jwt
from joserfc.jwk import RSAKey


@attrs.define
class Provider:
    client_id: str
    client_secret: str
    url: str = ""
    email: str = "ana@example.com"
    groups: tuple[str, ...] = ()
    #: Claims the next ID tokens get instead (iss, aud, exp ...).
    mint: dict[str, Any] = attrs.field(factory=dict)
    #: Sign with a key not published in the JWKS.
    foreign_key: bool = False
    key: RSAKey = attrs.field(factory=lambda: RSAKey.generate_key(2048, {"kid": "k1"}))
    other: RSAKey = attrs.field(factory=lambda: RSAKey.generate_key(2048, {"kid": "k1"}))
    codes: dict[str, dict[str, Any]] = attrs.field(factory=dict)
    tokens_issued: int = 0

    def app(self) -> web.Application:
        app = web.Application()
        app.router.add_get("/.well-known/openid-configuration", self.discovery)
        app.router.add_get("/authorize", self.authorize)
        app.router.add_post("/token", self.token)
        app.router.add_get("/jwks", self.jwks)
        return app

    async def discovery(self, request: web.Request) -> web.Response:
        return web.json_response(
            {
                "issuer": self.url,
                "authorization_endpoint": self.url + "/authorize",
                "token_endpoint": self.url + "/token",
                "jwks_uri": self.url + "/jwks",
                "response_types_supported": ["code"],
                "code_challenge_methods_supported": ["S256"],
                "id_token_signing_alg_values_supported": ["RS256"],
                "token_endpoint_auth_methods_supported": ["client_secret_basic"],
            }
        )

    async def authorize(self, request: web.Request) -> web.Response:
        q = request.query
        if q.get("client_id") != self.client_id or q.get("code_challenge_method") != "S256":
            return web.Response(status=400, text="bad client or no PKCE")
        assert "openid" in q.get("scope", "").split()
        code = secrets.token_urlsafe(16)
        self.codes[code] = {
            "challenge": q["code_challenge"],
            "nonce": q["nonce"],
            "redirect_uri": q["redirect_uri"],
        }
        return web.Response(
            status=302, headers={"Location": f"{q['redirect_uri']}?code={code}&state={q['state']}"}
        )

    async def token(self, request: web.Request) -> web.Response:
        form = await request.post()
        expected = base64.b64encode(f"{self.client_id}:{self.client_secret}".encode()).decode()
        if request.headers.get("Authorization") != f"Basic {expected}":
            return web.json_response({"error": "invalid_client"}, status=401)
        grant = self.codes.pop(str(form.get("code")), None)
        if grant is None or form.get("redirect_uri") != grant["redirect_uri"]:
            return web.json_response({"error": "invalid_grant"}, status=400)
        verifier = str(form.get("code_verifier", ""))
        digest = hashlib.sha256(verifier.encode()).digest()
        if base64.urlsafe_b64encode(digest).rstrip(b"=").decode() != grant["challenge"]:
            return web.json_response({"error": "invalid_grant", "pkce": "mismatch"}, status=400)
        now = int(time.time())
        claims = {
            "iss": self.url,
            "sub": "user-1",
            "aud": self.client_id,
            "exp": now + 300,
            "iat": now,
            "nonce": grant["nonce"],
            "email": self.email,
            "email_verified": True,
            "groups": list(self.groups),
            **self.mint,
        }
        key = self.other if self.foreign_key else self.key
        id_token = jwt.encode({"alg": "RS256", "kid": "k1"}, claims, key)
        self.tokens_issued += 1
        return web.json_response(
            {"access_token": "at", "token_type": "Bearer", "id_token": id_token}
        )

    async def jwks(self, request: web.Request) -> web.Response:
        return web.json_response({"keys": [self.key.as_dict(private=False)]})
