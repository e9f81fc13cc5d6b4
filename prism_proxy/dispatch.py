"""The dispatch loop: try the route's bindings, classify each attempt, decide what next.

Every endpoint, streaming or not, goes through :func:`dispatch`.  It returns
the attempt that will serve, or raises an error carrying the record of
everything tried.  The decisions (the README's "What happens on failure"):

- ``ok`` serves; ``empty`` serves unless the model says ``empty = "fallback"``;
- ``content_filtered`` (an answer whose finish reason is in the provider wire's
  ``filtered``, whatever a classifier said; or a prompt a classifier says a
  content filter refused) follows the same policy: a filtered answer is served
  flagged, a refused prompt is a 400 ``content_filtered``, or, with
  ``empty = "fallback"``, the next line is tried; never retried on the same line;
- ``request_error`` returns the upstream's answer unchanged (no retry, no fallback);
- a connect that fails because the gateway is out of files or memory is
  ``cancelled`` with code ``gateway_out_of_resources``, whatever a classifier
  would say: no retry, nothing learnt of the upstream, the next binding tried;
- so is a provider's ``send`` failing with anything but a connection error
  (the gateway's own failure, code ``internal_error``): a request it could not
  build or encode never reached the upstream, so it is no evidence against it;
- ``permanent`` moves to the next binding at once;
- ``transient``, ``rate_limited`` and ``broken_stream`` retry the same binding
  up to ``retries`` times, waiting as Retry-After asks or with jittered backoff;
- ``timeout`` retries the same binding at most once, and not at all when the
  caller set a timeout below the server default;
- one budget covers every try of every binding: no attempt starts with less
  than :data:`MIN_ATTEMPT_S` left, no wait is taken that would leave less, and
  an attempt's timeout never outlasts the budget;
- a spent chain moves to ``fallback_models`` (another tier) only when
  cross-tier fallback is switched on; a pinned binding gets exactly one attempt;
- a context-length refusal moves on, for a model with ``context_fallback``,
  to the next line whose ``max_context_tokens`` is larger (else it is a
  request error like any other);
- a conversation carrying signed reasoning skips the lines of other provider
  families (``signed_reasoning``);
- a structured output on a line that expresses it as a forced tool is held
  until the answer is whole, and served only when it matches its schema.
"""

from __future__ import annotations

import asyncio
import errno
import logging

import aiohttp
import attrs

from .answers import Hit
from .backoff import Backoff
from .call import (
    SERVING_OUTCOMES,
    Attempt,
    Call,
    Endpoint,
    Outcome,
    Route,
    Skip,
    UpstreamResult,
    Verdict,
)
from .capacity import Slots
from .catalog import Binding, ModelSpec
from .classification import CONTENT_FILTERED, content_filtered, is_context_refusal
from .compat import Prepared, Untranslatable, prepare
from .errors import PrismError
from .gate import Incompatible, check_line, check_signed, reasoning_signer
from .generation import Generation
from .providers import UpstreamResponse
from .record import attempt_record
from .stream import UpstreamStream
from .structured import hold, structured
from .wire import wire_for
from .wire.translate_response import answer_schema

__all__ = ["ChainDeadline", "PassThrough", "Served", "dispatch", "exhausted"]

log = logging.getLogger("prism")

#: The shortest attempt worth starting: the smallest timeout a caller may ask for.
MIN_ATTEMPT_S = 1.0

_CONNECTION_ERRORS = (aiohttp.ClientError, OSError)
#: What a connect fails with when the gateway itself is short of files or memory.
_GATEWAY_SHORT = frozenset({errno.EMFILE, errno.ENFILE, errno.ENOBUFS, errno.ENOMEM})
_RETRYABLE = frozenset(
    {Outcome.TRANSIENT, Outcome.RATE_LIMITED, Outcome.TIMEOUT, Outcome.BROKEN_STREAM}
)
# Enum members bound to names once (why: prism_proxy.call, above Endpoint).
_EMPTY, _OK, _FILTERED = Outcome.EMPTY, Outcome.OK, Outcome.CONTENT_FILTERED
#: The code of a failure that is the gateway's own, as for any other it did not expect.
INTERNAL_ERROR = "internal_error"
_GATEWAY_FAILED = Verdict(
    Outcome.CANCELLED, "the gateway failed before sending", code=INTERNAL_ERROR
)


