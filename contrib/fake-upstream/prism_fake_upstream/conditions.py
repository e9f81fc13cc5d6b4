"""Standing conditions: a scenario's weather, drawn afresh for every request.

A script answers the next N requests in order; an incident is a rate instead
("30 % of calls get a 503", "first tokens five times slower"). A condition set
on a scenario answers every request the script does not, each one drawn at
random with the condition's own seeded generator, so a replay of the same
condition over the same traffic draws the same faults.
"""

from __future__ import annotations

import asyncio
import collections
import contextlib
import json
import random
from collections.abc import AsyncIterator, Mapping
from typing import Any

import attrs
import orjson
from aiohttp import web

from .faults import Fault

__all__ = ["Condition", "Gate", "add_condition_routes", "condition_from_json"]

_KINDS = ("refuse", "empty", "cut")


def _fraction(_inst: object, attr: attrs.Attribute[Any], value: float) -> None:
    if not 0.0 <= value <= 1.0:
        raise ValueError(f"{attr.name} must be a fraction between 0 and 1, got {value!r}")


def _non_negative(_inst: object, attr: attrs.Attribute[Any], value: float) -> None:
    if value < 0:
        raise ValueError(f"{attr.name} must be >= 0, got {value!r}")


def _to_errors(value: Mapping[Any, float]) -> dict[int, float]:
    return {int(status): float(share) for status, share in value.items()}


@attrs.define
class Condition:
    """How a scenario answers while the condition stands.

    Shares are of all requests; what remains after errors, refusals, empty
    answers and cut streams is answered normally, with the delays.
    """

    first_token_delay_s: float = attrs.field(default=0.0, validator=_non_negative)
    token_delay_s: float = attrs.field(default=0.0, validator=_non_negative)
    #: status → share of requests answered with it (429s carry Retry-After).
    errors: dict[int, float] = attrs.field(factory=dict, converter=_to_errors)
    retry_after_s: float | None = None
    #: The connection is closed with no answer (``die_after_chunks=0``: a stream gets
    #: its headers first), standing in for a refused or reset connection.
    refuse: float = attrs.field(default=0.0, validator=_fraction)
    #: 200 with nothing generated (``finish_reason: length``).
    empty: float = attrs.field(default=0.0, validator=_fraction)
    #: A stream cut after ``cut_after_chunks`` content chunks (non-streaming: closed).
    cut: float = attrs.field(default=0.0, validator=_fraction)
    cut_after_chunks: int = 2
    #: The provider's own concurrency: at most this many requests answered at
    #: once, the rest wait in arrival order (latency grows, nothing fails).
    max_concurrency: int | None = None
    seed: int = 0
    _rng: random.Random = attrs.field(init=False, alias="_rng")
    #: Requests answered under this condition so far.
    draws: int = attrs.field(init=False, default=0)

    def __attrs_post_init__(self) -> None:
        for status, share in self.errors.items():
            if not 100 <= status <= 599 or not 0.0 <= share <= 1.0:
                raise ValueError(f"errors: {status}: {share} is not a status and a fraction")
        if self.max_concurrency is not None and (
            type(self.max_concurrency) is not int or self.max_concurrency < 1
        ):
            raise ValueError(
                f"max_concurrency must be a whole number >= 1, got {self.max_concurrency!r}"
            )
        if sum(self.errors.values()) + self.refuse + self.empty + self.cut > 1.0 + 1e-9:
            raise ValueError("errors, refuse, empty and cut add up to more than 1")
        self._rng = random.Random(self.seed)

    def draw(self) -> Fault:
        """The Fault of the next request."""
        self.draws += 1
        u = self._rng.random()
        for status, share in sorted(self.errors.items()):
            if u < share:
                return Fault(status=status, headers=self._error_headers(status))
            u -= share
        if u < self.refuse:
            return Fault(die_after_chunks=0)
        u -= self.refuse
        if u < self.empty:
            return Fault(empty_length=True, first_token_delay_s=self.first_token_delay_s)
        u -= self.empty
        if u < self.cut:
            return Fault(
                die_after_chunks=self.cut_after_chunks,
                first_token_delay_s=self.first_token_delay_s,
                token_delay_s=self.token_delay_s,
            )
        return Fault(first_token_delay_s=self.first_token_delay_s, token_delay_s=self.token_delay_s)

    def _error_headers(self, status: int) -> dict[str, str]:
        if status != 429 or self.retry_after_s is None:
            return {}
        # Whole seconds for Retry-After; the millisecond header keeps a
        # sub-second (time-scaled) wait exact for clients that read it.
        return {
            "Retry-After": str(max(1, round(self.retry_after_s))),
            "retry-after-ms": str(round(self.retry_after_s * 1000)),
        }


