"""An Amazon Bedrock Runtime upstream: Converse and ConverseStream, signed with SigV4.

Credentials come from the standard AWS chain through botocore (environment,
shared config/credentials files with the ``profile`` option, container or
instance role), resolved once at start-up off the event loop; refreshable
credentials are refreshed when botocore says they must be, also off the loop.
Every request is signed by botocore's :class:`~botocore.auth.SigV4Auth`
(service ``bedrock``) on the URL as sent: the model id percent-encoded in the
path, as the AWS SDKs send it.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Mapping
from typing import Any, ClassVar
from urllib.parse import quote

import botocore.session
import orjson
from botocore.auth import SigV4Auth
from botocore.awsrequest import AWSRequest
from botocore.credentials import Credentials, ReadOnlyCredentials, RefreshableCredentials
from botocore.exceptions import BotoCoreError

from prism_proxy import (
    Binding,
    Call,
    Endpoint,
    HttpProvider,
    ProviderSpec,
    UpstreamResponse,
    check_options,
)

from .eventstream import EVENT_STREAM, ConverseResponse

__all__ = ["BedrockProvider"]

log = logging.getLogger("prism.bedrock")

_OPTIONS = frozenset({"base_url", "profile", "headers"})
#: The service name Bedrock Runtime requests are signed for.
SERVICE = "bedrock"


class BedrockProvider(HttpProvider):
    """Options (``[providers.<name>]`` with ``kind = "bedrock"``):

    - ``region``: the AWS region (required), e.g. ``us-east-1``;
    - ``base_url``: the endpoint (default ``https://bedrock-runtime.{region}.amazonaws.com``);
    - ``profile``: the shared config/credentials profile (default: the chain's own choice);
    - ``headers``: a table of extra static headers (signed with the rest);
    - ``max_connections``, ``connect_timeout_ms``, ``proxy``: as for every HTTP provider.
    """

    wire: ClassVar[str] = "bedrock"
    endpoints: ClassVar[frozenset[Endpoint]] = frozenset({Endpoint.CHAT})

    def __init__(self, spec: ProviderSpec) -> None:
        super().__init__(spec)
        check_options(spec, "bedrock", _OPTIONS)
        # The provider table's ``region`` is the core's (where the upstream serves
        # from, checked there): for Bedrock it is also the region requests are signed for.
        if spec.region is None:
            raise spec.error(
                "region", "required for kind 'bedrock': an AWS region such as us-east-1"
            )
        self.region: str = spec.region
        default_url = f"https://bedrock-runtime.{self.region}.amazonaws.com"
        base_url = spec.options.get("base_url", default_url)
        if not isinstance(base_url, str) or not base_url.startswith(("http://", "https://")):
            raise spec.error("base_url", f"expected an http(s) URL, got {base_url!r}")
        self.root = base_url.rstrip("/")
        profile = spec.options.get("profile")
        if profile is not None and (not isinstance(profile, str) or not profile):
            raise spec.error("profile", "expected the name of an AWS profile")
        self.profile: str | None = profile
        self.extra_headers: Mapping[str, str] = self.option_table("headers")
        self._credentials: Credentials | None = None

    async def start(self) -> None:
        await super().start()
        # The chain may read files or ask a metadata service: never on the event loop.
        self._credentials = await asyncio.to_thread(self._resolve_credentials)

    def _resolve_credentials(self) -> Credentials | None:
        try:
            session = botocore.session.Session(profile=self.profile)
            credentials = session.get_credentials()
        except BotoCoreError as exc:
            # botocore's messages name profiles and files, never secrets.
            raise self.spec.error("profile", str(exc)) from None
        if credentials is None:
            log.warning(
                "%s: no AWS credentials found; requests go unsigned and will be refused",
                self.spec.where("region"),
            )
        return credentials

    async def _frozen(self) -> ReadOnlyCredentials | None:
        credentials = self._credentials
        if credentials is None:
            return None
        if isinstance(credentials, RefreshableCredentials) and credentials.refresh_needed():
            # Refreshing may call STS or a metadata service: off the loop.
            return await asyncio.to_thread(credentials.get_frozen_credentials)
        return credentials.get_frozen_credentials()

    def url_for(self, model: str, stream: bool) -> str:
        # An id with ':' or '/' (a version suffix, an inference profile ARN) is one path segment.
        operation = "converse-stream" if stream else "converse"
        return f"{self.root}/model/{quote(model, safe='')}/{operation}"

    def signed_headers(
        self, url: str, payload: bytes, stream: bool, credentials: ReadOnlyCredentials | None
    ) -> dict[str, str]:
        headers = {
            **self.base_headers,
            "Accept": EVENT_STREAM if stream else "application/json",
            **self.extra_headers,
        }
        if credentials is None:
            return headers
        request = AWSRequest(method="POST", url=url, data=payload, headers=headers)
        SigV4Auth(credentials, SERVICE, self.region).add_auth(request)
        return dict(request.headers.items())

    async def send(
        self, call: Call, binding: Binding, endpoint: Endpoint, body: dict[str, Any]
    ) -> UpstreamResponse:
        stream = bool(body.pop("stream", False))
        body.pop("model", None)
        url = self.url_for(binding.model, stream)
        payload = orjson.dumps(body)
        headers = self.signed_headers(url, payload, stream, await self._frozen())
        response = await self.post(url, headers, payload)
        return ConverseResponse(response, binding.model)
