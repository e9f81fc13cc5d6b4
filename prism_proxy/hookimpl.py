"""The marker plugins use to implement hooks: ``@prism_proxy.hookimpl``."""

import pluggy

hookimpl = pluggy.HookimplMarker("prism_proxy")