@attrs.define(eq=False)
class Served:
    """The attempt that answers the caller, with its still-open upstream response."""

    attempt: Attempt
    response: UpstreamResponse
    result: UpstreamResult
    stream: UpstreamStream | None
    prepared: Prepared

    def discard(self) -> None:
        if self.stream is None:
            self.response.release()
        else:
            self.stream.close()


class PassThrough(Exception):
    """The request itself was at fault: the caller gets the upstream's answer unchanged."""

    def __init__(self, attempt: Attempt, result: UpstreamResult) -> None:
        super().__init__(f"upstream rejected the request ({result.status})")
        self.attempt = attempt
        self.result = result


class ChainDeadline(PrismError):
    """The call budget ran out before any binding served (504)."""


class _BudgetSpent(Exception):
    pass


async def dispatch(gen: Generation, call: Call) -> Served | Hit:
    """Serve ``call`` from its route, then (if allowed) from its cross-tier fallbacks;
    or from a plugin's store (``prism_lookup``), without an attempt."""
    model = call.model
    assert model is not None and call.route is not None
    lookup = gen.hooks.lookup
    if lookup is not None:
        found = lookup(call=call)
        if found is not None:
            hit = found if isinstance(found, Hit) else await found
            if hit is not None:
                return hit
    config = gen.config
    budget_ms = model.call_budget_ms or config.call_budget_ms
    walk = _Walk(gen, call, call.received_at + budget_ms / 1000)
    if call.model_name != model.name and not model.pinned:
        # An alias: the answer says what the caller asked for, as well as what served.
        call.response_headers["x-prism-model-requested"] = call.model_name
    try:
        served = await walk.route(call.route, model)
        if served is not None:
            return served
        if walk.context_refused is not None and call.attempts[-1] is walk.context_refused[0]:
            # No line with a larger context was left: the refusal, as the upstream gave it.
            raise PassThrough(*walk.context_refused)
        cross_tier = model.cross_tier_fallback
        if cross_tier is None:
            cross_tier = config.cross_tier_fallback
        if cross_tier == "caller":
            cross_tier = caller_allows_fallback(call)
        if cross_tier and call.route.cross_tier and not model.pinned:
            for name in model.fallback_models:
                fallback = gen.catalog.models[name]
                select = gen.hooks.select_route
                route: Route | None = select(call=call, model=fallback) if select else None
                if route is None:
                    continue
                call.record.append(
                    Skip("note", f"cross-tier fallback to {name} (tier {fallback.tier})")
                )
                call.response_headers["x-prism-fallback"] = "cross-tier"
                served = await walk.route(route, fallback)
                if served is not None:
                    return served
    except _BudgetSpent:
        gen.counters["chain_exceeded_max_time"] += 1
        gen.telemetry.count("prism_chain_exceeded_max_time_total", model=model.name)
        raise exhausted(call, status=504, code="chain_deadline_exceeded") from None
    if not call.attempts and walk.incompatible:
        reasons = "; ".join(f"{binding_id}: {why}" for binding_id, why in walk.incompatible)
        raise PrismError(
            400,
            "no_compatible_binding",
            f"no binding of model '{model.name}' can express this request ({reasons})",
            extra={"request_id": call.request_id, "attempts": attempt_record(call)},
        )
    raise exhausted(call)


#: A caller opts in to cross-tier fallback (for models that leave it to the caller).
FALLBACK_HEADER = "x-prism-fallback"


