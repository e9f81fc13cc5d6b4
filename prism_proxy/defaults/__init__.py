"""The core's default hook implementations, registered as internal ``trylast`` plugins.

Each is an ordinary plugin: any installed plugin can override its decision
by answering first.
"""

from __future__ import annotations

from . import auth, classify, route, wires

#: The name the core's ``prism_authenticate`` (everyone, as anonymous) is registered under.
DEFAULT_AUTH = "prism.default-auth"


def default_plugins() -> list[tuple[object, str]]:
    """The core's own plugins; ``classify`` registers each generation's classifier."""
    return [
        (auth, DEFAULT_AUTH),
        (route, "prism.default-route"),
        (classify, "prism.defaults"),
        (wires, "prism.default-wires"),
    ]
