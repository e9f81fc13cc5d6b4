"""What Prism's HTTP server takes from aiohttp beyond its documented API, in one place.

Prism serves with aiohttp's own connection handler, extended (see
:mod:`.connections`) with a deadline for request heads, a connection cap
and JSON answers to the parser's rejections.  That needs a handler's state
that aiohttp keeps private (the parsed requests waiting in line, how many
were parsed, whether one is being handled), a site's listening server, its
private form of "the parser rejected this", and a response's private switch
that holds its headers for the first body write.  Nothing else in Prism
names an aiohttp private: every one is reached through this module, each
with what it is for and the oldest aiohttp release it is known to be in.

``tests/test_aiohttp_internals.py`` holds one test per name, run against
the installed aiohttp on a real server: an aiohttp release that drops or
reshapes one fails that test by name.  It also checks the signatures of
what :class:`~prism_proxy.connections.GuardedHandler` overrides or passes
without aiohttp documenting them (``finish_response``, ``handle_error``,
the handler's constructor options).  The core requires ``aiohttp>=3.12,<4``
(3.12 brought the newest name here, ``_send_headers_immediately``; a major
release may move any of them): after upgrading aiohttp, run that file first.

A handler's state is read on every read from a socket, so it costs nothing
extra: each alias below *is* aiohttp's own slot descriptor under a public
name (no property, no call), and reading ``self.aio_messages`` costs what
reading ``self._messages`` does.

An aiohttp without one of them still imports: the alias stands in with a
descriptor that raises :class:`AiohttpInternalMissing` (naming it) when
used, and :func:`require`, which :func:`~prism_proxy.server.listen` calls,
refuses to serve, naming every one that is missing: a gateway stops at
start-up rather than failing its connections one by one.
"""

from __future__ import annotations

import asyncio
import collections
from importlib.metadata import PackageNotFoundError, version
from types import ModuleType
from typing import TYPE_CHECKING, Any, Generic, TypeVar, overload

import attrs
from aiohttp import http_exceptions, web, web_protocol
from aiohttp.base_protocol import BaseProtocol
from aiohttp.http import RawRequestMessage
from aiohttp.streams import StreamReader

if TYPE_CHECKING:
    from aiohttp.http_exceptions import BadHttpMessage, LineTooLong
    from aiohttp.web_protocol import _ErrInfo as ErrInfo

__all__ = [
    "INTERNALS",
    "AiohttpInternalMissing",
    "BadHttpMessage",
    "DeferredHeadersResponse",
    "ErrInfo",
    "HandlerInternals",
    "Internal",
    "LineTooLong",
    "SiteInternals",
    "missing",
    "require",
]

#: The aiohttp releases Prism runs on (also in pyproject.toml and the README).
SUPPORTED = "aiohttp>=3.12,<4"


@attrs.frozen
class Internal:
    """One name Prism takes from aiohttp that aiohttp does not document."""

    owner: type | ModuleType
    name: str
    #: The oldest aiohttp release it is known to be in (older ones may have it too).
    since: str
    #: What Prism does with it.
    purpose: str
    #: False when Prism answers the same without it (only a cost changes).
    required: bool = True

    @property
    def where(self) -> str:
        owner = self.owner
        prefix = owner.__name__ if isinstance(owner, ModuleType) else owner.__qualname__
        return f"{prefix}.{self.name}"

    def present(self) -> bool:
        owner = self.owner
        if isinstance(owner, ModuleType):
            return hasattr(owner, self.name)
        # Looked up as Python does for an instance: in the class and its bases' own dicts.
        return any(self.name in vars(klass) for klass in owner.__mro__)


class AiohttpInternalMissing(RuntimeError):
    """The installed aiohttp lacks a name Prism needs (see :mod:`.aiohttp_internals`)."""

    def __init__(self, missing: list[Internal]) -> None:
        names = ", ".join(internal.where for internal in missing)
        try:
            installed = version("aiohttp")
        except PackageNotFoundError:  # pragma: no cover - aiohttp imported, so installed
            installed = "unknown"
        super().__init__(
            f"aiohttp {installed} lacks {names}, which Prism's HTTP server relies on; "
            f"install {SUPPORTED}"
        )
        self.missing = missing


@attrs.frozen
class _Absent:
    """Stands in for an internal this aiohttp lacks: using it says which."""

    internal: Internal

    def __get__(self, instance: object, owner: type | None = None) -> Any:
        if instance is None:
            return self  # looked up on the class (introspection): nothing is used yet
        raise AiohttpInternalMissing([self.internal])

    def __set__(self, instance: object, value: object) -> None:
        raise AiohttpInternalMissing([self.internal])

    def __call__(self, *args: object, **kwargs: object) -> Any:
        raise AiohttpInternalMissing([self.internal])


_T = TypeVar("_T")


class Slot(Generic[_T]):
    """How the type checker sees an alias: a slot holding a ``_T`` (never built: see
    :func:`_take`, which hands over aiohttp's own descriptor)."""

    @overload
    def __get__(self, instance: None, owner: type) -> Slot[_T]: ...
    @overload
    def __get__(self, instance: object, owner: type | None = None) -> _T: ...
    def __get__(self, instance: object, owner: type | None = None) -> Slot[_T] | _T:
        raise NotImplementedError

    def __set__(self, instance: object, value: _T) -> None:
        raise NotImplementedError


