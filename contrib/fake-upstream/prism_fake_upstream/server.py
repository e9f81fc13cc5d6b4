"""The aiohttp application and the FakeUpstream object tests drive it through."""

from __future__ import annotations

import asyncio
import ssl
import time
from collections.abc import Awaitable, Callable, Iterable, Sequence
from types import TracebackType
from typing import Any
from urllib.parse import quote

import orjson
from aiohttp import web

from .anthropic_wire import anthropic_wire
from .azure_wire import azure_wire
from .bedrock_wire import bedrock_wire
from .clock import FakeClock
from .control import add_control_routes
from .exchange import ClientGone, Exchange, Route, WireFormat
from .faults import Fault
from .gemini_wire import gemini_wire
from .openai_wire import DEFAULT_MODELS, openai_wire
from .recording import MAX_RECORDED, REGISTRY_KEY, Recorded, Registry, ScenarioLog

__all__ = ["FakeUpstream", "build_app"]

Handler = Callable[[web.Request], Awaitable[web.StreamResponse]]

# Long enough for an in-flight answer to finish on stop(), short enough that a
# test with a client parked on a stalled request does not hang at teardown.
_SHUTDOWN_TIMEOUT_S = 0.2
# Benchmarks post big prompts; aiohttp's 1 MiB default would reject them.
_CLIENT_MAX_SIZE = 64 * 1024 * 1024


def _parse_body(raw: bytes) -> Any:
    if not raw:
        return None
    try:
        return orjson.loads(raw)
    except orjson.JSONDecodeError:
        return None


def _peer(request: web.Request) -> tuple[str, int] | None:
    peername = request.transport.get_extra_info("peername") if request.transport else None
    return (peername[0], peername[1]) if peername else None


async def _admit(
    request: web.Request, scenario: str, endpoint: str
) -> tuple[Registry, ScenarioLog, Any]:
    """Read and record the request; returns where it was recorded and its body."""
    registry = request.app[REGISTRY_KEY]
    body = _parse_body(await request.read()) if request.can_read_body else None
    log = registry.log(scenario)
    log.record(
        Recorded(
            scenario=scenario,
            method=request.method,
            path=endpoint,
            headers=request.headers,
            body=body,
            received_at=time.monotonic() if registry.clock is None else registry.clock.now(),
            peer=_peer(request),
        )
    )
    return registry, log, body


def _override_response(ex: Exchange, wire: WireFormat) -> web.Response:
    fault = ex.fault
    if fault.body is None:
        return wire.error_response(fault.status, None, fault.headers)
    raw = fault.body if isinstance(fault.body, bytes) else orjson.dumps(fault.body)
    return web.Response(
        status=fault.status,
        body=raw,
        headers=ex.response_headers({"Content-Type": "application/json"}),
    )


def _endpoint_handler(wire: WireFormat, route: Route) -> Handler:
    templated = "{" in route.endpoint

    async def handle(request: web.Request) -> web.StreamResponse:
        endpoint = route.endpoint.format_map(request.match_info) if templated else route.endpoint
        scenario = request.match_info["scenario"]
        registry, log, body = await _admit(request, scenario, endpoint)
        fault = registry.next_fault(scenario, log)
        ex = Exchange(request, scenario, endpoint, fault, body, registry.clock)
        try:
            async with registry.turn(scenario):
                if fault.stall_s:
                    await ex.pause(fault.stall_s)
                if fault.status != 200 or fault.body is not None:
                    return _override_response(ex, wire)
                return await route.handler(ex)
        except (ClientGone, ConnectionResetError):
            log.dropped += 1
            # Nobody is listening; aiohttp fails to send this and moves on.
            return web.Response()
        except asyncio.CancelledError:
            # aiohttp cancels the handler when the client disconnects (we run
            # with handler_cancellation=True).
            log.dropped += 1
            raise

    return handle


def _unknown_endpoint(wire: WireFormat) -> Handler:
    async def handle(request: web.Request) -> web.StreamResponse:
        # Recorded (a client calling a wrong path is worth seeing in a test)
        # but no Fault is consumed: the script is for real endpoints.
        tail = request.match_info["tail"]
        await _admit(request, request.match_info["scenario"], tail)
        message = f"Invalid URL ({request.method} {request.path})"
        if tail.startswith("v1/"):
            # The Anthropic SDK appends /v1/messages to its base_url itself.
            message += "; an Anthropic client's base_url ends at /s/{scenario}, without /v1"
        return wire.error_response(404, message, {})

    return handle


def _unknown_path(wire: WireFormat) -> Handler:
    async def handle(request: web.Request) -> web.StreamResponse:
        return wire.error_response(
            404,
            f"Invalid URL ({request.method} {request.path}); "
            "use /s/{scenario}/v1/... or /_fake/...",
            {},
        )

    return handle


