"""Measurements plugins report, for whichever plugin exports them (prism-metrics: Prometheus).

A plugin that measures something only it can see (the ledger's commit time,
the cost it billed, a key it refused) reports it on the ``TELEMETRY`` service
(also ``generation.telemetry``); the core's own :class:`Telemetry` drops
everything, so reporting costs a method call when no exporter is installed.
An exporter provides a subclass as the service, usually kept across
generations so kept objects keep reporting to it.
"""

from __future__ import annotations

__all__ = ["WORKERS_DIR_ENV", "Telemetry"]

#: Set by ``prism serve --workers N`` for its workers: a directory they all share
#: (and nobody else), made before they start and removed when the server stops.
#: State that must add up across workers lives there (prism-metrics' counters).
WORKERS_DIR_ENV = "PRISM_WORKERS_DIR"


class Telemetry:
    """Where measurements go.  ``name`` is the exported name (``prism_cost_total``);
    labels are bounded values: never a key, a prompt, a request id or an
    organisation (unless the exporter is told it may)."""

    def count(self, name: str, amount: float = 1.0, **labels: str) -> None:
        """Add ``amount`` to a counter."""

    def observe(self, name: str, value: float, **labels: str) -> None:
        """Record one value of a distribution (a histogram: seconds, tokens)."""

    def set(self, name: str, value: float, **labels: str) -> None:
        """Set a gauge to ``value`` (a level: a share of a budget used, a queue's depth)."""
