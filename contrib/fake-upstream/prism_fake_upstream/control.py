"""The /_fake/... control API, for driving a fake that runs in another process."""

from __future__ import annotations

import json
from typing import Any

import orjson
from aiohttp import web

from .conditions import add_condition_routes
from .faults import fault_from_json
from .recording import REGISTRY_KEY

__all__ = ["add_control_routes"]


def _error(status: int, message: str) -> web.Response:
    body = {
        "error": {"message": message, "type": "invalid_request_error", "param": None, "code": None}
    }
    return web.Response(status=status, body=orjson.dumps(body), content_type="application/json")


def _reject_constant(name: str) -> Any:
    # NaN and Infinity are not JSON (orjson refused them too), and a NaN
    # delay would pass the non-negative check.
    raise ValueError(f"{name} is not JSON")


async def _set_script(request: web.Request) -> web.Response:
    try:
        # Not orjson: it reads integers beyond 64 bits as floats, and a
        # Fault.usage must reach the client exactly as scripted.
        data: Any = json.loads(await request.read(), parse_constant=_reject_constant)
    except ValueError:
        return _error(400, "body must be a JSON list of faults")
    if not isinstance(data, list):
        return _error(400, "body must be a JSON list of faults")
    try:
        faults = [fault_from_json(item) for item in data]
    except (ValueError, TypeError) as exc:
        return _error(400, f"invalid fault: {exc}")
    request.app[REGISTRY_KEY].set_script(request.match_info["scenario"], faults)
    return web.Response(status=204)


async def _hits(request: web.Request) -> web.Response:
    log = request.app[REGISTRY_KEY].peek(request.match_info["scenario"])
    endpoint = request.query.get("endpoint")
    body = {
        "hits": 0 if log is None else log.hits_for(endpoint),
        "dropped": 0 if log is None else log.dropped,
    }
    return web.Response(body=orjson.dumps(body), content_type="application/json")


async def _reset(request: web.Request) -> web.Response:
    request.app[REGISTRY_KEY].reset()
    return web.Response(status=204)


def add_control_routes(app: web.Application) -> None:
    app.router.add_post("/_fake/script/{scenario}", _set_script)
    app.router.add_get("/_fake/hits/{scenario}", _hits)
    app.router.add_post("/_fake/reset", _reset)
    add_condition_routes(app, app[REGISTRY_KEY].conditions)
