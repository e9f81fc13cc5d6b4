"""``[prism:metrics]``: what the metrics may carry, and the capacity rule's knobs."""

from __future__ import annotations

import attrs

from prism_proxy import Config

__all__ = ["SECTION", "MetricsSettings"]

SECTION = "metrics"
_KEYS = frozenset({"org_label", "capacity_window_s", "capacity_k"})


@attrs.frozen
class MetricsSettings:
    #: Add ``org`` to ``prism_requests_total`` (off: organisation names are not bounded
    #: by anything Prism controls, and some operators consider them sensitive).
    org_label: bool = False
    #: The window the capacity rule takes in-flight peaks over.
    capacity_window_s: float = 3600.0
    #: The capacity rule's multiple; None (the default) leaves the rule off.
    capacity_k: float | None = None

    @classmethod
    def from_config(cls, config: Config) -> MetricsSettings:
        section = config.section(SECTION)
        section.check_keys(_KEYS)
        k = section.get_str("capacity_k")
        return cls(
            org_label=section.get_bool("org_label", False),
            capacity_window_s=section.get_float(
                "capacity_window_s", 3600.0, min=60.0, max=7 * 86400.0
            ),
            capacity_k=None if k is None else section.get_float("capacity_k", 1.0, min=0.0),
        )
