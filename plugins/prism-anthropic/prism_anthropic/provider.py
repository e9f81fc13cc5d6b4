"""An Anthropic Messages API upstream (api.anthropic.com or a compatible gateway)."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, ClassVar

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
    {"base_url", "api_key_env", "anthropic_version", "beta", "headers", "default_max_tokens"}
)
DEFAULT_BASE_URL = "https://api.anthropic.com/v1"
DEFAULT_VERSION = "2023-06-01"


class AnthropicProvider(HttpProvider):
    """Options (``[providers.<name>]`` with ``kind = "anthropic"``):

    - ``base_url``: the API root ending in ``/v1`` (default ``https://api.anthropic.com/v1``);
    - ``api_key_env``: the environment variable holding the key (sent as ``x-api-key``);
    - ``anthropic_version``: the ``anthropic-version`` header (default ``2023-06-01``);
    - ``beta``: a list of ``anthropic-beta`` feature names;
    - ``headers``: a table of extra static headers;
    - ``default_max_tokens``: ``max_tokens`` for translated chat requests that set none
      (the Messages API requires it; default 4096);
    - ``max_connections``, ``connect_timeout_ms``: the connection pool;
    - ``proxy``: the egress proxy's URL, or ``"none"`` (default: the environment's).
    """

    wire: ClassVar[str] = "anthropic"
    endpoints: ClassVar[frozenset[Endpoint]] = frozenset({Endpoint.MESSAGES})

    def __init__(self, spec: ProviderSpec) -> None:
        super().__init__(spec)
        check_options(spec, "anthropic", _OPTIONS)
        base_url = spec.options.get("base_url", DEFAULT_BASE_URL)
        if not isinstance(base_url, str) or not base_url.startswith(("http://", "https://")):
            raise spec.error("base_url", f"expected an http(s) URL, got {base_url!r}")
        self.url = base_url.rstrip("/") + "/messages"
        version = spec.options.get("anthropic_version", DEFAULT_VERSION)
        if not isinstance(version, str) or not version:
            raise spec.error("anthropic_version", "expected a version string like 2023-06-01")
        headers = {**self.base_headers, "anthropic-version": version}
        beta = spec.options.get("beta", [])
        if not isinstance(beta, list) or not all(isinstance(b, str) for b in beta):
            raise spec.error("beta", "expected a list of beta feature names")
        if beta:
            headers["anthropic-beta"] = ",".join(beta)
        headers.update(self.option_table("headers"))
        max_tokens = spec.options.get("default_max_tokens", 4096)
        if isinstance(max_tokens, bool) or not isinstance(max_tokens, int) or max_tokens < 1:
            raise spec.error(
                "default_max_tokens", f"expected a positive whole number, got {max_tokens!r}"
            )
        self.default_max_tokens = max_tokens
        secret = self.secret_from_env()
        if secret:
            headers["x-api-key"] = secret
        self.headers: Mapping[str, str] = headers

    async def send(
        self, call: Call, binding: Binding, endpoint: Endpoint, body: dict[str, Any]
    ) -> UpstreamResponse:
        body["model"] = binding.model
        return await self.post(self.url, self.headers, orjson.dumps(body))