def build_app(registry: Registry, wires: Sequence[WireFormat]) -> web.Application:
    """An application serving ``wires`` under /s/{scenario}/v1/ plus /_fake/."""
    app = web.Application(client_max_size=_CLIENT_MAX_SIZE)
    app[REGISTRY_KEY] = registry
    for wire in wires:
        for route in wire.routes:
            app.router.add_route(
                route.method, f"/s/{{scenario}}/v1/{route.endpoint}", _endpoint_handler(wire, route)
            )
    add_control_routes(app)
    # Unknown-path errors use the first wire format's error shape.
    app.router.add_route("*", "/s/{scenario}/v1/{tail:.*}", _unknown_endpoint(wires[0]))
    app.router.add_route("*", "/{tail:.*}", _unknown_path(wires[0]))
    return app


def _url_host(host: str) -> str:
    # A wildcard bind address is not something a client can connect to.
    if host in ("", "0.0.0.0"):
        return "127.0.0.1"
    if host == "::":
        return "[::1]"
    return f"[{host}]" if ":" in host else host


class FakeUpstream:
    """A fake model provider; one instance serves any number of scenarios."""

    def __init__(
        self,
        *,
        models: Sequence[str] = DEFAULT_MODELS,
        max_recorded: int = MAX_RECORDED,
        ssl_context: ssl.SSLContext | None = None,
    ) -> None:
        #: Serves https with this server context when given (``url`` says https).
        self.ssl_context = ssl_context
        self._registry = Registry(max_recorded=max_recorded)
        self._app = build_app(
            self._registry,
            [openai_wire(models), anthropic_wire(), bedrock_wire(), gemini_wire(), azure_wire()],
        )
        self._runner: web.AppRunner | None = None
        self._url: str | None = None

    @property
    def app(self) -> web.Application:
        return self._app

    @property
    def clock(self) -> FakeClock | None:
        """What pauses (stalls, token delays, a late end) wait for; None: real time.

        A test gives the gateway's manual clock here too, so that a 30 s
        stall is over when the test advances the clock 30 s, and not before.
        """
        return self._registry.clock

    @clock.setter
    def clock(self, clock: FakeClock | None) -> None:
        self._registry.clock = clock

    async def start(self, host: str = "127.0.0.1", port: int = 0) -> None:
        if self._runner is not None:
            raise RuntimeError("FakeUpstream is already started")
        runner = web.AppRunner(
            self._app,
            access_log=None,
            handler_cancellation=True,
            shutdown_timeout=_SHUTDOWN_TIMEOUT_S,
        )
        await runner.setup()
        try:
            site = web.TCPSite(runner, host, port, ssl_context=self.ssl_context)
            await site.start()
        except BaseException:
            await runner.cleanup()
            raise
        bound_port = runner.addresses[0][1]
        self._runner = runner
        scheme = "http" if self.ssl_context is None else "https"
        self._url = f"{scheme}://{_url_host(host)}:{bound_port}"

    async def stop(self) -> None:
        runner, self._runner, self._url = self._runner, None, None
        if runner is not None:
            await runner.cleanup()

    async def __aenter__(self) -> FakeUpstream:
        await self.start()
        return self

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        await self.stop()

    @property
    def url(self) -> str:
        if self._url is None:
            raise RuntimeError("FakeUpstream is not started")
        return self._url

    def base_url(self, scenario: str) -> str:
        """The base_url of an OpenAI client for ``scenario`` (ends with /v1)."""
        return f"{self.url}/s/{quote(scenario, safe='')}/v1"

    def anthropic_base_url(self, scenario: str) -> str:
        """The base_url of an Anthropic client: no /v1, the SDK adds /v1/messages."""
        return f"{self.url}/s/{quote(scenario, safe='')}"

    def script(self, scenario: str, faults: Iterable[Fault]) -> None:
        """Answer the next requests of ``scenario`` with ``faults``, in order."""
        self._registry.set_script(scenario, faults)

    def hits(self, scenario: str, endpoint: str | None = None) -> int:
        log = self._registry.peek(scenario)
        return 0 if log is None else log.hits_for(endpoint)

    def requests(self, scenario: str) -> list[Recorded]:
        log = self._registry.peek(scenario)
        return [] if log is None else list(log.records)

    def models(self, scenario: str) -> list[str | None]:
        """The ``model`` of each request ``scenario`` received, in order (None when absent)."""
        return [
            record.body.get("model") if isinstance(record.body, dict) else None
            for record in self.requests(scenario)
        ]

    def dropped(self, scenario: str) -> int:
        log = self._registry.peek(scenario)
        return 0 if log is None else log.dropped

    def reset(self) -> None:
        self._registry.reset()