def caller_allows_fallback(call: Call) -> bool:
    return call.request.headers.get(FALLBACK_HEADER, "").strip().lower() == "allow"


@attrs.define(eq=False)
class _Walk:
    gen: Generation
    call: Call
    deadline: float
    #: Bindings skipped because they cannot express the request, with why.
    incompatible: list[tuple[str, str]] = attrs.field(factory=list)
    #: The context-length refusal that moved the call on (``context_fallback``), and
    #: the refusing line's ``max_context_tokens`` (0: it declared none).
    context_refused: tuple[Attempt, UpstreamResult] | None = None
    context_floor: int = 0
    #: The provider family that signed the history's reasoning ("": none; None: not
    #: looked yet, which only a line of another wire than the caller's makes us do).
    signer: str | None = None

    def _signer(self) -> str:
        if self.signer is None:
            self.signer = reasoning_signer(self.call)
        return self.signer

    async def route(self, route: Route, model: ModelSpec) -> Served | None:
        record = self.call.record
        if route.skipped:
            record.extend(Skip("skipped", reason, binding) for binding, reason in route.skipped)
        if route.notes:
            record.extend(Skip("note", note) for note in route.notes)
        # Compatibility is settled for the whole route before its first attempt.
        ready = []
        client_wire = wire_for(self.call.endpoint).name
        for binding in route.bindings:
            try:
                check_line(self.call, binding)
                provider = self.gen.providers[binding.provider]
                if provider.wire != client_wire and self._signer():
                    check_signed(self.signer or "", provider.wire)
                ready.append((binding, prepare(self.call, binding, provider, self.gen.wires)))
            except Incompatible as why:
                record.append(Skip("skipped", str(why), binding))
                self.incompatible.append((binding.id, str(why)))
            except Untranslatable as why:
                # Reasons may quote the caller's input: bounded, they fit a header.
                reason = str(why)[:120]
                record.append(Skip("skipped", f"cannot express {reason}", binding))
                self.incompatible.append((binding.id, reason))
        for binding, prepared in ready:
            if self.context_refused is not None and not self._larger(binding):
                continue
            served = await self.binding(binding, model, prepared)
            if served is not None:
                return served
        return None

    def _larger(self, binding: Binding) -> bool:
        """Whether ``binding`` may take a prompt a smaller line refused (recorded if not)."""
        size = binding.options.get("max_context_tokens")
        if size is not None and size > self.context_floor:
            return True
        floor = self.context_floor or "unknown"
        self.call.record.append(
            Skip("skipped", f"context_fallback: context {size or '?'} not above {floor}", binding)
        )
        return False

    async def _slot(self, binding: Binding, slots: Slots) -> bool:
        """A capacity slot on ``binding`` now, or after queueing as its ``queue_ms`` allows."""
        queue_s = binding.options.get("queue_ms", 0) / 1000
        # Never queue past what the budget needs left for the attempt itself.
        room = self.deadline - self.gen.clock() - MIN_ATTEMPT_S
        return await slots.acquire(min(queue_s, room))

    async def binding(
        self, binding: Binding, model: ModelSpec, prepared: Prepared
    ) -> Served | None:
        gen, call = self.gen, self.call
        config = gen.config
        retries = model.retries if model.retries is not None else config.retries
        attempt_timeout = call.attempt_timeout_s
        tries = 0
        timed_out_before = False
        slots = gen.capacity.for_line(binding)
        while True:
            remaining = self.deadline - gen.clock()
            if remaining < MIN_ATTEMPT_S:
                raise _BudgetSpent
            if slots is not None and not await self._slot(binding, slots):
                call.record.append(Skip("skipped", f"full ({slots.limit} in flight)", binding))
                return None
            admit = gen.hooks.admit_attempt
            veto = admit(call=call, binding=binding) if admit is not None else None
            if veto is not None and not isinstance(veto, str):
                veto = await veto  # an answer that needed shared state
            if veto is not None:
                if slots is not None:
                    slots.give_back()
                call.record.append(Skip("vetoed", veto, binding))
                return None
            remaining = self.deadline - gen.clock()  # a queue wait may have spent some
            timeout = remaining if attempt_timeout is None else min(attempt_timeout, remaining)
            try:
                served, attempt, result = await _attempt(gen, call, binding, timeout, prepared)
            except BaseException:
                if slots is not None:
                    slots.give_back()
                raise
            verdict = attempt.verdict
            assert verdict is not None
            outcome = verdict.outcome
            passed = (outcome is _EMPTY or outcome is _FILTERED) and model.empty == "fallback"
            if served is not None and not passed:
                if slots is not None:
                    call.slot = slots  # held until the answer ends
                return served
            if slots is not None:
                slots.give_back()
            if served is not None:
                served.discard()
                return None
            if outcome is _FILTERED:
                # A refused prompt: nothing to serve, and the same prompt would be refused again.
                if passed:
                    return None
                raise filtered_refusal(call, attempt)
            if verdict.outcome is Outcome.REQUEST_ERROR:
                if model.context_fallback and is_context_refusal(result):
                    self.context_refused = (attempt, result)
                    self.context_floor = binding.options.get("max_context_tokens") or 0
                    call.record.append(
                        Skip("note", f"context_fallback: {binding.id} refused the prompt's size")
                    )
                    call.response_headers["x-prism-fallback"] = "context"
                    return None
                raise PassThrough(attempt, result)
            if verdict.outcome is Outcome.TIMEOUT and timeout < (attempt_timeout or float("inf")):
                raise _BudgetSpent  # the budget, not the attempt timeout, cut this attempt
            if verdict.outcome not in _RETRYABLE or tries >= retries:
                return None
            if verdict.outcome is Outcome.TIMEOUT:
                if timed_out_before or not call.timeout_retry:
                    return None
                timed_out_before = True
            wait = verdict.retry_after_s
            if wait is None:
                backoff = Backoff(config.backoff_base_ms / 1000, config.backoff_cap_ms / 1000)
                wait = backoff.delay(tries, gen.random)
            if gen.clock() + wait + MIN_ATTEMPT_S > self.deadline:
                # Waiting would not leave room for another attempt: move on now.
                return None
            await gen.sleep(wait)
            tries += 1


