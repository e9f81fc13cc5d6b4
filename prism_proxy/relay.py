"""Relaying the serving attempt to the caller, settling the call before the answer completes."""

from __future__ import annotations

import asyncio
import logging
import time
from typing import Literal

import attrs
import orjson
from aiohttp import web

from .accounting import checked_usage, estimate
from .call import Call, Endpoint, Outcome, Settlement, Usage
from .dispatch import Served
from .errors import PrismError
from .gateway import Gateway
from .record import prism_headers
from .stream import StreamBroken, UpstreamStream
from .wire import anthropic as anthropic_wire
from .wire import openai as openai_wire
from .wire import wire_for

__all__ = ["error_answer", "relay", "relay_degraded"]

log = logging.getLogger("prism")

_STREAM_HEADERS = {
    "Content-Type": "text/event-stream; charset=utf-8",
    "Cache-Control": "no-cache",
    "X-Accel-Buffering": "no",
}


async def relay(
    gw: Gateway, call: Call, served: Served, request: web.Request
) -> web.StreamResponse:
    call.served = served.attempt
    if served.attempt.outcome is Outcome.EMPTY:
        call.response_headers["x-prism-outcome"] = "empty"
    if served.stream is None:
        return await _relay_body(gw, call, served)
    return await _relay_stream(gw, call, served, served.stream, request)


def error_answer(call: Call, err: PrismError) -> web.Response:
    """An error in the caller's own wire format, with the x-prism headers."""
    response = web.Response(
        status=err.status,
        body=wire_for(call.endpoint).error_body(err),
        content_type="application/json",
        headers=prism_headers(call),
    )
    if err.status == 408:
        response.force_close()  # the rest of a stalled body is not worth waiting for
    return response


async def _relay_body(gw: Gateway, call: Call, served: Served) -> web.Response:
    result = served.result
    served.response.release()
    prepared = served.prepared
    wire = prepared.provider_wire
    usage = checked_usage(
        call,
        served.attempt.binding,
        wire.usage_update(None, result.json),
        wire.answer_chars(result.json),
    )
    settlement = Settlement(_served_outcome(served), 200, served.attempt, usage)
    if not await gw.settle(call, settlement):
        return error_answer(call, _unrecorded(call))
    headers = prism_headers(call)
    if prepared.translated:
        body = orjson.dumps(prepared.translate_body(result.json))
        headers["Content-Type"] = "application/json"
    else:
        body = result.body
        headers["Content-Type"] = served.response.headers.get("Content-Type", "application/json")
    return web.Response(body=body, status=200, headers=headers)


def _unrecorded(call: Call) -> PrismError:
    """The answer could not be accounted for (a ledger commit failed): it is withheld."""
    return PrismError(
        503,
        "settlement_failed",
        "Prism could not record this call, so it withheld the answer; retry "
        f"(request {call.request_id})",
        type="api_error",
        extra={"request_id": call.request_id},
    )


def _late_headers(call: Call, sent: dict[str, str]) -> bytes:
    """Headers set after a stream's headers left (e.g. a cost from settle), as SSE comments.

    SSE clients ignore comment lines, so the answer's format is unchanged;
    a caller that wants them reads ``: x-prism-cost: 0.00042`` before the end.
    """
    late = [
        f": {name}: {value}\n\n"
        for name, value in call.response_headers.items()
        if sent.get(name) != value
    ]
    return "".join(late).encode("latin-1", "replace")


def _served_outcome(served: Served) -> Literal["ok", "empty"]:
    return "empty" if served.attempt.outcome is Outcome.EMPTY else "ok"


def _usage_so_far(call: Call, served: Served, stream: UpstreamStream) -> Usage:
    """What the answer used: as reported, or, for a cut stream, at least what was delivered."""
    reported = stream.usage
    if stream.done or reported is None:
        return checked_usage(call, served.attempt.binding, reported, stream.delivered_chars)
    # Cut short: the report (e.g. Anthropic's message_start) predates most of the output.
    guess = estimate(call, stream.delivered_chars)
    return attrs.evolve(
        reported,
        input_tokens=reported.input_tokens or guess.input_tokens,
        output_tokens=max(reported.output_tokens, guess.output_tokens),
        estimated=True,
    )


