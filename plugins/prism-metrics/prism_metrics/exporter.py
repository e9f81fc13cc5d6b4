"""The process's Prometheus metrics: made once, fed by the hooks and by ``Telemetry``.

Under ``prism serve --workers N`` every worker writes its values into files
in a directory all of them share (prometheus-client's multiprocess mode,
under ``PRISM_WORKERS_DIR``), and whichever worker a scrape reaches adds
them all up.  prometheus-client chooses that mode when it is first
imported, so it is imported here only once the directory is set.
"""

from __future__ import annotations

import logging
import os
import re
from collections.abc import AsyncIterator, Callable, Mapping
from pathlib import Path
from typing import TYPE_CHECKING, Any

from prism_proxy import WORKERS_DIR_ENV, Telemetry

from .families import FAMILIES, Family
from .tally import Tally

if TYPE_CHECKING:
    from prometheus_client import CollectorRegistry

__all__ = ["CONTENT_TYPE", "Exporter"]

log = logging.getLogger("prism.metrics")

CONTENT_TYPE = "text/plain; version=0.0.4; charset=utf-8"
_MULTIPROC_ENV = "PROMETHEUS_MULTIPROC_DIR"
_PID_FILE = re.compile(r"_(\d+)\.db$")


class Exporter(Telemetry):
    """Every metric family of :data:`~.families.FAMILIES`, by name."""

    def __init__(self, *, org_label: bool = False) -> None:
        self.org_label = org_label
        self.shared_dir = _multiprocess_dir()
        import prometheus_client  # after _multiprocess_dir(): the mode is chosen on import

        self.registry: CollectorRegistry = prometheus_client.CollectorRegistry()
        self.families: dict[str, Family] = {family.name: family for family in FAMILIES}
        self.metrics: dict[str, Any] = {
            family.name: self._make(prometheus_client, family) for family in FAMILIES
        }
        #: What calls counted, not yet handed to prometheus-client (folded on a scrape).
        self.tally = Tally()
        # Label children, looked up once: prometheus-client's lookup takes a lock.
        self._children: dict[tuple[Any, ...], Any] = {}
        #: Event counter values already added to ``prism_events_total``.
        self._events: dict[str, int] = {}
        self._unknown: set[str] = set()
        #: Gauges by organisation (``org`` families): family -> other labels -> org -> value.
        #: Kept whether or not ``org`` is exported: the board reads them, and without the
        #: label the one series is their highest.
        self._by_org: dict[str, dict[tuple[tuple[str, str], ...], _Levels]] = {}

    async def lifecycle(self) -> AsyncIterator[None]:
        yield  # nothing to open or close: the values live in memory (or the shared files)

    def labels_of(self, name: str) -> tuple[str, ...]:
        family = self.families[name]
        if family.org and self.org_label:
            return (*family.labels, "org")
        return family.labels

    def _make(self, prometheus_client: Any, family: Family) -> Any:
        labels = self.labels_of(family.name)
        name = family.name.removesuffix("_total") if family.kind == "counter" else family.name
        common: dict[str, Any] = {"labelnames": labels, "registry": self.registry}
        if family.kind == "counter":
            return prometheus_client.Counter(name, family.help, **common)
        if family.kind == "histogram":
            return prometheus_client.Histogram(name, family.help, buckets=family.buckets, **common)
        return prometheus_client.Gauge(
            name, family.help, multiprocess_mode=family.combine, **common
        )

    def child(self, metric: Any, *labels: str) -> Any:
        """``metric.labels(*labels)``, from a cache."""
        key = (id(metric), *labels)
        child = self._children.get(key)
        if child is None:
            child = self._children[key] = metric.labels(*labels)
        return child

    # -- Telemetry: what other plugins (and the core) report ----------------------

    def count(self, name: str, amount: float = 1.0, **labels: str) -> None:
        metric = self._metric(name)
        if metric is not None:
            self.tally.add(self._labelled(metric, labels), amount)

    def observe(self, name: str, value: float, **labels: str) -> None:
        metric = self._metric(name)
        if metric is not None:
            self.tally.observe(self._labelled(metric, labels), value)

    def set(self, name: str, value: float, **labels: str) -> None:
        metric = self._metric(name)
        if metric is None:
            return
        family = self.families[name]
        if family.kind != "gauge":
            if name not in self._unknown:
                self._unknown.add(name)
                log.warning("metrics: %s is a %s, not a gauge; set() dropped", name, family.kind)
            return
        if family.org:
            org = labels.pop("org", "")
            rest = tuple(sorted(labels.items()))
            levels = self._by_org.setdefault(name, {}).get(rest)
            if levels is None:
                levels = self._by_org[name][rest] = _Levels()
            highest = levels.set(org, value)
            if self.org_label:
                labels["org"] = org
            else:
                value = highest
        self._labelled(metric, labels).set(value)

    def by_org(self, name: str) -> dict[str, float]:
        """The value of gauge ``name`` per organisation in this process (the highest over
        its other labels): the board reads it whether or not ``org`` is exported."""
        found: dict[str, float] = {}
        for levels in self._by_org.get(name, {}).values():
            for org, value in levels.values.items():
                found[org] = max(value, found.get(org, value))
        return found

    def _labelled(self, metric: Any, labels: Mapping[str, str]) -> Any:
        if not labels:
            return metric
        key = (id(metric), *labels.items())
        child = self._children.get(key)
        if child is None:
            child = self._children[key] = metric.labels(**labels)
        return child

    def _metric(self, name: str) -> Any:
        metric = self.metrics.get(name)
        if metric is None and name not in self._unknown:
            self._unknown.add(name)
            log.warning("metrics: %s is not a metric Prism exports; dropped", name)
        return metric

    # -- what is read when it is asked for ---------------------------------------

    def events(self, counters: Mapping[str, int]) -> None:
        """Bring ``prism_events_total`` up to the gateway's event counters."""
        metric = self.metrics["prism_events_total"]
        for event, value in list(counters.items()):
            added = value - self._events.get(event, 0)
            if added > 0:
                metric.labels(event=event).inc(added)
                self._events[event] = value

    def render(self, refresh: Callable[[], None]) -> bytes:
        """The exposition text: ``refresh`` sets the gauges read at scrape time first."""
        import prometheus_client
        from prometheus_client import multiprocess

        self.tally.fold()
        refresh()
        if self.shared_dir is None:
            return bytes(prometheus_client.generate_latest(self.registry))
        _forget_dead_workers(self.shared_dir, multiprocess.mark_process_dead)
        merged = prometheus_client.CollectorRegistry()
        multiprocess.MultiProcessCollector(merged, path=str(self.shared_dir))  # type: ignore[no-untyped-call]
        return bytes(prometheus_client.generate_latest(merged))


