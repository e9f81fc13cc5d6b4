"""What a run measured: the per-second timeline, the summary, the files and the table."""

from __future__ import annotations

import csv
import itertools
import json
import math
import statistics
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from .runner import Sample, VariantRun, prices
from .scenario import Scenario
from .traffic import Call

__all__ = ["format_table", "summarise", "timeline", "write_variant"]

#: Breaker states as plotted (higher is further from serving).
STATE_LEVEL = {"eligible": 0, "suspect": 1, "trial": 2, "isolated": 3}


def _percentile(values: Sequence[float], q: float) -> float | None:
    if not values:
        return None
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, math.ceil(q * len(ordered)) - 1)]


def _failed(call: Call) -> bool:
    return not call.ok and not call.degraded


def timeline(scenario: Scenario, run: VariantRun) -> list[dict[str, Any]]:
    """One row per scenario second: outcomes of the calls that ended in it, and the states."""
    last_end = max((c.end_s for c in run.calls), default=scenario.duration_s)
    seconds = max(math.ceil(max(scenario.duration_s, last_end)), 1)
    rows: list[dict[str, Any]] = []
    by_second: dict[int, list[Call]] = {}
    for call in run.calls:
        by_second.setdefault(int(call.end_s), []).append(call)
    states: dict[int, Sample] = {int(s.t): s for s in run.samples}
    current: dict[str, Any] = {}
    for second in range(seconds):
        ended = by_second.get(second, [])
        ttft = [c.first_token_s for c in ended if c.ok and c.first_token_s is not None]
        middle = second + 0.5
        if second in states:
            current = states[second].bindings
        p50, p95 = _percentile(ttft, 0.5), _percentile(ttft, 0.95)
        rows.append(
            {
                "t": second,
                "served": sum(c.ok for c in ended),
                "served_by_fallback": sum(c.fallback for c in ended),
                "degraded": sum(c.degraded for c in ended),
                "failed": sum(_failed(c) for c in ended),
                "first_token_p50_ms": None if p50 is None else round(p50 * 1000, 1),
                "first_token_p95_ms": None if p95 is None else round(p95 * 1000, 1),
                "in_flight": sum(c.start_s <= middle < c.end_s for c in run.calls),
                "breaker": {b: v["state"] for b, v in sorted(current.items())},
                "error_rate": {b: v.get("error_rate") for b, v in sorted(current.items())},
            }
        )
    return rows


def _bindings_of(scenario: Scenario, provider: str) -> list[str]:
    found = {
        f"{line['provider']}/{line['model']}"
        for model in scenario.models.values()
        for line in model["chain"]
        if line["provider"] == provider
    }
    return sorted(found)


def _isolations(samples: Sequence[Sample], binding: str, since: float) -> int:
    """How many times the binding was seen entering isolation from ``since`` on."""
    states = [s.bindings[binding]["state"] for s in samples if s.t >= since]
    return sum(a != "isolated" and b == "isolated" for a, b in itertools.pairwise(states))


def _fault_windows(scenario: Scenario, run: VariantRun) -> list[dict[str, Any]]:
    out = []
    for fault in scenario.faults:
        for binding in _bindings_of(scenario, fault.provider):
            seen = [s for s in run.samples if binding in s.bindings]
            isolated = next(
                (
                    s.t
                    for s in seen
                    if s.t >= fault.start_s and s.bindings[binding]["state"] == "isolated"
                ),
                None,
            )
            full = None
            if isolated is not None:
                full = next(
                    (
                        s.t
                        for s in seen
                        if s.t >= max(fault.end_s, isolated)
                        and s.bindings[binding]["state"] == "eligible"
                        and not s.bindings[binding].get("ramp")
                    ),
                    None,
                )
            out.append(
                {
                    "binding": binding,
                    "fault": [fault.start_s, fault.end_s],
                    "isolated_after_s": None
                    if isolated is None
                    else round(isolated - fault.start_s, 2),
                    "full_traffic_after_end_s": None
                    if full is None
                    else round(full - fault.end_s, 2),
                    "isolations": _isolations(seen, binding, fault.start_s),
                }
            )
    return out


def _extra_costs(scenario: Scenario, run: VariantRun) -> dict[str | None, float] | None:
    """Fallbacks' extra cost per organisation (None: no keys) from the ledger."""
    if not run.variant.billing:
        return None
    table = prices(scenario)
    extra: dict[str | None, float] = {}
    for row in run.ledger:
        primary = scenario.primary(row.model) if row.model in scenario.models else None
        if primary is None or row.binding == primary or primary not in table:
            extra.setdefault(row.org, 0.0)
            continue
        price = table[primary]
        would_have = (row.input_tokens * price["input"] + row.output_tokens * price["output"]) / 1e6
        extra[row.org] = extra.get(row.org, 0.0) + row.cost - would_have
    return {org: round(cost, 9) for org, cost in extra.items()}


