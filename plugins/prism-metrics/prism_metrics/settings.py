"""``[prism:metrics]``: what the metrics may carry, and the capacity rule's knobs."""

from __future__ import annotations

import attrs

from prism_proxy import Config, read_settings, setting

__all__ = ["SECTION", "MetricsSettings"]

SECTION = "metrics"


@attrs.frozen
class MetricsSettings:
    org_label: bool = setting(
        False,
        help="add `org` to `prism_requests_total` and `prism_budget_used_ratio`, and name "
        "organisations on the board to everyone (off by default: organisation names are not "
        "bounded by anything Prism controls, and some operators consider them sensitive)",
    )
    capacity_window_s: float = setting(
        3600.0,
        min=60.0,
        max=7 * 86400.0,
        help="the window of in-flight peaks the capacity rule uses",
    )
    capacity_k: float | None = setting(
        None,
        min=0.0,
        help="the capacity rule's multiple k (*The capacity rule* above)",
        default_text="unset: rule off",
    )

    @classmethod
    def from_config(cls, config: Config) -> MetricsSettings:
        return read_settings(cls, config.section(SECTION))
