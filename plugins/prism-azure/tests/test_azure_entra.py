"""Microsoft Entra ID tokens: azure-identity's ClientSecretCredential against a local authority.

azure-identity accepts only an https authority, so the test's token endpoint
serves TLS with a certificate made here for 127.0.0.1, and the provider's
``ca_file`` option makes the credential trust it (``connection_verify``).
The endpoint answers OAuth 2.0's client-credentials grant as Entra's v2.0
token endpoint does.
"""

from __future__ import annotations

import datetime
import ipaddress
import ssl
import time
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import attrs
import openai
import pytest
from aiohttp import web
from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import NameOID

from prism_proxy.testing import eventually

from .azure_support import MESSAGES, catalog

SECRET = "entra-client-secret-value"
LIFETIME_S = 3600


def self_signed(directory: Path) -> tuple[Path, Path]:
    """A certificate for 127.0.0.1 (its own CA) and its key, as PEM files."""
    key = ec.generate_private_key(ec.SECP256R1())
    name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "prism-test-authority")])
    now = datetime.datetime.now(datetime.UTC)
    cert = (
        x509.CertificateBuilder()
        .subject_name(name)
        .issuer_name(name)
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - datetime.timedelta(minutes=5))
        .not_valid_after(now + datetime.timedelta(days=1))
        .add_extension(
            x509.SubjectAlternativeName([x509.IPAddress(ipaddress.ip_address("127.0.0.1"))]),
            critical=False,
        )
        .add_extension(x509.BasicConstraints(ca=True, path_length=None), critical=True)
        .sign(key, hashes.SHA256())
    )
    cert_path, key_path = directory / "authority.pem", directory / "authority.key"
    cert_path.write_bytes(cert.public_bytes(serialization.Encoding.PEM))
    key_path.write_bytes(
        key.private_bytes(
            serialization.Encoding.PEM,
            serialization.PrivateFormat.PKCS8,
            serialization.NoEncryption(),
        )
    )
    return cert_path, key_path


@attrs.define
class Authority:
    """A local Entra token endpoint: what it was asked, and the tokens it gave."""

    url: str
    ca_file: Path
    asked: list[dict[str, str]] = attrs.field(factory=list)

    async def token(self, request: web.Request) -> web.Response:
        form = dict(await request.post())
        self.asked.append({"tenant": request.match_info["tenant"], **form})
        if form.get("grant_type") != "client_credentials" or form.get("client_secret") != SECRET:
            return web.json_response(
                {"error": "invalid_client", "error_description": "AADSTS7000215: bad secret"},
                status=401,
            )
        return web.json_response(
            {
                "token_type": "Bearer",
                "expires_in": LIFETIME_S,
                "ext_expires_in": LIFETIME_S,
                "access_token": f"entra-token-{len(self.asked)}",
            }
        )


@pytest.fixture
async def authority(tmp_path: Path) -> AsyncIterator[Authority]:
    cert, key = self_signed(tmp_path)
    context = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
    context.load_cert_chain(cert, key)
    app = web.Application()
    runner = web.AppRunner(app, access_log=None)
    site_authority = Authority(url="", ca_file=cert)
    app.router.add_post("/{tenant}/oauth2/v2.0/token", site_authority.token)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0, ssl_context=context)
    await site.start()
    site_authority.url = f"https://127.0.0.1:{runner.addresses[0][1]}"
    yield site_authority
    await runner.cleanup()


def entra_catalog(fake: Any, authority: Authority, scenario: str, **model: Any) -> dict[str, Any]:
    provider = {
        "kind": "azure-openai",
        "base_url": fake.base_url(scenario),
        "auth": "entra",
        "credential": "client_secret",
        "tenant_id": "tenant-1",
        "client_id": "client-1",
        "client_secret_env": "TEST_ENTRA_SECRET",
        "authority": authority.url,
        "ca_file": str(authority.ca_file),
    }
    return catalog({"az": provider}, [("az", "dep")], **model)


async def test_one_token_serves_many_calls_and_is_refreshed_before_expiry(
    prism_fake, prism_gateway, authority, monkeypatch, caplog
):
    monkeypatch.setenv("TEST_ENTRA_SECRET", SECRET)
    gw = await prism_gateway(entra_catalog(prism_fake, authority, "entra"))
    client = gw.openai()
    for _ in range(3):
        await client.chat.completions.create(model="m", messages=MESSAGES)
    [asked] = authority.asked  # fetched once, not per call
    assert asked["tenant"] == "tenant-1" and asked["client_id"] == "client-1"
    assert asked["scope"] == "https://cognitiveservices.azure.com/.default"
    seen = prism_fake.requests("entra")
    assert [r.headers["Authorization"] for r in seen] == ["Bearer entra-token-1"] * 3
    assert all("api-key" not in r.headers for r in seen)

    # The wall clock moves to 200 s before the token expires: past the refresh
    # point.  The call goes on with the old token while one fetch replaces it.
    real = time.time
    monkeypatch.setattr(time, "time", lambda: real() + LIFETIME_S - 200)
    await client.chat.completions.create(model="m", messages=MESSAGES)
    assert prism_fake.requests("entra")[-1].headers["Authorization"] == "Bearer entra-token-1"
    await eventually(lambda: len(authority.asked) == 2, what="a background refresh")
    await client.chat.completions.create(model="m", messages=MESSAGES)
    await client.chat.completions.create(model="m", messages=MESSAGES)
    assert [r.headers["Authorization"] for r in prism_fake.requests("entra")[-2:]] == [
        "Bearer entra-token-2"
    ] * 2
    assert len(authority.asked) == 2
    assert SECRET not in caplog.text


async def test_a_credential_entra_refuses_fails_the_attempt_without_the_secret(
    prism_fake, prism_gateway, authority, monkeypatch, caplog
):
    monkeypatch.setenv("TEST_ENTRA_SECRET", "not-the-secret")
    gw = await prism_gateway(entra_catalog(prism_fake, authority, "refused", retries=0))
    with pytest.raises(openai.APIStatusError) as err:
        await gw.openai().chat.completions.create(model="m", messages=MESSAGES)
    body = err.value.body
    assert body["code"] == "upstream_unavailable"
    assert body["attempts"] == [
        {
            "binding": "az/dep",
            "outcome": "transient",
            "status": None,
            "ms": body["attempts"][0]["ms"],
            "reason": "connection failed",
        }
    ]
    assert prism_fake.hits("refused") == 0  # no request goes out without a token
    assert "not-the-secret" not in caplog.text and "not-the-secret" not in str(body)
