"""prism-metrics: Prometheus metrics that add up across workers, and the live board."""

from .exporter import Exporter
from .families import FAMILIES, Family
from .hooks import MetricsHooks
from .plugin import HOOKS_NAME, metrics_of
from .settings import MetricsSettings

__all__ = [
    "FAMILIES",
    "HOOKS_NAME",
    "Exporter",
    "Family",
    "MetricsHooks",
    "MetricsSettings",
    "metrics_of",
]