def _by_traffic(scenario: Scenario, run: VariantRun) -> list[dict[str, Any]]:
    """Outcomes per kind of client (organisation, caller region, wire, streamed or not)."""
    groups: dict[tuple[str, str, str, bool], list[Call]] = {}
    for call in run.calls:
        key = (call.org or "", call.region or "", call.wire, call.stream)
        groups.setdefault(key, []).append(call)
    return [
        {
            "org": org or None,
            "region": region or None,
            "wire": wire,
            "stream": stream,
            "calls": len(calls),
            "served": sum(c.ok for c in calls),
            "served_by_fallback": sum(c.fallback for c in calls),
            "degraded": sum(c.degraded for c in calls),
            "failed": sum(_failed(c) for c in calls),
            "served_from_regions": sorted(
                {c.served_region for c in calls if c.ok and c.served_region}
            ),
        }
        for (org, region, wire, stream), calls in sorted(groups.items())
    ]


def _trip(scenario: Scenario, run: VariantRun) -> tuple[str, str, float] | None:
    """The first chain whose first line was seen isolated: (model, line, when)."""
    for model in scenario.models:
        line = scenario.primary(model)
        when = next((s.t for s in run.samples if _state(s, line) == "isolated"), None)
        if when is not None:
            return model, line, when
    return None


def _state(sample: Sample, binding: str) -> str | None:
    return sample.bindings.get(binding, {}).get("state")


def _capacity(scenario: Scenario, run: VariantRun) -> dict[str, Any] | None:
    """When the capacity rule fired, and the k the run's own peaks call for.

    The demand on the other lines once the first line is lost is estimated
    with Little's law from the arrivals: at each second after the trip, the
    calls (of every model with a chain line besides the lost one) that
    started within one unqueued call duration (the median of calls served
    before any fault). k = (its p99 - the other lines' peaks) / the lost
    line's peak, the peaks as the rule held them just before the trip: with
    that k the rule fires exactly when the other lines' limits fall short of
    the demand in more than 1 % of those seconds.
    """
    rules = [(s.t, s.capacity) for s in run.samples if s.capacity is not None]
    trip = _trip(scenario, run)
    if not rules or trip is None:
        return None
    model, lost, trip_s = trip
    others = {f"{b['provider']}/{b['model']}" for b in scenario.models[model]["chain"]} - {lost}
    before = [rule for t, rule in rules if t < trip_s]
    tier = next((x for x in (before or [{}])[-1].get("tiers", []) if x["model"] == model), None)
    first_fault = min((f.start_s for f in scenario.faults), default=scenario.duration_s)
    normal = [c.end_s - c.start_s for c in run.calls if c.ok and c.end_s < first_fault]
    end = max((f.end_s for f in scenario.faults if f.start_s <= trip_s), default=trip_s)
    routed = [
        c.start_s
        for c in run.calls
        if any(f"{b['provider']}/{b['model']}" in others for b in scenario.models[c.model]["chain"])
    ]
    duration = statistics.median(normal) if normal else None
    seconds = range(math.ceil(trip_s), math.floor(min(end, scenario.duration_s)))
    demand: list[float] = []
    if duration is not None:
        demand = [float(sum(t - duration < start <= t for start in routed)) for t in seconds]
    demand_p99 = _percentile(demand, 0.99)
    k = None
    if tier is not None and demand_p99 is not None and tier["lines"].get(lost, {}).get("peak"):
        peak_others = sum(tier["lines"][b]["peak"] for b in others if b in tier["lines"])
        k = round((demand_p99 - peak_others) / tier["lines"][lost]["peak"], 2)

    def first(fires: Any) -> float | None:
        return next((round(t, 2) for t, rule in rules if fires(rule)), None)

    def ratio(rule: Mapping[str, Any]) -> float | None:
        found = [x for x in rule.get("tiers", []) if x["model"] == model]
        return found[0]["lines"].get(lost, {}).get("ratio") if found else None

    served = [c for c in run.calls if c.ok and c.first_token_s is not None]
    after = [c.first_token_s or 0.0 for c in served if trip_s <= c.start_s < end]
    p95_after = _percentile(after, 0.95)
    return {
        "model": model,
        "lost_line": lost,
        "trip_s": round(trip_s, 2),
        "k": rules[-1][1].get("k"),
        "alert_s": first(lambda rule: bool(rule.get("firing"))),
        "before_trip": tier["lines"] if tier is not None else None,
        "unqueued_call_s": None if duration is None else round(duration, 3),
        "demand": {
            "p50": _percentile(demand, 0.5),
            "p99": demand_p99,
            "max": max(demand, default=None),
        },
        "k_from_peaks": k,
        "alert_s_at_k_from_peaks": None
        if k is None
        else first(lambda rule: (r := ratio(rule)) is not None and r < k),
        "first_token_p95_ms_after_trip": None if p95_after is None else round(p95_after * 1000),
        "other_lines_isolated": any(
            _state(s, b) == "isolated" for s in run.samples for b in others
        ),
    }