@attrs.define(eq=False)
class Gate:
    """One scenario's requests being answered, and those waiting for a turn.

    It outlives the conditions (the lab replaces them as its timeline moves),
    so a queue built under one condition drains under the next.
    """

    in_use: int = 0
    waiters: collections.deque[asyncio.Future[None]] = attrs.field(factory=collections.deque)

    @contextlib.asynccontextmanager
    async def hold(self, limit: int | None) -> AsyncIterator[None]:
        """A turn to answer: at once under ``limit`` (None: no limit), else in arrival order."""
        if limit is None or (self.in_use < limit and not self.waiters):
            self.in_use += 1
        else:
            waiter: asyncio.Future[None] = asyncio.get_running_loop().create_future()
            self.waiters.append(waiter)
            try:
                await waiter
            except BaseException:
                # The client left while queued; a turn handed over meanwhile passes on.
                if waiter.done() and not waiter.cancelled():
                    self._release()
                else:
                    with contextlib.suppress(ValueError):
                        self.waiters.remove(waiter)
                raise
        try:
            yield
        finally:
            self._release()

    def _release(self) -> None:
        while self.waiters:
            waiter = self.waiters.popleft()
            if not waiter.done():
                waiter.set_result(None)  # the turn passes on; in_use stays
                return
        self.in_use -= 1


def condition_from_json(obj: object) -> Condition:
    """A Condition from its control-API JSON form; raises ValueError on bad input."""
    if not isinstance(obj, dict):
        raise ValueError("a condition must be a JSON object")
    known = {f.alias for f in attrs.fields(Condition) if f.init}
    unknown = set(obj) - known
    if unknown:
        raise ValueError(f"unknown condition fields: {sorted(unknown)}")
    errors = obj.get("errors", {})
    if not isinstance(errors, dict):
        raise ValueError("errors must be an object of status: fraction")
    try:
        return Condition(**obj)
    except TypeError as exc:
        raise ValueError(str(exc)) from None


CONDITIONS_KEY = web.AppKey("prism_fake_upstream.conditions", dict[str, Condition])


def _error(message: str) -> web.Response:
    body = {"error": {"message": message, "type": "invalid_request_error"}}
    return web.Response(status=400, body=orjson.dumps(body), content_type="application/json")


def _replaced(old: Condition | None) -> web.Response:
    # The count of the condition just replaced, read in the same step as the
    # swap, so a driver changing conditions over time loses no request.
    body = {"replaced_draws": 0 if old is None else old.draws}
    return web.Response(body=orjson.dumps(body), content_type="application/json")


async def _set_condition(request: web.Request) -> web.Response:
    try:
        condition = condition_from_json(json.loads(await request.read()))
    except ValueError as exc:
        return _error(f"invalid condition: {exc}")
    conditions = request.app[CONDITIONS_KEY]
    old = conditions.get(request.match_info["scenario"])
    conditions[request.match_info["scenario"]] = condition
    return _replaced(old)


async def _clear_condition(request: web.Request) -> web.Response:
    return _replaced(request.app[CONDITIONS_KEY].pop(request.match_info["scenario"], None))


def add_condition_routes(app: web.Application, conditions: dict[str, Condition]) -> None:
    """``PUT /_fake/condition/{scenario}`` (a JSON Condition) and ``DELETE`` to end it.

    Both answer ``{"replaced_draws": N}``: the requests the condition they ended answered.
    """
    app[CONDITIONS_KEY] = conditions
    app.router.add_put("/_fake/condition/{scenario}", _set_condition)
    app.router.add_delete("/_fake/condition/{scenario}", _clear_condition)
