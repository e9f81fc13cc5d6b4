"""Relaying the serving attempt to the caller, up to (not including) its last bytes.

The relay returns an unfinished :class:`~prism_proxy.answers.Answer`
carrying the call's settlement: the endpoint settles the call, then the
answer's last bytes leave.  A stream cancelled mid-answer raises
:class:`~prism_proxy.settlements.Abandoned`, carrying what was delivered.
"""

from __future__ import annotations

import asyncio
import logging

import attrs

from . import settlements
from .accounting import checked_usage, estimate
from .answers import Answer, BodyAnswer, Hit, StreamAnswer, gone, json_body, stream_response
from .call import Attempt, Call, Outcome, Settlement, Usage
from .classification import content_filtered
from .dispatch import Served
from .errors import PrismError
from .stream import StreamBroken, UpstreamStream
from .wire import wire_for

__all__ = ["degraded", "relay"]

log = logging.getLogger("prism")
# Enum members bound to names once (why: prism_proxy.call, above Endpoint).
_EMPTY, _FILTERED = Outcome.EMPTY, Outcome.CONTENT_FILTERED


async def relay(call: Call, served: Served | Hit) -> Answer:
    if isinstance(served, Hit):
        return await _replay(call, served)
    call.served = served.attempt
    if served.attempt.outcome is _EMPTY:
        call.response_headers["x-prism-outcome"] = "empty"
    elif served.attempt.outcome is _FILTERED:
        call.response_headers["x-prism-outcome"] = "content_filtered"
    if served.stream is None:
        return _relay_body(call, served)
    return await _relay_stream(call, served, served.stream)


def _relay_body(call: Call, served: Served) -> Answer:
    result = served.result
    served.response.release()
    prepared = served.prepared
    wire = prepared.provider_wire
    usage = checked_usage(
        call, served, wire.usage_update(None, result.json), wire.answer_chars(result.json)
    )
    served.attempt.finish_reason = wire.finish_reason(result.json)
    settlement = settlements.served(served.attempt, usage)
    if prepared.translated:
        body = json_body(prepared.translate_body(result.json))
        return BodyAnswer(body, settlement=_kept(call, settlement, body))
    content_type = served.response.headers.get("Content-Type", "application/json")
    return BodyAnswer(
        result.body, content_type=content_type, settlement=_kept(call, settlement, result.body)
    )


def _kept(call: Call, settlement: Settlement, answer: bytes) -> Settlement:
    """``settlement`` with the answer as the caller gets it, when a plugin asked for it."""
    if call.keep_answer and len(answer) <= call.keep_answer:
        return attrs.evolve(settlement, answer=answer)
    return settlement


async def _replay(call: Call, hit: Hit) -> Answer:
    """A plugin's stored answer (``prism_lookup``), sent as a served one is."""
    call.served = hit.settlement.served
    if not call.stream:
        return BodyAnswer(hit.body, content_type=hit.content_type, settlement=hit.settlement)
    response, sent = stream_response(call)
    await response.prepare(call.request)
    await response.write(hit.body)
    return StreamAnswer(response, sent, hit.tail, settlement=hit.settlement)


def _finished(served: Served, stream: UpstreamStream) -> Attempt:
    """The serving attempt, with why its stream ended (if it said)."""
    attempt = served.attempt
    attempt.finish_reason = stream.finish_reason
    if stream.finish_reason in stream.wire.filtered and attempt.outcome is not _FILTERED:
        # Cut after the commit point: too late to fall back or flag the headers,
        # but recorded as what it was (settlement, ledger), never as a success.
        attempt.verdict = content_filtered(f"finish_reason {stream.finish_reason} after content")
    return attempt