async def _relay_stream(
    gw: Gateway, call: Call, served: Served, stream: UpstreamStream, request: web.Request
) -> web.StreamResponse:
    client_wire = wire_for(call.endpoint)
    headers = prism_headers(call)
    headers.update(_STREAM_HEADERS)
    response = web.StreamResponse(status=200, headers=headers)
    sent = dict(call.response_headers)
    try:
        await response.prepare(request)
        broke: str | None = None
        tail = b""
        try:
            while (batch := await stream.next_batch()) is not None:
                if stream.done:
                    # The upstream already finished: this last batch leaves with
                    # the final event, in one write (settling comes between).
                    tail = batch
                    break
                await response.write(batch)
        except StreamBroken as broken:
            broke = broken.reason
        except ConnectionResetError:
            raise
        except Exception as exc:
            # Whatever went wrong mid-answer, the caller gets an explicit end.
            log.exception("relay failed on %s", call.request_id)
            broke = f"relay failed: {type(exc).__name__}"
        if broke is not None:
            stream.close()
            err = PrismError(
                502,
                "upstream_stream_broken",
                f"the stream from {served.attempt.binding.id} broke after the answer started "
                f"({broke}); no other provider was spliced in",
                type="api_error",
                extra={"request_id": call.request_id},
            )
            usage = _usage_so_far(call, served, stream)
            await gw.settle(
                call, Settlement("error", 200, served.attempt, usage, error_code=err.code)
            )
            await response.write_eof(
                tail + _late_headers(call, sent) + client_wire.error_event(err)
            )
            return response
        tail += stream.closing()
        settled = Settlement(
            _served_outcome(served), 200, served.attempt, _usage_so_far(call, served, stream)
        )
        final = client_wire.done_event
        if not await gw.settle(call, settled):
            final = client_wire.error_event(_unrecorded(call))
        await response.write_eof(tail + _late_headers(call, sent) + final)
        await stream.finish()
    except asyncio.CancelledError:
        # The client went away (or shutdown's grace ran out): drop the upstream at once.
        await _abort(gw, call, served, stream)
        raise
    except ConnectionResetError:
        await _abort(gw, call, served, stream)
    return response


async def _abort(gw: Gateway, call: Call, served: Served, stream: UpstreamStream) -> None:
    stream.close()
    usage = _usage_so_far(call, served, stream)
    await gw.settle(call, Settlement("aborted", 499, served.attempt, usage, "client_closed"))


async def relay_degraded(
    gw: Gateway, call: Call, template: str, request: web.Request
) -> web.StreamResponse:
    """The operator's templated answer, served instead of a 504 when the budget ran out.

    Marked ``x-prism-outcome: degraded``; no provider served it, so nothing is billed.
    """
    text = template.replace("{model}", call.model_name).replace("{request_id}", call.request_id)
    call.response_headers["x-prism-outcome"] = "degraded"
    await gw.settle(call, Settlement("error", 200, None, None, "chain_deadline_exceeded"))
    headers = prism_headers(call)
    suffix = call.request_id.removeprefix("req_")
    if call.endpoint is Endpoint.MESSAGES:
        whole = anthropic_wire.message_body("msg_" + suffix, call.model_name, text)
        events = anthropic_wire.message_events("msg_" + suffix, call.model_name, text)
    else:
        created = int(time.time())
        whole = openai_wire.completion_body("chatcmpl-" + suffix, call.model_name, text, created)
        events = openai_wire.completion_events("chatcmpl-" + suffix, call.model_name, text, created)
    if not call.stream:
        headers["Content-Type"] = "application/json"
        return web.Response(body=orjson.dumps(whole), headers=headers)
    headers.update(_STREAM_HEADERS)
    response = web.StreamResponse(headers=headers)
    await response.prepare(request)
    await response.write(events)
    await response.write_eof()
    return response
