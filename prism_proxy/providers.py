"""The provider adapter contract, and a pooled-HTTP base class for adapters.

A provider plugin registers factories through ``prism_provider_kinds``; a
factory takes a :class:`ProviderSpec` (one ``[providers.<name>]`` table),
validates its options (raising ``ConfigError`` via ``spec.error``) and returns
a :class:`Provider`.  The core starts every provider once at app start-up and
closes it at shutdown, so each holds one pooled client session.
"""

from __future__ import annotations

import abc
from collections.abc import AsyncIterator, Callable, Mapping
from typing import ClassVar, Protocol

import aiohttp

from .call import Call
from .catalog import Binding, ProviderSpec

__all__ = ["HttpProvider", "Provider", "ProviderFactory", "UpstreamResponse"]


class UpstreamResponse(Protocol):
    """An upstream answer whose headers have arrived and whose body is still to read."""

    status: int
    headers: Mapping[str, str]

    async def read(self) -> bytes:
        """The whole body."""

    def iter_chunks(self) -> AsyncIterator[bytes]:
        """Body bytes as they arrive (for streams)."""

    def close(self) -> None:
        """Drop the connection at once: the upstream sees the client go away."""

    def release(self) -> None:
        """Done with a fully read body: the connection may return to the pool."""


class Provider(abc.ABC):
    """One configured upstream account.

    ``wire`` names the wire format the upstream speaks (``"openai"``); the
    core relays answers in that format to callers who speak it.
    """

    wire: ClassVar[str] = "openai"

    def __init__(self, spec: ProviderSpec) -> None:
        self.spec = spec
        self.name = spec.name

    async def start(self) -> None:
        """Open pooled resources; called once, inside the running event loop."""

    async def close(self) -> None:
        """Release pooled resources; called once at shutdown."""

    @abc.abstractmethod
    async def send(self, call: Call, binding: Binding) -> UpstreamResponse:
        """Send ``call`` to ``binding``'s upstream model and return once headers arrive.

        Raise ``aiohttp.ClientError``/``OSError`` for connection failures; the
        core enforces the attempt timeout around this call and the body read.
        """


ProviderFactory = Callable[[ProviderSpec], Provider]


class _AiohttpResponse:
    __slots__ = ("_response", "headers", "status")

    def __init__(self, response: aiohttp.ClientResponse) -> None:
        self._response = response
        self.status = response.status
        self.headers: Mapping[str, str] = response.headers

    async def read(self) -> bytes:
        return await self._response.read()

    async def iter_chunks(self) -> AsyncIterator[bytes]:
        async for data in self._response.content.iter_any():
            yield data

    def close(self) -> None:
        self._response.close()

    def release(self) -> None:
        self._response.release()


class HttpProvider(Provider):
    """A provider reached over HTTP through one pooled ``aiohttp.ClientSession``.

    Options every HTTP provider understands: ``max_connections`` (default 256)
    and ``connect_timeout_ms`` (default 10000).
    """

    COMMON_OPTIONS: ClassVar[frozenset[str]] = frozenset({"max_connections", "connect_timeout_ms"})

    def __init__(self, spec: ProviderSpec) -> None:
        super().__init__(spec)
        self.max_connections = _positive_int(spec, "max_connections", 256)
        self.connect_timeout_s = _positive_int(spec, "connect_timeout_ms", 10_000) / 1000
        self._session: aiohttp.ClientSession | None = None

    async def start(self) -> None:
        connector = aiohttp.TCPConnector(
            limit=self.max_connections, limit_per_host=0, ttl_dns_cache=300
        )
        self._session = aiohttp.ClientSession(
            connector=connector,
            timeout=aiohttp.ClientTimeout(total=None, sock_connect=self.connect_timeout_s),
            skip_auto_headers=("User-Agent",),
        )

    async def close(self) -> None:
        if self._session is not None:
            await self._session.close()
            self._session = None

    async def post(self, url: str, headers: Mapping[str, str], payload: bytes) -> UpstreamResponse:
        """POST ``payload`` and return once the response headers arrive."""
        if self._session is None:
            raise RuntimeError(f"provider {self.name!r} used before start()")
        response = await self._session.post(url, data=payload, headers=headers)
        return _AiohttpResponse(response)


def _positive_int(spec: ProviderSpec, key: str, default: int) -> int:
    value = spec.options.get(key, default)
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise spec.error(key, f"expected a positive whole number, got {value!r}")
    return value
