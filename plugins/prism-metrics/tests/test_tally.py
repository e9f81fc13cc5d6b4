"""The tally folds into prometheus-client exactly what direct updates would have made."""

from __future__ import annotations

import random

import prometheus_client
from prism_metrics.tally import Tally


def exposition(direct: bool, values: list[float]) -> bytes:
    registry = prometheus_client.CollectorRegistry()
    counter = prometheus_client.Counter("calls", "c", ["kind"], registry=registry)
    gauge = prometheus_client.Gauge("inflight", "g", ["kind"], registry=registry)
    histogram = prometheus_client.Histogram(
        "seconds", "h", ["kind"], buckets=(0.125, 0.5, 1.0, 5.0), registry=registry
    )
    tally = Tally()
    for i, value in enumerate(values):
        kind = "even" if i % 2 == 0 else "odd"
        if direct:
            counter.labels(kind).inc(2)
            gauge.labels(kind).inc()
            gauge.labels(kind).dec()
            gauge.labels(kind).inc()
            histogram.labels(kind).observe(value)
        else:
            tally.add(counter.labels(kind), 2)
            tally.add(gauge.labels(kind))
            tally.add(gauge.labels(kind), -1)
            tally.add(gauge.labels(kind))
            tally.observe(histogram.labels(kind), value)
        if i == len(values) // 2:
            tally.fold()  # folding twice counts nothing twice
    tally.fold()
    tally.fold()
    text = prometheus_client.generate_latest(registry)
    # Creation times differ between the two registries; nothing else may.
    return b"\n".join(line for line in text.splitlines() if b"_created" not in line)


def test_folded_counts_equal_direct_updates_bucket_for_bucket():
    rng = random.Random(7)
    # Values on the bounds themselves fall in that bucket (le), and beyond the last in +Inf.
    # Eighths add up exactly in any order, so the sums can be compared as text.
    values = [0.125, 0.5, 1.0, 5.0, 0.0, 7.5] + [rng.randrange(0, 48) / 8 for _ in range(200)]
    folded = exposition(False, values)
    assert folded == exposition(True, values)
    assert b'seconds_bucket{kind="even",le="0.125"}' in folded
    assert b'calls_total{kind="odd"} 206.0' in folded
