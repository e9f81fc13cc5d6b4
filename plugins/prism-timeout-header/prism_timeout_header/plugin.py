"""The prism_proxy entry point ``timeout-header``."""

from __future__ import annotations

from aiohttp import web

from prism_proxy import Call, Catalog, Config, hookimpl

from .policy import HEADER, TimeoutPolicy, apply_header

POLICY = web.AppKey("prism_timeout_header_policy", TimeoutPolicy)


@hookimpl
def prism_configure(config: Config, catalog: Catalog) -> None:
    TimeoutPolicy.from_config(config)


@hookimpl
def prism_app_setup(app: web.Application, config: Config) -> None:
    app[POLICY] = TimeoutPolicy.from_config(config)


@hookimpl
def prism_call_start(call: Call, request: web.Request) -> None:
    applied = apply_header(request.app[POLICY], request.headers.get(HEADER))
    if applied is None:
        return
    call.attempt_timeout_s = applied.timeout_ms / 1000
    call.timeout_retry = applied.timeout_retry
    if applied.ignored:
        call.response_headers["x-prism-timeout-ignored"] = applied.ignored
    else:
        call.response_headers[HEADER] = str(applied.timeout_ms)
