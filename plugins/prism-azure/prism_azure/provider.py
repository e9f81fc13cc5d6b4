"""An Azure OpenAI resource: deployments reached by key or by Microsoft Entra ID token."""

from __future__ import annotations

import os
import re
from collections.abc import Mapping
from typing import Any
from urllib.parse import quote, urlencode

import orjson

from prism_proxy import (
    Binding,
    Call,
    Endpoint,
    HttpProvider,
    ProviderSpec,
    UpstreamResponse,
    check_options,
)

from .entra import EntraTokens, TokenSource

__all__ = ["DEFAULT_API_VERSION", "KIND", "AzureOpenAIProvider"]

KIND = "azure-openai"
#: The newest generally available data-plane API version when this was written:
#: chat completions with ``stream_options.include_usage``, tools, embeddings.
DEFAULT_API_VERSION = "2024-10-21"
_PATHS = {Endpoint.CHAT: "chat/completions", Endpoint.EMBEDDINGS: "embeddings"}
_OPTIONS = frozenset(
    {
        "base_url",
        "api_version",
        "api_key_env",
        "auth",
        "credential",
        "tenant_id",
        "client_id",
        "client_secret_env",
        "authority",
        "ca_file",
        "headers",
    }
)
_CREDENTIALS = ("default", "client_secret", "managed_identity", "workload_identity")
_API_VERSION = re.compile(r"[0-9A-Za-z.\-]{1,40}")


class AzureOpenAIProvider(HttpProvider):
    """Options (``[providers.<name>]`` with ``kind = "azure-openai"``): see the README.

    A chain line's ``model`` is the deployment's name.
    """

    wire = "openai"

    def __init__(self, spec: ProviderSpec) -> None:
        super().__init__(spec)
        check_options(spec, KIND, _OPTIONS)
        base_url = spec.options.get("base_url")
        if not isinstance(base_url, str) or not base_url.startswith(("http://", "https://")):
            raise spec.error(
                "base_url",
                f"expected the resource endpoint, https://NAME.openai.azure.com, got {base_url!r}",
            )
        # The portal shows the endpoint with and without /openai: both work.
        self.base_url = base_url.rstrip("/").removesuffix("/openai")
        api_version = spec.options.get("api_version", DEFAULT_API_VERSION)
        if not isinstance(api_version, str) or not _API_VERSION.fullmatch(api_version):
            raise spec.error(
                "api_version", f'expected an API version such as "2024-10-21", got {api_version!r}'
            )
        self.query = "?" + urlencode({"api-version": api_version})
        self.headers: Mapping[str, str] = {**self.base_headers, **self.option_table("headers")}
        self.tokens: EntraTokens | None = None
        auth = spec.options.get("auth", "api-key")
        if auth == "api-key":
            self._key_auth(spec)
        elif auth == "entra":
            if "api_key_env" in spec.options:
                raise spec.error("api_key_env", 'not used with auth = "entra" (tokens replace it)')
            self._credential_options = _credential_options(spec)
        else:
            raise spec.error("auth", f"expected 'api-key' or 'entra', got {auth!r}")
        self.auth = auth

    def _key_auth(self, spec: ProviderSpec) -> None:
        if "api_key_env" not in spec.options:
            raise spec.error(
                "api_key_env",
                'required with auth = "api-key": the environment variable holding the key',
            )
        entra_only = ("credential", "tenant_id", "client_id", "client_secret_env", "authority")
        for key in (*entra_only, "ca_file"):
            if key in spec.options:
                raise spec.error(key, 'only used with auth = "entra"')
        secret = self.secret_from_env()
        if secret:
            self.headers = {**self.headers, "api-key": secret}

    async def start(self) -> None:
        await super().start()
        if self.auth == "entra" and self.tokens is None:
            # Made here, inside the running loop: the credential opens its own session.
            self.tokens = EntraTokens(make_credential(self._credential_options))

    async def close(self) -> None:
        tokens, self.tokens = self.tokens, None
        if tokens is not None:
            await tokens.close()
        await super().close()

    def url(self, endpoint: Endpoint, binding: Binding) -> str:
        deployment = quote(binding.model, safe="")
        return f"{self.base_url}/openai/deployments/{deployment}/{_PATHS[endpoint]}{self.query}"

    async def send(
        self, call: Call, binding: Binding, endpoint: Endpoint, body: dict[str, Any]
    ) -> UpstreamResponse:
        # Azure ignores it (the deployment decides); its own SDK sends it too.
        body["model"] = binding.model
        if body.get("stream"):
            # Always ask for usage so the serving attempt can be billed; the
            # relay forwards the usage chunk only to callers who asked for it.
            body["stream_options"] = {**(body.get("stream_options") or {}), "include_usage": True}
        headers = self.headers
        if self.tokens is not None:
            headers = {**headers, "Authorization": await self.tokens.header()}
        return await self.post(self.url(endpoint, binding), headers, orjson.dumps(body))


def _credential_options(spec: ProviderSpec) -> dict[str, Any]:
    """The Entra options, checked at start-up (the credential is made in ``start``)."""
    options = spec.options
    credential = options.get("credential", "default")
    if credential not in _CREDENTIALS:
        raise spec.error(
            "credential", f"expected one of {', '.join(_CREDENTIALS)}, got {credential!r}"
        )
    out: dict[str, Any] = {"credential": credential}
    for key in ("tenant_id", "client_id", "authority", "ca_file", "client_secret_env"):
        value = options.get(key)
        if value is None:
            continue
        if not isinstance(value, str) or not value:
            raise spec.error(key, "expected a non-empty string")
        out[key] = value
    authority = out.get("authority")
    if authority is not None and not authority.startswith("https://"):
        raise spec.error("authority", f"expected an https:// URL, got {authority!r}")
    if credential == "client_secret":
        for key in ("tenant_id", "client_id", "client_secret_env"):
            if key not in out:
                raise spec.error(key, 'required with credential = "client_secret"')
        # Read once, at start-up; never logged, never in an error.
        secret = os.environ.get(out["client_secret_env"], "")
        if not secret:
            raise spec.error(
                "client_secret_env", f"environment variable {out['client_secret_env']} is not set"
            )
        out["client_secret"] = secret
    elif "client_secret_env" in out:
        raise spec.error("client_secret_env", 'only used with credential = "client_secret"')
    return out


def make_credential(options: Mapping[str, Any]) -> TokenSource:
    """The ``azure.identity.aio`` credential the options name."""
    from azure.identity import aio as identity

    common: dict[str, Any] = {}
    if "authority" in options:
        common["authority"] = options["authority"]
    if "ca_file" in options:
        # Trust for the authority's TLS (a private authority, an inspecting proxy).
        common["connection_verify"] = options["ca_file"]
    kind = options["credential"]
    credential: Any
    if kind == "client_secret":
        credential = identity.ClientSecretCredential(
            options["tenant_id"], options["client_id"], options["client_secret"], **common
        )
    elif kind == "managed_identity":
        credential = identity.ManagedIdentityCredential(client_id=options.get("client_id"))
    elif kind == "workload_identity":
        extra = {k: options[k] for k in ("tenant_id", "client_id") if k in options}
        credential = identity.WorkloadIdentityCredential(**extra, **common)
    else:
        if "client_id" in options:
            common["managed_identity_client_id"] = options["client_id"]
        if "tenant_id" in options:
            common["additionally_allowed_tenants"] = [options["tenant_id"]]
        credential = identity.DefaultAzureCredential(**common)
    return credential  # type: ignore[no-any-return]
