"""prism-timeout-header: the ``x-prism-timeout-ms`` request header."""

from .policy import TimeoutPolicy, apply_header

__all__ = ["TimeoutPolicy", "apply_header"]