async def _attempt(
    gen: Generation, call: Call, binding: Binding, timeout: float, prepared: Prepared
) -> tuple[Served | None, Attempt, UpstreamResult]:
    provider = gen.providers[binding.provider]
    # A structured output the line takes as a forced tool (translated lines only).
    schema = answer_schema(prepared.body) if prepared.translation is not None else None
    attempt = call.new_attempt(binding, gen.clock())
    attempt.params_adjusted = list(prepared.adjusted)
    attempt.sent_as = prepared.sent_as
    attempt_start = gen.hooks.attempt_start
    if attempt_start is not None:
        attempt_start(call=call, attempt=attempt)
    response: UpstreamResponse | None = None
    stream: UpstreamStream | None = None
    own_failure: Verdict | None = None
    #: The finish reason by which a content filter cut the answer, if one did.
    cut: str | None = None
    try:
        try:
            with gen.deadlines.within(timeout):
                response = await provider.send(call, binding, prepared.endpoint, prepared.body)
                attempt.status = response.status
                held: str | None = None
                if schema is not None and response.status == 200 and call.stream:
                    response, held = await hold(response, schema)
                if held is not None:
                    result = UpstreamResult(
                        200, response.headers, streaming=True, wire=provider.wire, malformed=held
                    )
                elif response.status == 200 and call.stream:
                    stream = UpstreamStream(
                        response,
                        wire=prepared.provider_wire,
                        forward_usage=call.include_usage,
                        clock=gen.time,
                        translator=prepared.stream_translator(call.include_usage),
                        idle_timeout=call.attempt_timeout_s,
                    )
                    data, payload, broken = await stream.until_commit()
                    result = UpstreamResult(
                        200,
                        response.headers,
                        data or b"",
                        stream_broken=broken,
                        streaming=True,
                        wire=provider.wire,
                        plain_commit=stream.plain_commit,
                    )
                    if not stream.plain_commit:
                        result.json = payload  # parsed already: classifiers need not again
                    result.malformed = stream.invalid
                    # Only a cut before any text is seen here; a later one, at the end (relay).
                    if stream.finish_reason in prepared.provider_wire.filtered:
                        cut = stream.finish_reason
                else:
                    body = await response.read()
                    result = UpstreamResult(
                        response.status, response.headers, body, wire=provider.wire
                    )
                    if response.status == 200:
                        result.malformed = prepared.provider_wire.answer_problem(
                            prepared.endpoint, result.json
                        )
                        if schema is not None and result.malformed is None:
                            result = structured(result, schema)
                        if result.malformed is None and prepared.provider_wire.filtered:
                            finish = prepared.provider_wire.finish_reason(result.json)
                            if finish in prepared.provider_wire.filtered:
                                cut = finish
        except TimeoutError:
            result = UpstreamResult(attempt.status, timed_out=True, wire=provider.wire)
        except _CONNECTION_ERRORS as exc:
            attempt.error = type(exc).__name__
            result = UpstreamResult(attempt.status, error=exc, wire=provider.wire)
        except Exception as exc:
            # A provider plugin's bug must not take the call down unrecorded:
            # it counts as a failed attempt (logged loudly) and the chain goes on.
            log.exception("provider %r failed on %s", binding.provider, call.request_id)
            attempt.error = f"provider error: {type(exc).__name__}"
            result = UpstreamResult(attempt.status, error=exc, wire=provider.wire)
            if response is None:
                # send() reports the upstream's failures as connection errors (its
                # contract); anything else is the gateway's own, before the upstream
                # saw a byte (a request it could not build or encode).  Nothing is
                # learnt of the upstream (a breaker must not isolate a healthy line
                # for it) and a retry would fail the same way.
                own_failure = _GATEWAY_FAILED
        verdict = await _finish(gen, call, attempt, result, own_failure, cut)
    except BaseException as exc:
        # The caller left (or an observer failed) mid-attempt: drop the upstream at once.
        if response is not None:
            response.close()
        if attempt.verdict is None and isinstance(exc, asyncio.CancelledError):
            await _finish(gen, call, attempt, UpstreamResult(attempt.status, error=exc))
        raise
    if (
        verdict.outcome in SERVING_OUTCOMES
        and response is not None
        and (verdict.outcome is not _FILTERED or result.status == 200)
    ):
        return Served(attempt, response, result, stream, prepared), attempt, result
    if response is not None:
        if stream is None and result.error is None and not result.timed_out:
            response.release()
        else:
            response.close()
    return None, attempt, result