def summarise(scenario: Scenario, run: VariantRun) -> dict[str, Any]:
    calls = run.calls
    ttft = [c.first_token_s for c in calls if c.ok and c.first_token_s is not None]
    p50, p95 = _percentile(ttft, 0.5), _percentile(ttft, 0.95)
    costs = _extra_costs(scenario, run)
    return {
        "scenario": scenario.name,
        "variant": run.variant.name,
        "time_scale": scenario.time_scale,
        "calls": len(calls),
        "served": sum(c.ok for c in calls),
        "served_by_fallback": sum(c.fallback for c in calls),
        "degraded": sum(c.degraded for c in calls),
        "failed": sum(_failed(c) for c in calls),
        "first_token_p50_ms": None if p50 is None else round(p50 * 1000, 1),
        "first_token_p95_ms": None if p95 is None else round(p95 * 1000, 1),
        "calls_to_sick_bindings": run.sick_calls,
        "fallback_extra_cost": None if costs is None else round(sum(costs.values()), 9),
        "fallback_extra_cost_by_org": None
        if costs is None or set(costs) <= {None}
        else {str(org): cost for org, cost in sorted(costs.items(), key=lambda kv: str(kv[0]))},
        "by_traffic": _by_traffic(scenario, run),
        "faults": _fault_windows(scenario, run),
        "capacity": _capacity(scenario, run),
    }


