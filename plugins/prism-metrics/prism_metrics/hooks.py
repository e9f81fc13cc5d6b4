"""One generation's metrics: the per-call hooks, and the gauges read when someone looks.

Label values are all bounded by the configuration: bindings come from the
catalog, a model is one the catalog resolved (``unknown`` otherwise: a caller
may send any string), routes are rule names, codes are Prism's own.
"""

from __future__ import annotations

import operator
from collections.abc import Callable
from typing import Any

import cachetools

from prism_proxy import (
    BREAKER,
    SERVING_OUTCOMES,
    Attempt,
    Binding,
    BreakerView,
    Call,
    Generation,
    Outcome,
    Settlement,
    hookimpl,
)

from .capacity import CapacityRule
from .exporter import Exporter

__all__ = ["MetricsHooks"]

IN_FLIGHT = "metrics"
STATES = ("eligible", "suspect", "isolated", "trial", "quarantined")
_TOKEN_KINDS = (
    ("input", "input_tokens"),
    ("output", "output_tokens"),
    ("cached_input", "cached_input_tokens"),
    ("cache_creation", "cache_creation_tokens"),
    ("reasoning", "reasoning_tokens"),
)
#: A usage's counts in the order of ``_TOKEN_KINDS``, read in one call.
_TOKEN_COUNTS = operator.attrgetter(*(field for _, field in _TOKEN_KINDS))


def binding_labels(binding: Binding) -> tuple[str, str, str]:
    return binding.provider, binding.model, binding.region or ""


#: The most lines (and label sets) a generation keeps children for, the oldest going
#: first (plugins may make lines).
_LINES_CACHE = 4096


class _Line:
    """One line's labelled children, looked up once per generation instead of per call."""

    __slots__ = ("_hooks", "attempts", "concurrency_limited", "inflight", "labels", "ttft")

    def __init__(self, hooks: MetricsHooks, binding: Binding) -> None:
        self._hooks = hooks
        self.labels = labels = binding_labels(binding)
        self.inflight = hooks._child(hooks._inflight, *labels)
        self.ttft = hooks._child(hooks._ttft, *labels)
        #: By outcome, made as outcomes occur (a child is a series in the exposition).
        self.attempts: dict[Outcome, Any] = {}
        self.concurrency_limited = "max_concurrency" in binding.options

    def attempt(self, outcome: Outcome) -> Any:
        found = self.attempts.get(outcome)
        if found is None:
            hooks = self._hooks
            found = self.attempts[outcome] = hooks._child(
                hooks._attempts, *self.labels, str(outcome)
            )
        return found

    def retry(self) -> Any:
        hooks = self._hooks
        return hooks._child(hooks._retries, self.labels[0], self.labels[1])


class _Settled:
    """The children one kind of settled call counts in, looked up once per generation."""

    __slots__ = ("_hooks", "_token_labels", "duration", "requests", "rule", "tokens")

    def __init__(
        self, hooks: MetricsHooks, labels: list[str], model: str, route: str, provider: str
    ) -> None:
        self._hooks = hooks
        self.requests = hooks._child(hooks._requests, *labels)
        self.duration = hooks._child(hooks._duration, labels[0], model)
        self.rule = (
            None if route in ("default", "none") else hooks._child(hooks._rules, model, route)
        )
        self._token_labels = (model, provider)
        #: By token kind, made when a call first uses that kind (a child is a series).
        self.tokens: list[Any] = [None] * len(_TOKEN_KINDS)

    def token(self, index: int) -> Any:
        found = self.tokens[index]
        if found is None:
            hooks = self._hooks
            kind = _TOKEN_KINDS[index][0]
            found = self.tokens[index] = hooks._child(hooks._tokens, *self._token_labels, kind)
        return found