async def _finish(
    gen: Generation,
    call: Call,
    attempt: Attempt,
    result: UpstreamResult,
    own_failure: Verdict | None = None,
    cut: str | None = None,
) -> Verdict:
    """Classify the attempt (``own_failure``: the gateway's, whatever a classifier
    would say; ``cut``: the finish reason of an answer a content filter cut,
    never an ordinary answer whatever a classifier would say) and let observers see it."""
    attempt.elapsed_ms = (gen.clock() - attempt.started_at) * 1000
    hooks = gen.hooks
    verdict: Verdict
    if own_failure is not None:
        verdict = own_failure
    elif result.malformed is not None:
        # Not an answer, whatever a classifier would make of it: never served, never billed.
        outcome = Outcome.BROKEN_STREAM if result.streaming else Outcome.TRANSIENT
        verdict = Verdict(outcome, result.malformed, code="upstream_bad_answer")
    elif result.error is not None and _gateway_short(result.error):
        # The gateway's own shortage, whatever a classifier would make of it: nothing
        # is learnt of the upstream (a breaker must not isolate a healthy line for it),
        # and a retry would find the same shortage.  The next binding may have an
        # idle connection.
        gen.counters["gateway_out_of_resources"] += 1
        count = gen.counters["gateway_out_of_resources"]
        if count & (count - 1) == 0:  # the 1st, 2nd, 4th, 8th…: said, without a flood
            log.warning(
                "%s: no connection to %s: the gateway is out of files or memory (%s; %d so far)",
                call.request_id,
                attempt.binding.id,
                type(result.error).__name__,
                count,
            )
        verdict = Verdict(
            Outcome.CANCELLED, "gateway out of files or memory", code="gateway_out_of_resources"
        )
    else:
        verdict = hooks.classify(call=call, attempt=attempt, result=result)
        if cut is not None and (verdict.outcome is _OK or verdict.outcome is _EMPTY):
            verdict = content_filtered(f"finish_reason {cut}")
    attempt.verdict = verdict
    if hooks.on_attempt is None:
        return verdict
    pending = hooks.on_attempt(call=call, attempt=attempt)  # awaitables (None is dropped)
    if pending:
        await asyncio.gather(*pending)
    return verdict