def _plot(scenario: Scenario, rows: Sequence[Mapping[str, Any]], title: str, path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    t = [r["t"] for r in rows]
    fig, (calls_ax, ttft_ax, state_ax) = plt.subplots(3, 1, figsize=(10, 8), sharex=True)
    primary = [r["served"] - r["served_by_fallback"] for r in rows]
    calls_ax.stackplot(
        t,
        primary,
        [r["served_by_fallback"] for r in rows],
        [r["degraded"] for r in rows],
        [r["failed"] for r in rows],
        labels=["served (primary)", "served by fallback", "degraded", "failed"],
        colors=["#4c9a2a", "#e0b000", "#8a8aff", "#d62728"],
    )
    calls_ax.set_ylabel("calls / s")
    calls_ax.legend(loc="upper right", fontsize="small")
    for fault in scenario.faults:
        for ax in (calls_ax, ttft_ax, state_ax):
            ax.axvspan(fault.start_s, fault.end_s, color="grey", alpha=0.12)
    for key, label in (("first_token_p50_ms", "p50"), ("first_token_p95_ms", "p95")):
        ttft_ax.plot(t, [math.nan if r[key] is None else r[key] for r in rows], label=label)
    ttft_ax.set_ylabel("first token (ms)")
    ttft_ax.legend(loc="upper right", fontsize="small")
    bindings = sorted({b for r in rows for b in r["breaker"]})
    for binding in bindings:
        levels = [STATE_LEVEL.get(r["breaker"].get(binding, ""), math.nan) for r in rows]
        state_ax.step(t, levels, where="post", label=binding)
    state_ax.set_yticks(list(STATE_LEVEL.values()), list(STATE_LEVEL))
    state_ax.set_xlabel("scenario time (s)")
    if bindings:
        state_ax.legend(loc="upper right", fontsize="small")
    fig.suptitle(title)
    fig.tight_layout()
    fig.savefig(path, dpi=80)
    plt.close(fig)


def write_variant(scenario: Scenario, run: VariantRun, directory: Path) -> dict[str, Any]:
    """timeline.json/.csv, summary.json and timeline.png in ``directory``; returns the summary."""
    directory.mkdir(parents=True, exist_ok=True)
    rows = timeline(scenario, run)
    summary = summarise(scenario, run)
    (directory / "timeline.json").write_text(json.dumps(rows, indent=1) + "\n")
    bindings = sorted({b for r in rows for b in r["breaker"]})
    with (directory / "timeline.csv").open("w", newline="") as out:
        writer = csv.writer(out)
        head = [k for k in rows[0] if k not in ("breaker", "error_rate")] if rows else []
        writer.writerow(
            head + [f"breaker:{b}" for b in bindings] + [f"error_rate:{b}" for b in bindings]
        )
        for r in rows:
            writer.writerow(
                [r[k] for k in head]
                + [r["breaker"].get(b, "") for b in bindings]
                + [r["error_rate"].get(b, "") for b in bindings]
            )
    (directory / "summary.json").write_text(json.dumps(summary, indent=1) + "\n")
    _plot(scenario, rows, f"{scenario.name}: {run.variant.name}", directory / "timeline.png")
    return summary


_TABLE_ROWS = (
    ("calls", "calls"),
    ("served", "served"),
    ("served by fallback", "served_by_fallback"),
    ("degraded", "degraded"),
    ("failed", "failed"),
    ("first token p50 (ms)", "first_token_p50_ms"),
    ("first token p95 (ms)", "first_token_p95_ms"),
    ("calls to sick bindings", "calls_to_sick_bindings"),
    ("fallback extra cost", "fallback_extra_cost"),
)


_CAPACITY_ROWS = (
    ("first line isolated at (s)", "trip_s"),
    ("capacity rule fired at (s)", "alert_s"),
    ("k from the run's peaks", "k_from_peaks"),
    ("... rule at that k fires at (s)", "alert_s_at_k_from_peaks"),
    ("first token p95 after trip (ms)", "first_token_p95_ms_after_trip"),
)


def _number(value: float) -> str:
    return f"{value:.6g}"


def _cell(values: Sequence[Any]) -> str:
    """One run's value, or over repeated runs the median and the range (and how many had none)."""
    present = sorted(v for v in values if v is not None)
    if not present:
        return "-"
    if len(values) == 1:
        return _number(present[0])
    middle = statistics.median(present)
    cell = f"{_number(middle)} ({_number(present[0])}..{_number(present[-1])})"
    if len(present) < len(values):
        cell += f" none in {len(values) - len(present)}"
    return cell


def _fault_value(
    summary: Mapping[str, Any], binding: str, window: tuple[Any, ...], key: str
) -> Any:
    for fault in summary.get("faults", []):
        if fault["binding"] == binding and tuple(fault["fault"]) == window:
            return fault.get(key)
    return None


def format_table(summaries: Sequence[Mapping[str, Any]]) -> str:
    """The side-by-side table: one column per scenario/variant; repeated runs share a column."""
    groups: dict[str, list[Mapping[str, Any]]] = {}
    for summary in summaries:
        groups.setdefault(f"{summary['scenario']}/{summary['variant']}", []).append(summary)
    columns = list(groups.values())
    head = [name if len(g) == 1 else f"{name} x{len(g)}" for name, g in groups.items()]
    rows: list[list[str]] = [["", *head]]
    for label, key in _TABLE_ROWS:
        rows.append([label, *(_cell([s.get(key) for s in g]) for g in columns)])
    orgs = sorted({o for s in summaries for o in (s.get("fallback_extra_cost_by_org") or {})})
    for org in orgs:
        values = [
            [(s.get("fallback_extra_cost_by_org") or {}).get(org) for s in g] for g in columns
        ]
        rows.append([f"fallback extra cost, {org}", *(_cell(v) for v in values)])
    for label, key in _CAPACITY_ROWS:
        if any(s.get("capacity") for s in summaries):
            values = [[(s.get("capacity") or {}).get(key) for s in g] for g in columns]
            rows.append([label, *(_cell(v) for v in values)])
    fault_keys = sorted(
        {(f["binding"], tuple(f["fault"])) for s in summaries for f in s.get("faults", [])}
    )
    for binding, window in fault_keys:
        where = f"{binding} [{window[0]:g}-{window[1]:g}s]"
        for label, key in (("isolated after (s)", "isolated_after_s"),
                           ("full traffic after end (s)", "full_traffic_after_end_s"),
                           ("isolations from onset", "isolations")):  # fmt: skip
            cells = [_cell([_fault_value(s, binding, window, key) for s in g]) for g in columns]
            rows.append([f"{where} {label}", *cells])
    widths = [max(len(r[i]) for r in rows) for i in range(len(rows[0]))]
    return "\n".join(
        "  ".join(
            cell.ljust(w) if i == 0 else cell.rjust(w)
            for i, (cell, w) in enumerate(zip(r, widths, strict=True))
        )
        for r in rows
    )
