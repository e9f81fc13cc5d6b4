"""The HTTP endpoints: the OpenAI-compatible API and the liveness/readiness probes."""

from __future__ import annotations

import asyncio
import logging
from typing import Any

import orjson
from aiohttp import web

from .call import Call, Endpoint, Settlement, new_id
from .dispatch import ChainDeadline, PassThrough, dispatch, exhausted
from .errors import PrismError
from .gateway import GATEWAY, Gateway
from .record import prism_headers
from .relay import error_answer, relay, relay_degraded
from .wire import ANTHROPIC, OPENAI, wire_for
from .wire.anthropic import validate_messages
from .wire.openai import validate_chat, validate_embeddings

__all__ = ["add_routes", "add_unmatched_route"]

log = logging.getLogger("prism")


def add_routes(app: web.Application) -> None:
    app.router.add_post("/v1/chat/completions", chat_completions)
    app.router.add_post("/v1/embeddings", embeddings)
    app.router.add_post("/v1/messages", messages)
    app.router.add_get("/v1/models", list_models)
    app.router.add_get("/v1/models/{model:.+}", get_model)
    app.router.add_get("/healthz", healthz)
    app.router.add_get("/readyz", readyz)
    app.router.add_get("/prism/stats", stats)


def add_unmatched_route(app: web.Application) -> None:
    """Answer every path and method no route takes, in JSON; added after every other route."""
    app.router.add_route("*", "/{unmatched:.*}", unmatched)


async def unmatched(request: web.Request) -> web.Response:
    """404 ``not_found``, or 405 ``method_not_allowed`` with ``Allow`` when the path exists."""
    allowed: set[str] = set()
    this = request.match_info.route.resource
    for resource in request.app.router.resources():
        if resource is not this:
            allowed |= (await resource.resolve(request))[1]
    wire = ANTHROPIC if _anthropic_client(request) else OPENAI
    if allowed:
        methods = ", ".join(sorted(allowed))
        err = PrismError(
            405,
            "method_not_allowed",
            f"{request.method} is not allowed on this path (allowed: {methods})",
        )
        return web.Response(
            status=405,
            body=wire.error_body(err),
            content_type="application/json",
            headers={"Allow": methods},
        )
    err = PrismError(404, "not_found", "no endpoint at this path")
    return web.Response(status=404, body=wire.error_body(err), content_type="application/json")


async def chat_completions(request: web.Request) -> web.StreamResponse:
    return await _handle(request, Endpoint.CHAT)


async def embeddings(request: web.Request) -> web.StreamResponse:
    return await _handle(request, Endpoint.EMBEDDINGS)


async def messages(request: web.Request) -> web.StreamResponse:
    return await _handle(request, Endpoint.MESSAGES)


async def _read_json(request: web.Request, limit: int, stall_s: float) -> dict[str, Any]:
    kind = request.headers.get("Content-Type")
    if kind is not None and not _is_json(kind):
        raise PrismError(
            415,
            "unsupported_media_type",
            "the request body must be JSON (Content-Type: application/json)",
            param="Content-Type",
        )
    length = request.content_length
    if length is not None and length > limit:
        raise _too_large(limit)
    raw = await _read_body(request, limit, stall_s)
    if length is not None and len(raw) < length:
        raise PrismError(400, "invalid_json", "the request body is shorter than its Content-Length")
    try:
        body = orjson.loads(raw)
    except orjson.JSONDecodeError:
        raise PrismError(400, "invalid_json", "the request body is not valid JSON") from None
    if not isinstance(body, dict):
        raise PrismError(400, "invalid_json", "the request body must be a JSON object")
    return body


def _is_json(content_type: str) -> bool:
    media = content_type.partition(";")[0].strip().lower()
    return media == "application/json" or (
        media.startswith("application/") and media.endswith("+json")
    )


async def _read_body(request: web.Request, limit: int, stall_s: float) -> bytes:
    """The whole body, counted against ``limit`` as it arrives.

    What has arrived is taken without waiting (usually the whole body); a
    body that then pauses longer than ``stall_s`` between reads is answered
    408 rather than holding the connection open.
    """
    content = request.content
    chunks = []
    size = 0
    while True:
        chunk = content.read_nowait()
        if not chunk:
            if content.at_eof():
                break
            try:
                async with asyncio.timeout(stall_s):
                    chunk = await content.readany()
            except TimeoutError:
                raise PrismError(
                    408,
                    "request_timeout",
                    f"the request body stalled for more than {stall_s:g} s",
                    param="body",
                ) from None
            if not chunk:
                break
        size += len(chunk)
        if size > limit:
            raise _too_large(limit)
        chunks.append(chunk)
    return chunks[0] if len(chunks) == 1 else b"".join(chunks)


def _too_large(limit: int) -> PrismError:
    return PrismError(
        413, "body_too_large", f"the request body exceeds the limit of {limit} bytes", param="body"
    )


