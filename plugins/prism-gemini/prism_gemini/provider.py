"""Gemini upstreams: Google's Gemini API (an API key) and Vertex AI (OAuth bearer tokens)."""

from __future__ import annotations

import time
from collections.abc import Callable, Mapping
from typing import Any, ClassVar

import orjson

from prism_proxy import (
    Binding,
    Call,
    Endpoint,
    HeldResponse,
    HttpProvider,
    ProviderSpec,
    ResponseWrapper,
    UpstreamResponse,
    check_options,
)

from .answers import BASE64_MARK
from .tokens import CredentialsMissing, TokenRefused, TokenSource

__all__ = ["GeminiProvider", "VertexProvider"]

DEFAULT_BASE_URL = "https://generativelanguage.googleapis.com/v1beta"
_GEMINI_OPTIONS = frozenset({"base_url", "api_key_env", "headers"})
_VERTEX_OPTIONS = frozenset({"base_url", "project", "location", "credentials_file", "headers"})


class _Marked(ResponseWrapper):
    """An embeddings answer, marked for base64 encoding when the caller asked for it."""

    async def read(self) -> bytes:
        raw = await self.response.read()
        if self.status != 200:
            return raw
        try:
            payload = orjson.loads(raw)
        except orjson.JSONDecodeError:
            return raw
        if not isinstance(payload, dict):
            return raw
        payload[BASE64_MARK] = "base64"
        return orjson.dumps(payload)


def _refused(message: str) -> HeldResponse:
    """The token endpoint refused the credentials: answered as Google's 401."""
    error = {"code": 401, "message": message, "status": "UNAUTHENTICATED"}
    return HeldResponse(401, {"content-type": "application/json"}, orjson.dumps({"error": error}))


class _GoogleProvider(HttpProvider):
    """What both kinds share: the model URLs and the request bodies."""

    wire: ClassVar[str] = "gemini"
    endpoints: ClassVar[frozenset[Endpoint]] = frozenset({Endpoint.CHAT, Endpoint.EMBEDDINGS})
    KIND: ClassVar[str] = ""
    OPTIONS: ClassVar[frozenset[str]] = frozenset()

    def __init__(self, spec: ProviderSpec) -> None:
        super().__init__(spec)
        check_options(spec, self.KIND, self.OPTIONS)
        self.extra_headers = self.option_table("headers")

    def _base_url(self, default: str) -> str:
        base_url = self.spec.options.get("base_url", default)
        if not isinstance(base_url, str) or not base_url.startswith(("http://", "https://")):
            raise self.spec.error("base_url", f"expected an http(s) URL, got {base_url!r}")
        return base_url.rstrip("/")

    def model_url(self, model: str) -> str:
        raise NotImplementedError

    async def headers_for_call(self) -> Mapping[str, str] | HeldResponse:
        raise NotImplementedError

    async def send(
        self, call: Call, binding: Binding, endpoint: Endpoint, body: dict[str, Any]
    ) -> UpstreamResponse:
        headers = await self.headers_for_call()
        if isinstance(headers, HeldResponse):
            return headers
        url = self.model_url(binding.model)
        if endpoint is not Endpoint.EMBEDDINGS:
            method = ":streamGenerateContent?alt=sse" if call.stream else ":generateContent"
            return await self.post(url + method, headers, orjson.dumps(body))
        marked = body.pop("encodingFormat", None) == "base64"
        url, payload = self.embed(url, binding.model, body["requests"])
        response = await self.post(url, headers, orjson.dumps(payload))
        return _Marked(response) if marked else response

    def embed(
        self, url: str, model: str, requests: list[dict[str, Any]]
    ) -> tuple[str, dict[str, Any]]:
        """The embeddings URL and body for ``requests`` (``batchEmbedContents`` entries)."""
        if len(requests) == 1:
            return url + ":embedContent", requests[0]
        name = "models/" + model.removeprefix("models/")
        return url + ":batchEmbedContents", {
            "requests": [{"model": name, **request} for request in requests]
        }


class GeminiProvider(_GoogleProvider):
    """Options (``[providers.<name>]`` with ``kind = "gemini"``):

    - ``base_url``: the API root (default ``https://generativelanguage.googleapis.com/v1beta``);
    - ``api_key_env``: the environment variable holding the key (sent as ``x-goog-api-key``);
    - ``headers``: a table of extra static headers;
    - ``max_connections``, ``connect_timeout_ms``, ``proxy``: the connection pool.
    """

    KIND = "gemini"
    OPTIONS = _GEMINI_OPTIONS

    def __init__(self, spec: ProviderSpec) -> None:
        super().__init__(spec)
        self.root = self._base_url(DEFAULT_BASE_URL)
        headers = {**self.base_headers, **self.extra_headers}
        secret = self.secret_from_env()
        if secret:
            headers["x-goog-api-key"] = secret
        self.headers: Mapping[str, str] = headers

    def model_url(self, model: str) -> str:
        return f"{self.root}/models/{model.removeprefix('models/')}"

    async def headers_for_call(self) -> Mapping[str, str]:
        return self.headers


