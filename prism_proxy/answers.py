"""What a call answers, and the one place it is settled.

Every path of a call (served, passed through, refused, degraded, aborted)
ends by handing back an :class:`Answer` that is not yet finished and carries
its :class:`~prism_proxy.call.Settlement` (built by
:mod:`prism_proxy.settlements`).  :func:`settle` then runs ``prism_settle``
once, and only after that does the answer finish: a body leaves, a stream
gets its final event.  So the ledger row exists before the caller has the
whole answer, and an answer that could not be recorded is withheld.
"""

from __future__ import annotations

import abc
import asyncio
import logging
from typing import Any

import attrs
import orjson
from aiohttp import web

from .aiohttp_internals import DeferredHeadersResponse
from .call import Call, Endpoint, Settlement
from .errors import PrismError
from .generation import Generation
from .record import prism_headers
from .settlements import CLIENT_CLOSED, refused
from .stream import UpstreamStream
from .wire import ANTHROPIC, OPENAI, Wire, wire_for

__all__ = [
    "Answer",
    "BodyAnswer",
    "ErrorAnswer",
    "Hit",
    "StreamAnswer",
    "client_wire",
    "error_response",
    "gone",
    "refusal",
    "settle",
    "unrecorded",
]

log = logging.getLogger("prism")
call_log = logging.getLogger("prism.calls")

STREAM_HEADERS = {
    "Content-Type": "text/event-stream; charset=utf-8",
    "Cache-Control": "no-cache",
    "X-Accel-Buffering": "no",
}


# Enum members bound to names once (why: prism_proxy.call, above Endpoint).
_MODELS = Endpoint.MODELS


def client_wire(request: web.BaseRequest | None, endpoint: Endpoint | None = None) -> Wire:
    """The wire format the caller reads: the one place the shape of an error is chosen.

    A call's endpoint decides (its answers come in that format).  Elsewhere
    (the model list, an unknown path, admin routes, the server's own errors)
    the Anthropic SDK is known by the ``anthropic-version`` header it always
    sends, or a ``/v1/messages`` path; anyone else, and a connection refused
    before a request was read, gets OpenAI's shape.
    """
    if endpoint is not None and endpoint is not _MODELS:
        return wire_for(endpoint)
    if request is not None and (
        "anthropic-version" in request.headers or request.path.startswith("/v1/messages")
    ):
        return ANTHROPIC
    return OPENAI


def error_response(
    err: PrismError,
    *,
    wire: Wire | None = None,
    request: web.BaseRequest | None = None,
    headers: dict[str, str] | None = None,
) -> web.Response:
    """An error as JSON in ``wire``'s shape, else in the shape the caller of
    ``request`` reads (:func:`client_wire`).

    The one way Prism, its admin routes and plugins answer an error.
    """
    if wire is None:
        wire = client_wire(request)
    response = web.Response(
        status=err.status,
        body=wire.error_body(err),
        content_type="application/json",
        headers=headers,
    )
    if err.status in (408, 413):
        response.force_close()  # the rest of a stalled or oversized body is not worth reading
    return response


def unrecorded(call: Call) -> PrismError:
    """The answer could not be accounted for (a ledger commit failed): it is withheld."""
    return PrismError(
        503,
        "settlement_failed",
        "Prism could not record this call, so it withheld the answer; retry "
        f"(request {call.request_id})",
        type="api_error",
        extra={"request_id": call.request_id},
    )


@attrs.define(eq=False)
class Answer(abc.ABC):
    """An answer decided but not finished: it leaves once the call is settled.

    It cannot be made without its settlement: a path that answers has said how the call ended.
    """

    #: How the call ended, handed to ``prism_settle`` before the answer finishes.
    settlement: Settlement = attrs.field(kw_only=True)

    @abc.abstractmethod
    async def finish(self, call: Call, recorded: bool) -> web.StreamResponse:
        """Send what is left; ``recorded`` false means the settlement failed."""


@attrs.define(eq=False)
class ErrorAnswer(Answer):
    error: PrismError

    async def finish(self, call: Call, recorded: bool) -> web.StreamResponse:
        wire = client_wire(call.request, call.endpoint)
        return error_response(self.error, wire=wire, headers=prism_headers(call))


@attrs.frozen(kw_only=True)
class Hit:
    """A stored answer a plugin serves instead of dispatching the call (``prism_lookup``).

    ``body`` is the answer in the caller's wire: the whole body, or for a
    streaming call the stream's events, written at once, and ``tail`` the
    events written after the call is settled, before the wire's own final
    event (which the core writes: never include it).  ``settlement`` says
    how the call ended (``outcome="cached"``); its ``served`` attempt names
    the line that made the answer (``x-prism-provider``, ``x-prism-model``)
    and is what billing prices.
    """

    body: bytes
    settlement: Settlement
    tail: bytes = b""
    content_type: str = "application/json"


def refusal(err: PrismError) -> ErrorAnswer:
    """``err`` as the answer, settled as refused: nothing was served."""
    return ErrorAnswer(err, settlement=refused(err))


def gone(settlement: Settlement) -> ErrorAnswer:
    """The caller closed the connection while its answer was being written, before
    aiohttp noticed and cancelled the call: nothing is left to send (aiohttp drops
    the connection quietly); ``settlement`` says what was delivered."""
    err = PrismError(
        499, CLIENT_CLOSED, "the caller closed the connection before its answer was written"
    )
    return ErrorAnswer(err, settlement=settlement)