def _usage_so_far(call: Call, served: Served, stream: UpstreamStream) -> Usage:
    """What the answer used: as reported, or, for a cut stream, at least what was delivered."""
    reported = stream.usage
    if stream.done or reported is None:
        return checked_usage(call, served, reported, stream.delivered_chars)
    # Cut short: the report (e.g. Anthropic's message_start) predates most of the output.
    guess = estimate(call, stream.delivered_chars)
    return attrs.evolve(
        reported,
        input_tokens=reported.input_tokens or guess.input_tokens,
        output_tokens=max(reported.output_tokens, guess.output_tokens),
        estimated=True,
    )


async def _relay_stream(call: Call, served: Served, stream: UpstreamStream) -> Answer:
    response, sent = stream_response(call)
    try:
        await response.prepare(call.request)
        transport = call.request.transport
        if transport is None or transport.is_closing():
            # The headers wait for the first events (one write), so nothing has
            # tried the connection yet: a caller already gone is found here.
            raise ConnectionResetError("the caller closed the connection")
        broke: str | None = None
        tail = b""
        # What a plugin asked to keep of the answer (``Call.keep_answer``); None: nothing.
        kept: list[bytes] | None = [] if call.keep_answer else None
        room = call.keep_answer
        try:
            while (batch := await stream.next_batch()) is not None:
                if stream.done:
                    # The upstream already finished: this last batch leaves with
                    # the final event, in one write (settling comes between).
                    tail = batch
                    break
                await response.write(batch)
                if kept is not None:
                    kept.append(batch)
                    room -= len(batch)
                    if room < 0:
                        kept = None  # longer than asked for: nothing is kept
        except StreamBroken as broken:
            broke = broken.reason
        except ConnectionResetError:
            raise
        except Exception as exc:
            # Whatever went wrong mid-answer, the caller gets an explicit end.
            log.exception("relay failed on %s", call.request_id)
            broke = f"relay failed: {type(exc).__name__}"
    except (asyncio.CancelledError, ConnectionResetError) as left:
        # The client went away (or shutdown's grace ran out): drop the upstream at once.
        stream.close()
        settlement = settlements.aborted(
            _finished(served, stream), _usage_so_far(call, served, stream)
        )
        if isinstance(left, ConnectionResetError):
            return gone(settlement)
        raise settlements.Abandoned(settlement) from left
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
        settlement = settlements.broken(
            _finished(served, stream), _usage_so_far(call, served, stream), err
        )
        # A translator that numbers its events (Responses) writes the end in sequence.
        translator = stream.translator
        final = translator.failed(err) if translator is not None else None
        if final is None:
            final = wire_for(call.endpoint).error_event(err)
        return StreamAnswer(response, sent, tail, final=final, settlement=settlement)
    settlement = settlements.served(_finished(served, stream), _usage_so_far(call, served, stream))
    tail += stream.closing()
    if kept is not None:
        kept.append(tail)
        settlement = _kept(call, settlement, b"".join(kept))
    return StreamAnswer(response, sent, tail, upstream=stream, settlement=settlement)


async def degraded(call: Call, template: str, err: PrismError) -> Answer:
    """The operator's templated answer, served instead of ``err`` (a 504) when the budget ran out.

    Marked ``x-prism-outcome: degraded``; no provider served it, so nothing is billed.
    """
    text = template.replace("{model}", call.model_name).replace("{request_id}", call.request_id)
    call.response_headers["x-prism-outcome"] = "degraded"
    settlement = settlements.degraded(err)
    suffix = call.request_id.removeprefix("req_")
    wire = wire_for(call.endpoint)
    if not call.stream:
        whole = wire.degraded_body(suffix, call.model_name, text)
        return BodyAnswer(json_body(whole), unbilled=True, settlement=settlement)
    response, sent = stream_response(call)
    await response.prepare(call.request)
    # The whole stream is the answer; the wire's own end closes it.
    events = wire.degraded_events(suffix, call.model_name, text)
    tail = events.removesuffix(wire.done_event)
    return StreamAnswer(response, sent, tail, unbilled=True, settlement=settlement)
