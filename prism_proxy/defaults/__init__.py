"""The core's default hook implementations, registered as internal ``trylast`` plugins.

Each is an ordinary plugin: any installed plugin can override its decision
by answering first.
"""

from __future__ import annotations

from . import auth, route
from .classify import DefaultClassify


def default_plugins() -> list[tuple[object, str]]:
    """Fresh instances for one plugin manager (no state shared between apps)."""
    return [
        (auth, "prism.default-auth"),
        (route, "prism.default-route"),
        (DefaultClassify(), "prism.default-classify"),
    ]