async def _handle(request: web.Request, endpoint: Endpoint) -> web.StreamResponse:
    gw = request.app[GATEWAY]
    call = Call(
        request_id=new_id("req_"),
        endpoint=endpoint,
        received_at=gw.clock(),
        request=request,
        attempt_timeout_s=gw.config.attempt_timeout_ms / 1000,
    )
    try:
        call.body = await _read_json(
            request, gw.config.max_body_bytes, gw.config.header_timeout_s
        )
        if endpoint is Endpoint.CHAT:
            call.model_name, call.stream, call.include_usage = validate_chat(call.body)
        elif endpoint is Endpoint.MESSAGES:
            call.model_name, call.stream = validate_messages(call.body)
        else:
            call.model_name = validate_embeddings(call.body)
        principal = gw.hot.prism_authenticate(call=call, request=request)
        if principal is not None:
            call.principal = principal
        call.model = gw.catalog.resolve(call.model_name)
        if call.model is None:
            raise PrismError(
                404,
                "model_not_found",
                f"model '{call.model_name}' is not in the catalog (GET /v1/models lists them)",
                param="model",
            )
        if gw.hot.prism_call_start is not None:
            gw.hot.prism_call_start(call=call, request=request)
        call.route = gw.hot.prism_select_route(call=call, model=call.model)
        if call.route is None:
            raise exhausted(call)
        served = await dispatch(gw, call)
        return await relay(gw, call, served, request)
    except PassThrough as rejected:
        return await _pass_through(gw, call, rejected)
    except ChainDeadline as err:
        if call.model is not None and call.model.degraded and endpoint is not Endpoint.EMBEDDINGS:
            return await relay_degraded(gw, call, call.model.degraded, request)
        return await _error_response(gw, call, err)
    except PrismError as err:
        return await _error_response(gw, call, err)
    except asyncio.CancelledError:
        served_attempt = call.served
        await gw.settle(call, Settlement("aborted", 499, served_attempt, None, "client_closed"))
        raise
    except Exception:
        log.exception("unexpected failure in %s", call.request_id)
        if call.settled:
            raise
        failure = PrismError(
            500,
            "internal_error",
            f"Prism failed unexpectedly; the log has the details under {call.request_id}",
            type="api_error",
        )
        return await _error_response(gw, call, failure)


async def _pass_through(gw: Gateway, call: Call, rejected: PassThrough) -> web.Response:
    """The caller's own mistake, as the upstream said it.

    Unchanged when the caller speaks the upstream's wire format; otherwise the
    upstream's message in the caller's error shape, with the same status.  An
    error event inside a 200 stream is answered as the 400 it stands for.
    """
    result = rejected.result
    status = 400 if result.status in (None, 200) else result.status
    await gw.settle(call, Settlement("error", status, None, None, "upstream_request_error"))
    headers = prism_headers(call)
    headers["Content-Type"] = "application/json"
    provider = gw.providers[rejected.attempt.binding.provider]
    client_wire = wire_for(call.endpoint)
    if client_wire.name == provider.wire and isinstance(result.json, dict):
        return web.Response(status=status, body=result.body, headers=headers)
    err = PrismError(status, "upstream_request_error", _upstream_message(result.json))
    return web.Response(status=status, body=client_wire.error_body(err), headers=headers)


def _upstream_message(payload: Any) -> str:
    error = payload.get("error") if isinstance(payload, dict) else None
    message = error.get("message") if isinstance(error, dict) else None
    return str(message) if message else "the upstream rejected the request"


async def _error_response(gw: Gateway, call: Call, err: PrismError) -> web.Response:
    await gw.settle(call, Settlement("error", err.status, None, None, err.code))
    return error_answer(call, err)


def _anthropic_client(request: web.Request) -> bool:
    """The Anthropic SDK sends anthropic-version; it expects its own shapes."""
    return "anthropic-version" in request.headers or request.path.startswith("/v1/messages")


async def list_models(request: web.Request) -> web.Response:
    catalog = request.app[GATEWAY].catalog
    names = list(catalog.models)
    if _anthropic_client(request):
        body: dict[str, Any] = {
            "data": [_anthropic_model(name) for name in names],
            "has_more": False,
            "first_id": names[0] if names else None,
            "last_id": names[-1] if names else None,
        }
    else:
        body = {"object": "list", "data": [_model_object(name) for name in names]}
    return web.json_response(body, dumps=_dumps)


async def get_model(request: web.Request) -> web.Response:
    catalog = request.app[GATEWAY].catalog
    name = request.match_info["model"]
    anthropic = _anthropic_client(request)
    if catalog.resolve(name) is None:
        err = PrismError(
            404, "model_not_found", f"model '{name}' is not in the catalog", param="model"
        )
        wire = ANTHROPIC if anthropic else OPENAI
        return web.Response(status=404, body=wire.error_body(err), content_type="application/json")
    body = _anthropic_model(name) if anthropic else _model_object(name)
    return web.json_response(body, dumps=_dumps)


def _model_object(name: str) -> dict[str, Any]:
    return {"id": name, "object": "model", "created": 0, "owned_by": "prism"}


def _anthropic_model(name: str) -> dict[str, Any]:
    return {"type": "model", "id": name, "display_name": name, "created_at": "1970-01-01T00:00:00Z"}


def _dumps(value: Any) -> str:
    return orjson.dumps(value).decode()


async def healthz(request: web.Request) -> web.Response:
    return web.json_response({"status": "alive"})


async def readyz(request: web.Request) -> web.Response:
    gw = request.app[GATEWAY]
    if gw.draining:
        return web.json_response({"status": "draining"}, status=503)
    if not gw.ready:
        return web.json_response({"status": "starting"}, status=503)
    plugins = sorted(name for name, _ in gw.pm.list_name_plugin())
    return web.json_response(
        {"status": "ready", "plugins": plugins, "models": len(gw.catalog.models)}
    )


async def stats(request: web.Request) -> web.Response:
    """Event counters (no secrets, no prompt data): e.g. ``chain_exceeded_max_time``."""
    counters = request.app[GATEWAY].counters
    return web.json_response({"counters": dict(counters)}, dumps=_dumps)
