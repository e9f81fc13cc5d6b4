"""Every metric Prism exports: name, kind, help, labels; one table, read by the exporter,
the README and the Grafana test alike."""

from __future__ import annotations

import attrs

__all__ = ["BUCKETS", "FAMILIES", "Family"]

#: Seconds: resolves 50 ms to 60 s (time to first token, request duration).
BUCKETS = (0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 20.0, 30.0, 60.0)
#: Seconds: a ledger commit is a millisecond affair.
COMMIT_BUCKETS = (0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 1.0)


@attrs.frozen
class Family:
    name: str
    kind: str  # counter, histogram or gauge
    help: str
    labels: tuple[str, ...] = ()
    buckets: tuple[float, ...] = BUCKETS
    #: How workers' values combine in one scrape (gauges only; prometheus-client's modes).
    combine: str = "livesum"
    #: Labelled by organisation too, only with ``[prism:metrics] org_label = true``
    #: (without it a gauge's one series holds the highest organisation's value).
    org: bool = False


BINDING = ("provider", "upstream_model", "region")

FAMILIES: tuple[Family, ...] = (
    Family(
        "prism_requests_total",
        "counter",
        "Calls settled, by endpoint, requested model, route, outcome and error code.",
        ("endpoint", "model", "route", "outcome", "code"),
        org=True,
    ),
    Family(
        "prism_attempts_total",
        "counter",
        "Upstream attempts, by binding and the classifier's verdict.",
        (*BINDING, "verdict"),
    ),
    Family(
        "prism_retries_total",
        "counter",
        "Attempts that retried the binding the call had just tried.",
        ("provider", "upstream_model"),
    ),
    Family(
        "prism_fallbacks_total",
        "counter",
        "Calls that left their first binding (binding), their model's tier (cross_tier), "
        "or whose breaker stood down (stand_down).",
        ("model", "kind"),
    ),
    Family(
        "prism_time_to_first_token_seconds",
        "histogram",
        "Time from an attempt's start to its first byte of content, for attempts that served.",
        BINDING,
    ),
    Family(
        "prism_request_duration_seconds",
        "histogram",
        "Time from a call's arrival to its settlement.",
        ("endpoint", "model"),
    ),
    Family("prism_inflight", "gauge", "Upstream attempts in flight.", BINDING),
    Family(
        "prism_breaker_state",
        "gauge",
        "1 for the binding's current breaker state (quarantined bindings: isolated), 0 else.",
        (*BINDING, "state"),
        combine="livemostrecent",
    ),
    Family(
        "prism_binding_error_ratio",
        "gauge",
        "Counted failures over counted calls in the breaker's window (60 s by default).",
        BINDING,
        combine="livemostrecent",
    ),
    Family(
        "prism_chain_exceeded_max_time_total",
        "counter",
        "Calls whose budget ran out before any binding served.",
        ("model",),
    ),
    Family(
        "prism_tokens_total",
        "counter",
        "Tokens of serving attempts, by kind (input, output, cached_input, cache_creation, "
        "reasoning).",
        ("model", "provider", "kind"),
    ),
    Family("prism_cost_total", "counter", "Billed cost (currency units).", ("model", "provider")),
    Family(
        "prism_cache_lookups_total",
        "counter",
        "Response cache lookups (prism-cache), by model and result: hit, miss or bypass.",
        ("model", "result"),
    ),
    Family(
        "prism_cache_tokens_saved_total",
        "counter",
        "Tokens (input and output) of answers served from the response cache.",
        ("model",),
    ),
    Family(
        "prism_ledger_commit_seconds",
        "histogram",
        "Time to make one batch of ledger rows durable.",
        buckets=COMMIT_BUCKETS,
    ),
    Family(
        "prism_rule_matches_total",
        "counter",
        "Calls a routing rule routed, by model and rule.",
        ("model", "rule"),
    ),
    Family("prism_keys_rejected_total", "counter", "Calls refused by the key check.", ("reason",)),
    Family(
        "prism_shared_state_up",
        "gauge",
        "0 while a shared state engine (Redis) does not answer, else 1 (also with none).",
        combine="livemin",
    ),
    Family(
        "prism_ledger_spool_depth",
        "gauge",
        "Ledger rows in prism-billing's spool, waiting for PostgreSQL to take them.",
    ),
    Family(
        "prism_probes_total",
        "counter",
        "Probes of lines (prism-probes) by result: pass, fail, skipped (the hourly "
        "allowance is spent).",
        ("provider", "upstream_model", "result"),
    ),
    Family(
        "prism_override_reviews",
        "gauge",
        "Operator overrides whose review is due soon (due_soon) or past (overdue).",
        ("when",),
        combine="livemostrecent",
    ),
    Family(
        "prism_capacity_reserve_ratio",
        "gauge",
        "A tier's reserve for losing this line over the line's peak (the capacity rule "
        "fires below capacity_k).",
        ("model", "provider", "upstream_model"),
        combine="livemostrecent",
    ),
    Family(
        "prism_capacity_alert",
        "gauge",
        "1 while the capacity rule fires for this line of this tier.",
        ("model", "provider", "upstream_model"),
        combine="livemax",
    ),
    Family(
        "prism_limit_refusals_total",
        "counter",
        "Calls refused by a limit (prism-limits), by limit (rpm, tpm, max_parallel, budget) "
        "and whose it was (organisation, key, default).",
        ("limit", "scope"),
    ),
    Family(
        "prism_budget_used_ratio",
        "gauge",
        "Spent over amount of an organisation's most used budget in its current period, as "
        "the last settled call saw it (prism-limits); without org_label, the highest of any "
        "organisation.",
        org=True,
        # The most recent settlement anywhere is the freshest reading of a shared budget.
        combine="mostrecent",
    ),
    Family(
        "prism_events_total",
        "counter",
        "The gateway's event counters (as /prism/stats shows them per process).",
        ("event",),
    ),
)