@attrs.define(eq=False)
class BodyAnswer(Answer):
    """A whole body: served, passed through, or the operator's degraded answer."""

    body: bytes
    status: int = 200
    content_type: str = "application/json"
    #: Whether it may leave although the call could not be recorded (nothing billable).
    unbilled: bool = False

    async def finish(self, call: Call, recorded: bool) -> web.StreamResponse:
        if not recorded and not self.unbilled:
            withheld = ErrorAnswer(unrecorded(call), settlement=self.settlement)
            return await withheld.finish(call, recorded)
        headers = prism_headers(call)
        headers["Content-Type"] = self.content_type
        return web.Response(body=self.body, status=self.status, headers=headers)


@attrs.define(eq=False)
class StreamAnswer(Answer):
    """A stream whose events have gone out, all but its final one."""

    response: web.StreamResponse
    #: Headers as they left at the commit point; later ones go out as SSE comments.
    sent: dict[str, str]
    tail: bytes
    #: The final event, when it is not the wire's own end (a broken stream's error event).
    final: bytes | None = None
    upstream: UpstreamStream | None = None
    #: Whether it may end normally although the call could not be recorded (nothing billable).
    unbilled: bool = False

    async def finish(self, call: Call, recorded: bool) -> web.StreamResponse:
        wire = wire_for(call.endpoint)
        final = self.final
        if final is None:
            ended = recorded or self.unbilled
            final = wire.done_event if ended else wire.error_event(unrecorded(call))
        await self.response.write_eof(self.tail + _late_headers(call, self.sent) + final)
        if self.upstream is not None:
            await self.upstream.finish()
        return self.response


def _late_headers(call: Call, sent: dict[str, str]) -> bytes:
    """Headers set after a stream's headers left (e.g. a cost from settle), as SSE comments.

    SSE clients ignore comment lines, so the answer's format is unchanged;
    a caller that wants them reads ``: x-prism-cost: 0.00042`` before the end.
    """
    late = ""
    for name, value in call.response_headers.items():
        if sent.get(name) != value:
            late += f": {name}: {value}\n\n"
    return late.encode("latin-1", "replace")


def stream_response(call: Call) -> tuple[web.StreamResponse, dict[str, str]]:
    """A stream's response with the x-prism headers known at its commit point."""
    headers = prism_headers(call)
    headers.update(STREAM_HEADERS)
    # Its headers leave with the first events, in one write: a relay prepares
    # only at its commit point, with those events in hand and written next.
    return DeferredHeadersResponse(status=200, headers=headers), dict(call.response_headers)


def access_fields(generation: Generation, call: Call, settlement: Settlement) -> dict[str, Any]:
    """The access line's fields (the JSON log writes them as they are): never prompt
    text, keys or upstream bodies; plugins add theirs in ``call.access``."""
    served = settlement.served
    binding = served.binding if served is not None else None
    usage = settlement.usage
    first_byte = served.first_byte_ms if served is not None else None
    return {
        "request_id": call.request_id,
        "endpoint": str(call.endpoint),
        "model": call.model_name or None,
        "route": call.route.name if call.route is not None else None,
        "provider": binding.provider if binding else None,
        "upstream_model": binding.model if binding else None,
        "region": binding.region if binding else None,
        "org": call.principal.org,
        "key_id": call.principal.key_id,
        "status": settlement.status,
        "outcome": settlement.outcome,
        "code": settlement.error_code,
        "attempts": len(call.attempts),
        "ttft_ms": None if first_byte is None else round(first_byte),
        "finish_reason": served.finish_reason if served is not None else None,
        "duration_ms": round((generation.clock() - call.received_at) * 1000),
        "input_tokens": usage.input_tokens if usage else None,
        "output_tokens": usage.output_tokens if usage else None,
        **call.access,
    }


def json_body(value: object) -> bytes:
    return orjson.dumps(value)


async def settle(generation: Generation, call: Call, settlement: Settlement) -> bool:
    """Run ``prism_settle`` for ``settlement`` and write the call's access log line.

    Called once per call, by the endpoint, on every path.  Returns False
    when an implementation failed (its awaitable raised): the answer is then
    withheld where it could be billed.
    """
    recorded = True
    settle_hook = generation.hooks.settle
    if settle_hook is not None:
        try:
            pending = settle_hook(call=call, settlement=settlement)  # awaitables
            if pending:
                # Shielded: a client leaving must not cut a ledger commit in half.
                work = pending[0] if len(pending) == 1 else asyncio.gather(*pending)
                await asyncio.shield(work)
        except Exception as exc:
            # An outage (a ledger unreachable) fails many calls alike: one line each,
            # the traceback only when debugging.
            log.error(
                "prism_settle failed for %s: %s: %s",
                call.request_id,
                type(exc).__name__,
                exc,
                exc_info=log.isEnabledFor(logging.DEBUG),
            )
            recorded = False
    callbacks = call.settled_callbacks
    if callbacks is not None:
        call.settled_callbacks = None
        for callback in callbacks:
            try:
                callback(recorded)
            except Exception:
                log.exception("a when_settled callback failed for %s", call.request_id)
    if call_log.isEnabledFor(logging.INFO):
        fields = access_fields(generation, call, settlement)
        call_log.info(
            "%s %s model=%r route=%s served=%s region=%s org=%s key=%s status=%s outcome=%s "
            "code=%s attempts=%d ms=%d",
            call.request_id,
            call.endpoint,
            call.model_name or "-",
            fields["route"] or "-",
            f"{fields['provider']}/{fields['upstream_model']}" if settlement.served else "-",
            fields["region"] or "-",
            fields["org"] or "-",
            fields["key_id"] or "-",
            settlement.status,
            settlement.outcome,
            settlement.error_code or "-",
            fields["attempts"],
            fields["duration_ms"],
            extra={"access": fields},
        )
    return recorded