def _gateway_short(error: BaseException) -> bool:
    """Whether ``error`` (or what it wraps) is the gateway running out of files or memory."""
    seen: BaseException | None = error
    for _ in range(4):  # a client's own error wraps the OSError a level or two down
        if seen is None:
            return False
        if isinstance(seen, OSError) and seen.errno in _GATEWAY_SHORT:
            return True
        seen = seen.__cause__ or seen.__context__
    return False


#: What happened last, when its verdict names no code of its own.
_CODES = {
    Outcome.TIMEOUT: "upstream_timeout",
    Outcome.RATE_LIMITED: "upstream_rate_limited",
    Outcome.PERMANENT: "upstream_refused",
}


def error_code(attempt: Attempt | None) -> str:
    """The code that names what happened last."""
    if attempt is None or attempt.verdict is None:
        return "no_binding_available"
    if attempt.verdict.code:
        return attempt.verdict.code
    return _CODES.get(attempt.verdict.outcome, "upstream_unavailable")


def filtered_refusal(call: Call, attempt: Attempt) -> PrismError:
    """The answer for a prompt a line's content filter refused, when the model returns
    such outcomes (``empty = "return"``) rather than falling back past them."""
    return PrismError(
        400,
        CONTENT_FILTERED,
        f"the content filter of {attempt.binding.id} refused the prompt; nothing was generated",
        extra={"request_id": call.request_id, "attempts": attempt_record(call)},
    )


def exhausted(call: Call, status: int = 503, code: str | None = None) -> PrismError:
    """The error for a chain with nothing left, carrying the full attempt record."""
    last = call.attempts[-1] if call.attempts else None
    model = call.model.name if call.model else call.model_name
    if code == "chain_deadline_exceeded":
        message = f"the call budget for model '{model}' ran out after {len(call.attempts)} attempts"
    elif last is None:
        message = f"no binding of model '{model}' could take this request"
    else:
        assert last.verdict is not None
        tier = call.model.tier if call.model else "?"
        message = (
            f"no binding of tier '{tier}' is left for model '{model}'; last: {last.binding.id} "
            f"{last.verdict.outcome} ({last.verdict.reason or last.status})"
        )
    code = code or error_code(last)
    if code == INTERNAL_ERROR:
        status = 500  # the gateway's failure: not "unavailable, come back later"
    elif code == CONTENT_FILTERED:
        status = 400  # every line's filter stopped it last: trying again later will not help
    if call.endpoint is Endpoint.EMBEDDINGS:
        code = f"runtime_embeddings_failed:{code}"
    error_type = ChainDeadline if status == 504 else PrismError
    return error_type(
        status,
        code,
        message,
        type="api_error",
        extra={"request_id": call.request_id, "attempts": attempt_record(call)},
    )
