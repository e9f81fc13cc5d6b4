"""An OpenAI-compatible upstream: OpenAI, Azure OpenAI, vLLM, Ollama, llama.cpp, the fake."""

from __future__ import annotations

from collections.abc import Mapping
from types import MappingProxyType
from typing import Any
from urllib.parse import urlencode

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

_OPTIONS = frozenset(
    {"base_url", "api_key_env", "auth", "headers", "query", "deployments", "responses"}
)
_PATHS = {
    Endpoint.CHAT: "chat/completions",
    Endpoint.EMBEDDINGS: "embeddings",
    Endpoint.RESPONSES: "responses",
}
#: The API root whose upstream speaks the Responses API for sure: native there by default.
_OPENAI_API = "https://api.openai.com/v1"
_NATIVE_RESPONSES = MappingProxyType({Endpoint.RESPONSES: "responses"})


class OpenAIProvider(HttpProvider):
    """Options (``[providers.<name>]`` with ``kind = "openai"``):

    - ``base_url`` (required): the API root ending in ``/v1`` (or the Azure resource URL);
    - ``api_key_env``: the environment variable holding the key (read at start-up);
    - ``auth``: ``"bearer"`` (default, ``Authorization: Bearer``) or ``"api-key"`` (Azure);
    - ``headers``: a table of extra static headers;
    - ``query``: a table of extra query parameters (e.g. ``api-version`` for Azure);
    - ``deployments``: true for Azure-style URLs ``{base_url}/deployments/{model}/...``;
    - ``responses``: ``"native"`` to send Responses API calls to ``{base_url}/responses``
      as they are (reasoning items included), ``"translate"`` to send them as chat
      completions; default native for OpenAI's own API root, translated for any other
      (most OpenAI-compatible servers have no Responses API);
    - ``max_connections``, ``connect_timeout_ms``: the connection pool;
    - ``proxy``: the egress proxy's URL, or ``"none"`` (default: the environment's).
    """

    wire = "openai"

    def __init__(self, spec: ProviderSpec) -> None:
        super().__init__(spec)
        check_options(spec, "openai", _OPTIONS)
        base_url = spec.options.get("base_url")
        if not isinstance(base_url, str) or not base_url.startswith(("http://", "https://")):
            raise spec.error("base_url", f"expected an http(s) URL, got {base_url!r}")
        self.base_url = base_url.rstrip("/")
        self.deployments = spec.options.get("deployments", False)
        if not isinstance(self.deployments, bool):
            raise spec.error("deployments", "expected true or false")
        query = self.option_table("query")
        self.query = ("?" + urlencode(query)) if query else ""
        headers = {**self.base_headers, **self.option_table("headers")}
        auth = spec.options.get("auth", "bearer")
        if auth not in ("bearer", "api-key"):
            raise spec.error("auth", f"expected 'bearer' or 'api-key', got {auth!r}")
        secret = self.secret_from_env()
        if secret and auth == "bearer":
            headers["Authorization"] = f"Bearer {secret}"
        elif secret:
            headers["api-key"] = secret
        self.headers: Mapping[str, str] = headers
        default = "native" if self.base_url == _OPENAI_API else "translate"
        mode = spec.options.get("responses", default)
        if mode not in ("native", "translate"):
            raise spec.error("responses", f"expected 'native' or 'translate', got {mode!r}")
        if mode == "native":
            self.native_wires = _NATIVE_RESPONSES

    def url(self, endpoint: Endpoint, binding: Binding) -> str:
        path = _PATHS[endpoint]
        if self.deployments:
            return f"{self.base_url}/deployments/{binding.model}/{path}{self.query}"
        return f"{self.base_url}/{path}{self.query}"

    async def send(
        self, call: Call, binding: Binding, endpoint: Endpoint, body: dict[str, Any]
    ) -> UpstreamResponse:
        body["model"] = binding.model
        # The Responses API reports usage in its last event unasked.
        if body.get("stream") and endpoint is not Endpoint.RESPONSES:
            # Always ask for usage so the serving attempt can be billed; the
            # relay forwards the usage chunk only to callers who asked for it.
            body["stream_options"] = {**(body.get("stream_options") or {}), "include_usage": True}
        return await self.post(self.url(endpoint, binding), self.headers, orjson.dumps(body))
