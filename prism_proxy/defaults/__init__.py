"""The core's default hook implementations, registered as internal ``trylast`` plugins.

Each is an ordinary plugin: any installed plugin can override its decision
by answering first.
"""

from __future__ import annotations

from . import auth, classify, route, wires


def default_plugins() -> list[tuple[object, str]]:
    """The core's own plugins; ``classify`` registers each generation's classifier."""
    return [
        (auth, "prism.default-auth"),
        (route, "prism.default-route"),
        (classify, "prism.defaults"),
        (wires, "prism.default-wires"),
    ]
