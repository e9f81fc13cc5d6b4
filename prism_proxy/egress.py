"""Egress proxies: which forward proxy, if any, a provider's upstream requests go through.

A gateway behind a corporate egress proxy reaches its providers through it.
Each ``HttpProvider`` resolves its :class:`Egress` once, when its generation
is built: its own ``proxy`` option if it has one (a URL, or ``"none"`` for
direct), else the environment as curl and requests read it
(``https_proxy``/``HTTPS_PROXY`` for https upstreams, ``http_proxy``/
``HTTP_PROXY`` for http ones, the lower-case spelling first;
``no_proxy``/``NO_PROXY``: the upstreams reached directly all the same, a
comma list of host names (each with its subdomains; a leading ``.`` or
``*.`` changes nothing), IP addresses or networks (``10.0.0.0/8``), each
with an optional ``:port``, or ``*`` for all).  Loopback is not implied: list
``localhost,127.0.0.1`` to reach local upstreams directly.  Calls never
read the environment.

An https upstream is reached through a ``CONNECT`` tunnel, with TLS to the
upstream inside it (SNI and certificate checked against the upstream's
host): the proxy sees only the host and port.  An http upstream gets its
requests in absolute form through the proxy, which sees them whole.
"""

from __future__ import annotations

import asyncio
import base64
import http
import ipaddress
import ssl
from collections.abc import Callable, Mapping
from typing import TypeVar, cast
from urllib.parse import unquote, urlsplit

import aiohttp
import attrs

from .errors import ConfigError

__all__ = [
    "DIRECT",
    "Bypass",
    "Egress",
    "Proxy",
    "ProxyError",
    "connect_proxy",
    "open_tunnel",
    "parse_proxy",
]

#: The most bytes a proxy's answer to CONNECT may have before its end.
MAX_CONNECT_ANSWER = 16 * 1024
_SHAPE = "expected http://[user:password@]host:port"
_P = TypeVar("_P", bound=asyncio.Protocol)
IPAddress = ipaddress.IPv4Address | ipaddress.IPv6Address
IPNetwork = ipaddress.IPv4Network | ipaddress.IPv6Network


class ProxyError(aiohttp.ClientConnectionError):
    """The egress proxy could not be reached, or would not carry the request.

    A connection failure of the attempt, like a refused connect: the message
    names the proxy (never its credentials) and the upstream; ``reason`` is
    the short cause an attempt record shows; ``status`` is the proxy's answer
    (407 credentials, 403 its policy, 502 the upstream unreachable from it),
    None when there was none.
    """

    def __init__(self, message: str, reason: str, status: int | None = None) -> None:
        super().__init__(message)
        self.reason = reason
        self.status = status

    @classmethod
    def refused(cls, proxy: Proxy, what: str, status: int) -> ProxyError:
        try:
            phrase = http.HTTPStatus(status).phrase
        except ValueError:
            phrase = "unknown status"
        # The proxy's own reason text is not repeated: it is the proxy's to write.
        answer = f"{status} {phrase}"
        return cls(
            f"the egress proxy {proxy.shown} refused {what}: {answer}",
            f"egress proxy refused: {answer}",
            status,
        )


@attrs.frozen
class Proxy:
    """One forward proxy, parsed from its URL."""

    host: str
    port: int
    #: What messages name: the URL without its credentials.
    shown: str
    #: The ``Proxy-Authorization`` value (``Basic …``) when the URL has credentials.
    authorization: str | None = attrs.field(default=None, repr=False)

    def connect_request(self, host: str, port: int) -> bytes:
        authority = f"{_bracketed(host)}:{port}"
        lines = [f"CONNECT {authority} HTTP/1.1", f"Host: {authority}"]
        if self.authorization is not None:
            lines.append(f"Proxy-Authorization: {self.authorization}")
        return ("\r\n".join(lines) + "\r\n\r\n").encode("latin-1")


