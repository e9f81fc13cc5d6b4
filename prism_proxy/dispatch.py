"""The dispatch loop: try the route's bindings, classify each attempt, decide what next.

Every endpoint, streaming or not, goes through :func:`dispatch`; it returns
the attempt that will serve, or raises an error that carries the record of
everything tried.
"""

from __future__ import annotations

import asyncio

import aiohttp
import attrs

from .call import Attempt, Call, Endpoint, Outcome, UpstreamResult, Verdict
from .catalog import Binding
from .errors import PrismError
from .gateway import Gateway
from .providers import UpstreamResponse
from .record import attempt_record
from .stream import UpstreamStream

__all__ = ["PassThrough", "Served", "dispatch"]

_CONNECTION_ERRORS = (aiohttp.ClientError, OSError)


@attrs.define(eq=False)
class Served:
    """The attempt that answers the caller, with its still-open upstream response."""

    attempt: Attempt
    response: UpstreamResponse
    result: UpstreamResult
    stream: UpstreamStream | None


class PassThrough(Exception):
    """The request itself was at fault: the caller gets the upstream's answer unchanged."""

    def __init__(self, attempt: Attempt, result: UpstreamResult) -> None:
        super().__init__(f"upstream rejected the request ({result.status})")
        self.attempt = attempt
        self.result = result


async def dispatch(gw: Gateway, call: Call) -> Served:
    """Walk the route in order; serve the first binding that answers."""
    assert call.route is not None
    for binding in call.route.bindings:
        served, result = await _attempt(gw, call, binding)
        if served is not None:
            return served
        attempt = call.attempts[-1]
        if attempt.outcome is Outcome.REQUEST_ERROR:
            raise PassThrough(attempt, result)
    raise exhausted(call)


async def _attempt(
    gw: Gateway, call: Call, binding: Binding
) -> tuple[Served | None, UpstreamResult]:
    provider = gw.providers[binding.provider]
    attempt = call.new_attempt(binding, gw.clock())
    response: UpstreamResponse | None = None
    stream: UpstreamStream | None = None
    try:
        try:
            async with asyncio.timeout(call.attempt_timeout_s):
                response = await provider.send(call, binding)
                attempt.status = response.status
                if response.status == 200 and call.stream:
                    stream = UpstreamStream(response, forward_usage=call.include_usage)
                    data, broken = await stream.until_commit()
                    result = UpstreamResult(
                        200, response.headers, data or b"", stream_broken=broken, streaming=True
                    )
                else:
                    body = await response.read()
                    result = UpstreamResult(response.status, response.headers, body)
        except TimeoutError:
            result = UpstreamResult(attempt.status, timed_out=True)
        except _CONNECTION_ERRORS as exc:
            attempt.error = type(exc).__name__
            result = UpstreamResult(attempt.status, error=exc)
    except asyncio.CancelledError as exc:
        if response is not None:
            response.close()
        await _finish(gw, call, attempt, UpstreamResult(attempt.status, error=exc))
        raise
    verdict = await _finish(gw, call, attempt, result)
    if verdict.outcome in (Outcome.OK, Outcome.EMPTY) and response is not None:
        return Served(attempt, response, result, stream), result
    if response is not None:
        if stream is None and result.error is None and not result.timed_out:
            response.release()
        else:
            response.close()
    return None, result


async def _finish(gw: Gateway, call: Call, attempt: Attempt, result: UpstreamResult) -> Verdict:
    """Classify the attempt and let observers see it."""
    attempt.elapsed_ms = (gw.clock() - attempt.started_at) * 1000
    attempt.first_byte_ms = attempt.elapsed_ms if result.status is not None else None
    verdict: Verdict = gw.hook.prism_classify(call=call, attempt=attempt, result=result)
    attempt.verdict = verdict
    pending = gw.hook.prism_on_attempt(call=call, attempt=attempt)
    if pending:
        await asyncio.gather(*pending)
    return verdict


_CODES = {
    Outcome.TIMEOUT: "upstream_timeout",
    Outcome.RATE_LIMITED: "upstream_rate_limited",
    Outcome.PERMANENT: "upstream_quota_exhausted",
}


def error_code(attempt: Attempt | None) -> str:
    """The code that names what happened last."""
    if attempt is None or attempt.verdict is None:
        return "no_binding_available"
    if attempt.verdict.code:
        return attempt.verdict.code
    return _CODES.get(attempt.verdict.outcome, "upstream_unavailable")


def exhausted(call: Call, status: int = 503, code: str | None = None) -> PrismError:
    """The error for a chain with nothing left, carrying the full attempt record."""
    last = call.attempts[-1] if call.attempts else None
    code = code or error_code(last)
    model = call.model.name if call.model else call.model_name
    if last is None:
        message = f"no binding of model '{model}' could take this request"
    else:
        assert last.verdict is not None
        message = (
            f"every binding of model '{model}' failed; last: {last.binding.id} "
            f"{last.verdict.outcome} ({last.verdict.reason or last.status})"
        )
    if call.endpoint is Endpoint.EMBEDDINGS:
        code = f"runtime_embeddings_failed:{code}"
    return PrismError(
        status,
        code,
        message,
        type="api_error",
        extra={"request_id": call.request_id, "attempts": attempt_record(call)},
    )