class MetricsHooks:
    """Registered as ``metrics.hooks`` for one generation."""

    def __init__(self, exporter: Exporter, generation: Generation, rule: CapacityRule) -> None:
        self.exporter = exporter
        self.generation = generation
        self.rule = rule
        self.peaks = rule.peaks
        self.clock: Callable[[], float] = generation.clock
        m = exporter.metrics
        self._attempts = m["prism_attempts_total"]
        self._retries = m["prism_retries_total"]
        self._inflight = m["prism_inflight"]
        self._ttft = m["prism_time_to_first_token_seconds"]
        self._requests = m["prism_requests_total"]
        self._duration = m["prism_request_duration_seconds"]
        self._fallbacks = m["prism_fallbacks_total"]
        self._tokens = m["prism_tokens_total"]
        self._rules = m["prism_rule_matches_total"]
        self._child = exporter.child
        # Counted in plain dicts; prometheus-client gets the sums when someone looks.
        self._add = exporter.tally.add
        self._observe = exporter.tally.observe
        self._lines: cachetools.FIFOCache[str, _Line] = cachetools.FIFOCache(_LINES_CACHE)
        self._settled: cachetools.FIFOCache[tuple[Any, ...], _Settled]
        self._settled = cachetools.FIFOCache(_LINES_CACHE)

    def _line(self, binding: Binding) -> _Line:
        try:
            return self._lines[binding.id]
        except KeyError:
            found = self._lines[binding.id] = _Line(self, binding)
            return found

    # -- per call ------------------------------------------------------------------

    @hookimpl
    def prism_attempt_start(self, call: Call, attempt: Attempt) -> None:
        binding = attempt.binding
        line = self._line(binding)
        self._add(line.inflight)
        attempt.extensions[IN_FLIGHT] = True
        if line.concurrency_limited:
            self.peaks.change(binding.id, 1)
        if len(call.attempts) > 1 and call.attempts[-2].binding.id == binding.id:
            self._add(line.retry())

    @hookimpl
    def prism_on_attempt(self, call: Call, attempt: Attempt) -> None:
        verdict = attempt.verdict
        if verdict is None:
            return
        line = self._line(attempt.binding)
        self._add(line.attempt(verdict.outcome))
        if verdict.outcome in SERVING_OUTCOMES:
            first_byte_ms = attempt.first_byte_ms
            if first_byte_ms is not None:
                self._observe(line.ttft, first_byte_ms / 1000)
        else:
            self._end(attempt)  # a serving attempt stays in flight until the call settles

    @hookimpl
    def prism_settle(self, call: Call, settlement: Settlement) -> None:
        for attempt in call.attempts:
            self._end(attempt)
        model = call.model.name if call.model is not None else "unknown"
        route = call.route.name if call.route is not None else "none"
        usage, served = settlement.usage, settlement.served
        provider = served.binding.provider if served is not None else ""
        org = call.principal.org or "" if self.exporter.org_label else None
        key = (
            call.endpoint,
            model,
            route,
            settlement.outcome,
            settlement.error_code,
            org,
            provider,
        )
        try:
            settled = self._settled[key]
        except KeyError:
            settled = self._settled_as(key, model, route, provider)
        self._add(settled.requests)
        self._observe(settled.duration, self.clock() - call.received_at)
        if settled.rule is not None:
            self._add(settled.rule)
        if len(call.attempts) > 1 or call.response_headers:  # else no fallback of any kind
            self._fallback_kinds(call, model)
        # A cached answer's tokens were spent once, when it was made (prism-cache counts
        # them as saved): counting them again would show upstream use that never was.
        if usage is not None and served is not None and settlement.outcome != "cached":
            for index, tokens in enumerate(_TOKEN_COUNTS(usage)):
                if tokens:
                    self._add(settled.token(index), tokens)

    def _settled_as(self, key: tuple[Any, ...], model: str, route: str, provider: str) -> _Settled:
        endpoint, _, _, outcome, code, org, _ = key
        labels = [str(endpoint), model, route, outcome, code or ""]
        if org is not None:
            labels.append(org)
        settled = self._settled[key] = _Settled(self, labels, model, route, provider)
        return settled

    def _fallback_kinds(self, call: Call, model: str) -> None:
        attempts = call.attempts
        if len(attempts) > 1 and len({attempt.binding.id for attempt in attempts}) > 1:
            self._add(self._child(self._fallbacks, model, "binding"))
        if call.response_headers.get("x-prism-fallback") == "cross-tier":
            self._add(self._child(self._fallbacks, model, "cross_tier"))
        if "stand-down" in call.response_headers.get("x-prism-breaker", ""):
            self._add(self._child(self._fallbacks, model, "stand_down"))

    def _end(self, attempt: Attempt) -> None:
        if attempt.extensions.pop(IN_FLIGHT, False):
            line = self._line(attempt.binding)
            self._add(line.inflight, -1)
            if line.concurrency_limited:
                self.peaks.change(attempt.binding.id, -1)

    # -- read when asked -------------------------------------------------------------

    def refresh(self) -> None:
        """Set what is read, not counted: breaker states and windows, shared state, events."""
        generation = self.generation
        m = self.exporter.metrics
        breaker: BreakerView | None = generation.services.get(BREAKER)
        if breaker is not None:
            health = breaker.health(with_text=False)
            for entry in health["bindings"]:
                binding = generation.catalog.bindings.get(entry["binding"])
                if binding is None:
                    continue
                labels = binding_labels(binding)
                state = entry["state"]
                if any(o["kind"] == "quarantine" for o in entry["overrides"]):
                    state = "quarantined"
                for name in STATES:
                    m["prism_breaker_state"].labels(*labels, name).set(1 if name == state else 0)
                m["prism_binding_error_ratio"].labels(*labels).set(entry["window"]["error_rate"])
            reviews = m["prism_override_reviews"]
            reviews.labels("due_soon").set(len(health["reviews_due_soon"]))
            reviews.labels("overdue").set(len(health["overdue_reviews"]))
        up = 1  # nothing shared is nothing down
        spooled = 0
        for facts in generation.pm.hook.prism_readyz(generation=generation):
            if (facts or {}).get("shared_state", "ok") != "ok":
                up = 0
            ledger = (facts or {}).get("ledger")
            if isinstance(ledger, dict):
                spooled += int(ledger.get("spool_depth", 0))
        m["prism_shared_state_up"].set(up)
        m["prism_ledger_spool_depth"].set(spooled)
        self.rule.gauges(m)
        self.exporter.events(generation.counters)

    def render(self) -> bytes:
        return self.exporter.render(self.refresh)