class _Levels:
    """One gauge's value per organisation, and the highest of them (kept, not searched for)."""

    __slots__ = ("highest", "values")

    def __init__(self) -> None:
        self.values: dict[str, float] = {}
        self.highest = 0.0

    def set(self, org: str, value: float) -> float:
        before = self.values.get(org)
        self.values[org] = value
        if value >= self.highest:
            self.highest = value
        elif before is not None and before >= self.highest:
            # The highest one came down: look again (only then is every org visited).
            self.highest = max(self.values.values())
        return self.highest


def _multiprocess_dir() -> Path | None:
    """Under ``--workers``: the shared metrics directory, made and told to prometheus-client."""
    workers_dir = os.environ.get(WORKERS_DIR_ENV)
    if not workers_dir:
        return None
    path = Path(workers_dir) / "metrics"
    path.mkdir(exist_ok=True)
    os.environ[_MULTIPROC_ENV] = str(path)
    return path


def _forget_dead_workers(path: Path, mark_dead: Callable[[int, str], None]) -> None:
    """A worker that died keeps its counters (totals never go down) but not its live gauges."""
    pids = {int(m.group(1)) for f in path.iterdir() if (m := _PID_FILE.search(f.name))}
    for pid in pids:
        try:
            os.kill(pid, 0)
        except ProcessLookupError:
            mark_dead(pid, str(path))
        except PermissionError:
            pass  # alive, someone else's