def parse_proxy(url: str) -> Proxy:
    """``http://[user:password@]host[:port]`` (a bare ``host:port`` is taken as http).

    Credentials are percent-decoded and sent as ``Proxy-Authorization:
    Basic``.  Raises ``ValueError`` whose message never repeats them.
    """
    text = url.strip()
    if "://" not in text:
        text = "http://" + text
    try:
        parts = urlsplit(text)
        port = parts.port
    except ValueError:
        raise ValueError(_SHAPE) from None  # its message may quote the URL
    if parts.scheme.lower() != "http":
        raise ValueError(
            f"unsupported proxy scheme {parts.scheme!r} ({_SHAPE}; an https upstream is still "
            "TLS end to end, inside the proxy's CONNECT tunnel)"
        )
    host = parts.hostname
    if not host:
        raise ValueError(f"{_SHAPE} (no host)")
    if parts.path not in ("", "/") or parts.query or parts.fragment:
        raise ValueError(f"{_SHAPE} (a proxy URL has no path)")
    port = port or 80
    authorization = None
    if parts.username is not None or parts.password is not None:
        credentials = f"{unquote(parts.username or '')}:{unquote(parts.password or '')}"
        if any(c in credentials for c in "\r\n\0"):
            raise ValueError(f"{_SHAPE} (the credentials contain a line break)")
        authorization = "Basic " + base64.b64encode(credentials.encode()).decode("ascii")
    return Proxy(host, port, f"http://{_bracketed(host)}:{port}", authorization)


@attrs.frozen
class Bypass:
    """One ``NO_PROXY`` entry: a host and its subdomains, an IP network, on a port or any."""

    host: str = ""
    network: IPNetwork | None = None
    port: int | None = None

    @classmethod
    def parse(cls, entry: str) -> Bypass:
        text = entry.strip().lower()
        port: int | None = None
        head, colon, tail = text.rpartition(":")
        # A port follows the last colon, unless the colons are a bare IPv6 address's.
        if colon and tail.isdigit() and (head.endswith("]") or ":" not in head):
            text, port = head, int(tail)
        text = text.removeprefix("*.").lstrip(".").removeprefix("[").removesuffix("]")
        try:
            return cls(network=ipaddress.ip_network(text, strict=False), port=port)
        except ValueError:
            return cls(host=text, port=port)

    def matches(self, host: str, address: IPAddress | None, port: int) -> bool:
        if self.port is not None and self.port != port:
            return False
        if self.network is not None:
            return address is not None and address in self.network
        if address is not None:
            return False  # "0.0.1" is not a suffix of 127.0.0.1
        return host == self.host or host.endswith("." + self.host)


@attrs.frozen
class Egress:
    """Where one provider's upstream requests go: through which proxy, if any."""

    http: Proxy | None = None
    https: Proxy | None = None
    #: The environment's ``NO_PROXY``: the upstreams reached directly all the same.
    bypass: tuple[Bypass, ...] = ()
    #: ``NO_PROXY=*``: every upstream is reached directly.
    bypass_all: bool = False

    @classmethod
    def through(cls, proxy: Proxy) -> Egress:
        """Every request through ``proxy`` (a provider's own ``proxy`` option)."""
        return cls(proxy, proxy)

    @classmethod
    def from_environment(cls, environ: Mapping[str, str]) -> Egress:
        """The environment's proxies, as curl and requests read them; a value that is
        not an http proxy URL is a ``ConfigError`` naming the variable."""
        entries = [e.strip() for e in _variable(environ, "no_proxy")[1].split(",") if e.strip()]
        return cls(
            _environment_proxy(environ, "http_proxy"),
            _environment_proxy(environ, "https_proxy"),
            bypass=tuple(Bypass.parse(entry) for entry in entries if entry != "*"),
            bypass_all="*" in entries,
        )

    def proxy_for(self, host: str, port: int, tls: bool) -> Proxy | None:
        """The proxy for requests to ``host:port``, or None to go direct."""
        proxy = self.https if tls else self.http
        if proxy is None or self.bypass_all:
            return None
        if self.bypass:
            host = host.lower().rstrip(".")
            try:
                address: IPAddress | None = ipaddress.ip_address(host)
            except ValueError:
                address = None
            if any(entry.matches(host, address, port) for entry in self.bypass):
                return None
        return proxy


def _environment_proxy(environ: Mapping[str, str], name: str) -> Proxy | None:
    variable, url = _variable(environ, name)
    try:
        return parse_proxy(url) if url else None
    except ValueError as exc:
        raise ConfigError(
            "environment", variable, f"{exc}; a provider's proxy option overrides the environment"
        ) from None