def _take(internal: Internal) -> Any:
    """The object Python finds for ``internal`` (a slot's descriptor, a class), or a stand-in."""
    owner = internal.owner
    if isinstance(owner, ModuleType):
        return getattr(owner, internal.name, _Absent(internal))
    for klass in owner.__mro__:
        if internal.name in vars(klass):
            return vars(klass)[internal.name]
    return _Absent(internal)


_LOOP = Internal(
    BaseProtocol, "_loop", "3.5", "the connection's loop: the clock and timer of the head deadline"
)
_MANAGER = Internal(
    web.RequestHandler,
    "_manager",
    "3.5",
    "set to None on a connection refused at the cap: connection_lost then has nothing to undo",
)
_REQUEST_COUNT = Internal(
    web.RequestHandler,
    "_request_count",
    "3.5",
    "requests parsed so far: a read that completed a head stops the head clock",
)
_MESSAGES = Internal(
    web.RequestHandler,
    "_messages",
    "3.5",
    "parsed requests waiting in line, (RawRequestMessage | _ErrInfo, StreamReader) each: "
    "a request that is not HTTP/1.x is replaced by an _ErrInfo in its place",
)
_REQUEST_IN_PROGRESS = Internal(
    web.RequestHandler,
    "_request_in_progress",
    "3.11",
    "a request is being handled: the head clock only runs on an idle connection",
)
_SITE_RUNNER = Internal(
    web.BaseSite, "_runner", "3.8", "the runner whose web.Server makes the site's handlers"
)
_SITE_BACKLOG = Internal(web.BaseSite, "_backlog", "3.8", "the listen backlog the site was given")
_SITE_SERVER = Internal(
    web.BaseSite, "_server", "3.8", "the site's asyncio server, which BaseSite.stop() closes"
)
_ERR_INFO = Internal(
    web_protocol,
    "_ErrInfo",
    "3.9",
    "aiohttp's queued form of 'the parser rejected this message', ErrInfo(status, exc, "
    "message): put in a request's place, it is answered by handle_error in turn",
)
_BAD_HTTP_MESSAGE = Internal(
    http_exceptions,
    "BadHttpMessage",
    "3.5",
    "the parser's rejection of a message (its text says 'too many headers' for that case); "
    "also built for a request that is not HTTP/1.x",
)
_LINE_TOO_LONG = Internal(
    http_exceptions, "LineTooLong", "3.5", "the parser's rejection of an oversized line: a 431"
)
_SEND_HEADERS_IMMEDIATELY = Internal(
    web.StreamResponse,
    "_send_headers_immediately",
    "3.12",
    "False holds a stream's headers until its first write, so they leave together",
    required=False,
)

#: Every name taken from aiohttp here, for :func:`missing` and the tests.
INTERNALS = (
    _LOOP,
    _MANAGER,
    _REQUEST_COUNT,
    _MESSAGES,
    _REQUEST_IN_PROGRESS,
    _SITE_RUNNER,
    _SITE_BACKLOG,
    _SITE_SERVER,
    _ERR_INFO,
    _BAD_HTTP_MESSAGE,
    _LINE_TOO_LONG,
    _SEND_HEADERS_IMMEDIATELY,
)

if not TYPE_CHECKING:
    ErrInfo = _take(_ERR_INFO)
    BadHttpMessage = _take(_BAD_HTTP_MESSAGE)
    LineTooLong = _take(_LINE_TOO_LONG)


def missing() -> list[Internal]:
    """The names Prism needs that the installed aiohttp lacks (optional ones left out)."""
    return [internal for internal in INTERNALS if internal.required and not internal.present()]


def require() -> None:
    """Raise :class:`AiohttpInternalMissing` naming every needed name aiohttp lacks."""
    lacking = missing()
    if lacking:
        raise AiohttpInternalMissing(lacking)


class HandlerInternals(web.RequestHandler):
    """aiohttp's connection handler, with its private state under public names.

    Each is aiohttp's own descriptor (see the module's docstring); the
    names say they are aiohttp's, so that no future public name of its own
    is shadowed.
    """

    __slots__ = ()

    aio_loop: Slot[asyncio.AbstractEventLoop] = _take(_LOOP)
    aio_manager: Slot[web.Server | None] = _take(_MANAGER)
    aio_request_count: Slot[int] = _take(_REQUEST_COUNT)
    aio_messages: Slot[collections.deque[tuple[RawRequestMessage | ErrInfo, StreamReader]]] = (
        _take(_MESSAGES)
    )
    aio_request_in_progress: Slot[bool] = _take(_REQUEST_IN_PROGRESS)


class SiteInternals(web.BaseSite):
    """aiohttp's site, with the private state a site serving its own sockets sets."""

    __slots__ = ()

    aio_runner: Slot[web.BaseRunner] = _take(_SITE_RUNNER)
    aio_backlog: Slot[int] = _take(_SITE_BACKLOG)
    aio_server: Slot[asyncio.AbstractServer | None] = _take(_SITE_SERVER)


class DeferredHeadersResponse(web.StreamResponse):
    """A stream response whose headers wait for its first body write, to leave with it.

    An aiohttp without the switch sends them on ``prepare``: the same
    answer, in one write more.
    """

    # _SEND_HEADERS_IMMEDIATELY above: StreamResponse reads it when it writes its headers.
    _send_headers_immediately = False
