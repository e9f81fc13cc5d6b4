"""The core's distribution name, in one place.

The import package is ``prism_proxy``, but what pip installs (and what
``prism --version``, ``prism plugins`` and the upstream ``User-Agent`` report)
is the distribution ``prism-llm-gateway``: ``prism-proxy`` belongs to an
unrelated project on the public package index.
"""

from __future__ import annotations

__all__ = ["DISTRIBUTION"]

DISTRIBUTION = "prism-llm-gateway"