def _variable(environ: Mapping[str, str], name: str) -> tuple[str, str]:
    """A variable's name as set and its value; the lower-case spelling wins, as in curl."""
    for spelling in (name, name.upper()):
        value = environ.get(spelling, "").strip()
        if value:
            return spelling, value
    return name.upper(), ""


#: No proxy: every request goes straight to its upstream.
DIRECT = Egress()


async def connect_proxy(proxy: Proxy, factory: Callable[[], _P]) -> tuple[asyncio.Transport, _P]:
    """A plain TCP connection to ``proxy``; failing to reach it is a :class:`ProxyError`."""
    loop = asyncio.get_running_loop()
    try:
        transport, protocol = await loop.create_connection(factory, proxy.host, proxy.port)
    except OSError as exc:
        # Chained: the gateway's own shortage of files shows through (dispatch looks).
        raise ProxyError(
            f"cannot reach the egress proxy {proxy.shown}: {exc.strerror or type(exc).__name__}",
            "egress proxy unreachable",
        ) from exc
    return transport, protocol


async def open_tunnel(
    proxy: Proxy, host: str, port: int, protocol: asyncio.Protocol, context: ssl.SSLContext
) -> asyncio.Transport:
    """TLS to ``host:port`` inside ``proxy``'s CONNECT tunnel; ``protocol`` is told the
    TLS transport (``connection_made``) once the handshake is done."""
    loop = asyncio.get_running_loop()
    transport, tunnel = await connect_proxy(proxy, lambda: _Tunnel(loop, proxy))
    try:
        transport.write(proxy.connect_request(host, port))
        status = await tunnel.answer
        if not 200 <= status < 300:
            raise ProxyError.refused(proxy, f"CONNECT to {_bracketed(host)}:{port}", status)
        if tunnel.overrun:
            raise tunnel.failure("sent bytes before the tunnel's TLS began")
        tls = await loop.start_tls(transport, protocol, context, server_hostname=host)
    except BaseException:
        transport.close()
        raise
    if tls is None:  # the loop's contract allows it: the connection ended meanwhile
        raise aiohttp.ServerDisconnectedError()
    protocol.connection_made(tls)  # start_tls does not: the protocol is already ours
    return tls


class _Tunnel(asyncio.Protocol):
    """Reads the proxy's answer to CONNECT up to the end of its head: its status."""

    def __init__(self, loop: asyncio.AbstractEventLoop, proxy: Proxy) -> None:
        self.proxy = proxy
        self.answer: asyncio.Future[int] = loop.create_future()
        self.buffer = bytearray()
        #: Bytes came after the head, before our TLS began: no tunnel to trust.
        self.overrun = False
        self.transport: asyncio.Transport | None = None

    def failure(self, what: str) -> ProxyError:
        return ProxyError(
            f"the egress proxy {self.proxy.shown} {what}", "egress proxy broke CONNECT"
        )

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        # uvloop's transports implement asyncio.Transport without subclassing it.
        self.transport = cast(asyncio.Transport, transport)

    def data_received(self, data: bytes) -> None:
        if self.answer.done():
            self.overrun = True
            return
        self.buffer += data
        end = self.buffer.find(b"\r\n\r\n")
        if end >= 0:
            if self.transport is not None:
                self.transport.pause_reading()  # what follows is TLS, for start_tls to read
            self.overrun = len(self.buffer) > end + 4
            version, _, rest = bytes(self.buffer[: self.buffer.find(b"\r\n")]).partition(b" ")
            code = rest[:3]
            if version.startswith(b"HTTP/1.") and len(code) == 3 and code.isdigit():
                self.answer.set_result(int(code))
            else:
                self.answer.set_exception(self.failure("answered CONNECT with something not HTTP"))
        elif len(self.buffer) > MAX_CONNECT_ANSWER:
            self.answer.set_exception(
                self.failure(f"answered CONNECT with over {MAX_CONNECT_ANSWER} bytes of head")
            )

    def connection_lost(self, exc: Exception | None) -> None:
        if not self.answer.done():
            self.answer.set_exception(
                self.failure("closed the connection before answering CONNECT")
            )


def _bracketed(host: str) -> str:
    return f"[{host}]" if ":" in host else host
