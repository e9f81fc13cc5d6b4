"""Percentiles of measured values, computed one way wherever the gateway reports them.

prism-breaker reports first-token latency and prism-metrics a line's queue
waits with the same nearest-rank rule, so the two never disagree on what
"p95" means.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

__all__ = ["percentile"]


def percentile(sorted_values: Sequence[float], q: float) -> float | None:
    """Nearest-rank percentile of already sorted values (None when empty)."""
    if not sorted_values:
        return None
    rank = max(1, math.ceil(q * len(sorted_values)))
    return round(sorted_values[rank - 1], 1)