class VertexProvider(_GoogleProvider):
    """Options (``[providers.<name>]`` with ``kind = "vertex"``):

    - ``project``, ``location``: the Google Cloud project and region (``global`` too);
      ``location`` defaults to the provider's ``region`` (the core's option regions
      route and report by), and may not differ from it;
    - ``base_url``: the API root instead of ``https://{location}-aiplatform.googleapis.com/v1``;
    - ``credentials_file``: a service account's JSON key file; without it the
      environment's credentials (``GOOGLE_APPLICATION_CREDENTIALS``, the metadata server…);
    - ``headers``: a table of extra static headers;
    - ``max_connections``, ``connect_timeout_ms``, ``proxy``: the connection pool.

    Bearer tokens are fetched once and reused until five minutes before they
    expire; a refresh runs in a worker thread and concurrent calls share it.
    """

    KIND = "vertex"
    OPTIONS = _VERTEX_OPTIONS

    def __init__(self, spec: ProviderSpec) -> None:
        super().__init__(spec)
        values = {}
        for key in ("project", "location"):
            # The line's region is where Vertex serves it: `location` defaults to it.
            value = spec.options.get(key, spec.region if key == "location" else None)
            if not isinstance(value, str) or not value or "/" in value:
                raise spec.error(key, f"expected the Google Cloud {key} name, got {value!r}")
            values[key] = value
        project, location = values["project"], values["location"]
        if spec.region is not None and location not in (spec.region, "global"):
            # Regions route and report by `region`: a different location would misreport.
            raise spec.error(
                "location",
                f"{location!r} is not the provider's region {spec.region!r}: "
                "leave location out (it defaults to region) or make them the same",
            )
        host = (
            "aiplatform.googleapis.com"
            if location == "global"
            else (f"{location}-aiplatform.googleapis.com")
        )
        root = self._base_url(f"https://{host}/v1")
        self.prefix = f"{root}/projects/{project}/locations/{location}/publishers/google/models"
        credentials_file = spec.options.get("credentials_file")
        if credentials_file is not None and (
            not isinstance(credentials_file, str) or not credentials_file
        ):
            raise spec.error("credentials_file", "expected the path of a service account key file")
        self.credentials_file: str | None = credentials_file
        #: The time tokens expire by; the plugin gives it the generation's clock.
        self.clock: Callable[[], float] = time.monotonic
        self.tokens: TokenSource | None = None
        self.headers: Mapping[str, str] = {**self.base_headers, **self.extra_headers}

    async def start(self) -> None:
        await super().start()
        try:
            proxy = self.spec.options.get("proxy")  # checked by HttpProvider: a str
            self.tokens = await TokenSource.load(self.credentials_file, lambda: self.clock(), proxy)
        except CredentialsMissing as exc:
            await super().close()
            raise self.spec.error("credentials_file", str(exc)) from None

    async def close(self) -> None:
        await super().close()
        if self.tokens is not None:
            self.tokens.close()
            self.tokens = None

    def model_url(self, model: str) -> str:
        return f"{self.prefix}/{model}"

    def embed(
        self, url: str, model: str, requests: list[dict[str, Any]]
    ) -> tuple[str, dict[str, Any]]:
        """Vertex embeds through ``:predict``: one instance per text."""
        instances = [{"content": request["content"]["parts"][0]["text"]} for request in requests]
        payload: dict[str, Any] = {"instances": instances}
        dims = requests[0].get("outputDimensionality")
        if dims is not None:
            payload["parameters"] = {"outputDimensionality": dims}
        return url + ":predict", payload

    async def headers_for_call(self) -> Mapping[str, str] | HeldResponse:
        if self.tokens is None:
            raise RuntimeError(f"provider {self.name!r} used before start()")
        try:
            token = await self.tokens.token()
        except TokenRefused as refused:
            return _refused(str(refused))
        headers = self.headers
        if headers.get("Authorization") != f"Bearer {token}":
            headers = self.headers = {**headers, "Authorization": f"Bearer {token}"}
        return headers
