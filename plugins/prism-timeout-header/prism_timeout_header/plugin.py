"""The prism_proxy entry point ``timeout-header``."""

from __future__ import annotations

from prism_proxy import Call, Generation, hookimpl

from .policy import HEADER, TimeoutPolicy, apply_header

PLUGIN_NAME = "timeout-header"


@hookimpl
def prism_generation(generation: Generation) -> None:
    policy = TimeoutPolicy.from_config(generation.config)
    generation.register(TimeoutHeader(policy), f"{PLUGIN_NAME}.policy")


class TimeoutHeader:
    """``x-prism-timeout-ms`` for one generation's bounds."""

    def __init__(self, policy: TimeoutPolicy) -> None:
        self.policy = policy

    @hookimpl
    def prism_call_start(self, call: Call) -> None:
        applied = apply_header(self.policy, call.request.headers.get(HEADER))
        if applied is None:
            return
        call.attempt_timeout_s = applied.timeout_ms / 1000
        call.timeout_retry = applied.timeout_retry
        if applied.ignored:
            call.response_headers["x-prism-timeout-ignored"] = applied.ignored
        else:
            call.response_headers[HEADER] = str(applied.timeout_ms)
