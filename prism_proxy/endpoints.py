"""The HTTP endpoints: the OpenAI-compatible API and the liveness/readiness probes."""

from __future__ import annotations

import asyncio
import hmac
import logging
import os
from collections.abc import Awaitable
from typing import Any

import orjson
from aiohttp import web

from . import settlements
from .admin import ADMIN_HEADER, admin_handler, is_admin
from .answers import Answer, BodyAnswer, client_wire, error_response, gone, refusal, settle
from .call import Call, Endpoint, new_id
from .callers import authenticate, caller
from .catalog import ModelSpec
from .dispatch import ChainDeadline, PassThrough, dispatch, exhausted
from .errors import ECHO_LIMIT, ConfigError, PrismError, echo
from .gateway import GATEWAY
from .generation import Generation
from .record import REQUEST_ID_HEADER
from .relay import degraded, relay
from .request_body import read_json
from .responses_endpoints import (
    COUNT_TOKENS_PATH,
    count_tokens,
    delete_response,
    expand_previous,
    get_response,
    list_input_items,
    remember,
)
from .selflink import INTERNAL_HEADER
from .wire import ANTHROPIC
from .wire.anthropic import validate_messages
from .wire.openai import validate_chat, validate_embeddings
from .wire.responses import validate_responses

__all__ = ["add_routes", "add_unmatched_route"]

log = logging.getLogger("prism")
# Enum members bound to names once (why: prism_proxy.call, above Endpoint).
_CHAT, _MESSAGES, _RESPONSES = Endpoint.CHAT, Endpoint.MESSAGES, Endpoint.RESPONSES


def add_routes(app: web.Application) -> None:
    app.router.add_post("/v1/chat/completions", chat_completions)
    app.router.add_post("/v1/embeddings", embeddings)
    app.router.add_post("/v1/messages", messages)
    app.router.add_post("/v1/responses", responses)
    app.router.add_get("/v1/responses/{response_id}", get_response)
    app.router.add_delete("/v1/responses/{response_id}", delete_response)
    app.router.add_get("/v1/responses/{response_id}/input_items", list_input_items)
    app.router.add_post(COUNT_TOKENS_PATH, count_tokens)
    app.router.add_get("/v1/models", list_models)
    app.router.add_get("/v1/models/{model:.+}", get_model)
    app.router.add_get("/healthz", healthz)
    app.router.add_get("/readyz", readyz)
    app.router.add_get("/prism/stats", stats)
    app.router.add_post("/prism/admin/reload", reload)


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
    wire = client_wire(request)
    if allowed:
        methods = ", ".join(sorted(allowed))
        err = PrismError(
            405,
            "method_not_allowed",
            f"{echo(request.method)} is not allowed on this path (allowed: {methods})",
        )
        return error_response(err, wire=wire, headers={"Allow": methods})
    api = _api_endpoints(request.app)
    err = PrismError(
        404,
        "not_found",
        f"no endpoint at {echo(request.path)}; the API's endpoints are {', '.join(api)}",
        extra={"endpoints": api},
    )
    return error_response(err, wire=wire)


def _api_endpoints(app: web.Application) -> list[str]:
    """``METHOD /path`` of every route under ``/v1/``, as this app serves them.

    Read from the router, so a mounted app's prefix and an endpoint a plugin
    adds are listed as they are; the operator's routes (admin, metrics) are
    not a caller's business.
    """
    listed: dict[str, None] = {}
    for route in app.router.routes():
        path = route.resource.canonical if route.resource is not None else ""
        if "/v1/" in path and route.method not in ("HEAD", "*"):
            listed[f"{route.method} {path}"] = None
    return list(listed)


async def chat_completions(request: web.Request) -> web.StreamResponse:
    return await _handle(request, _CHAT)


async def embeddings(request: web.Request) -> web.StreamResponse:
    return await _handle(request, Endpoint.EMBEDDINGS)


async def messages(request: web.Request) -> web.StreamResponse:
    return await _handle(request, _MESSAGES)


async def responses(request: web.Request) -> web.StreamResponse:
    """OpenAI's Responses API, translated onto each line's own (``prism_proxy.wire.responses``)."""
    return await _handle(request, _RESPONSES)


async def _handle(request: web.Request, endpoint: Endpoint) -> web.StreamResponse:
    """A call's whole life: on the generation serving now, settled once on every path."""
    gateway = request.app[GATEWAY]
    generation = gateway.enter()
    call = Call(
        request_id=new_id("req_"),
        endpoint=endpoint,
        received_at=generation.clock(),
        request=request,
        generation=generation,
        attempt_timeout_s=generation.config.attempt_timeout_ms / 1000,
    )
    try:
        try:
            answer = await _answer(generation, call)
        except BaseException as left:
            # Cancelled before its answer was whole: the caller left, or shutdown's grace ran out.
            if isinstance(left, settlements.Abandoned):
                ended = left.settlement
            else:
                ended = settlements.aborted(call.served)
            await settle(generation, call, ended)
            raise
        recorded = await settle(generation, call, answer.settlement)
        if endpoint is _RESPONSES and recorded:
            # Kept before the last bytes leave: a follow-up sent on them finds it.
            await remember(generation, call, answer)
        return await answer.finish(call, recorded)
    finally:
        slot = call.slot
        if slot is not None:
            slot.give_back()
        gateway.leave(generation)


async def _answer(generation: Generation, call: Call) -> Answer:
    """Serve ``call``: every path returns what is left to send, with its settlement."""
    config, hooks = generation.config, generation.hooks
    try:
        body = await read_json(call.request, config.max_body_bytes, config.header_timeout_s)
        call.body = body
        endpoint = call.endpoint
        if endpoint is _CHAT:
            call.model_name, call.stream, call.include_usage = validate_chat(body)
        elif endpoint is _MESSAGES:
            call.model_name, call.stream = validate_messages(body)
        elif endpoint is _RESPONSES:
            call.model_name, call.stream = validate_responses(body)
        else:
            call.model_name = validate_embeddings(body)
        name = call.model_name
        if len(name) > ECHO_LIMIT and generation.catalog.resolve(name) is None:
            # A name no catalog has is cut before an answer, a log line or a ledger
            # row repeats it: a hostile 100 KB name costs what a short one does.
            call.model_name = echo(name)
        if not _internal(call, generation):
            authenticate(generation, call)
            _traffic(generation, call)
        if endpoint is _RESPONSES:
            await expand_previous(generation, call)
        call.model = generation.catalog.resolve(call.model_name)
        if call.model is None:
            raise PrismError(
                404,
                "model_not_found",
                f"model '{call.model_name}' is not in the catalog (GET /v1/models lists them)",
                param="model",
            )
        if hooks.call_start is not None:
            hooks.call_start(call=call)
        call.route = hooks.select_route(call=call, model=call.model) if hooks.select_route else None
        if call.route is None:
            raise exhausted(call)
        if hooks.admit_call is not None:
            pending = hooks.admit_call(call=call)
            if pending:
                await _admitted(pending)
        served = await dispatch(generation, call)
        return await relay(call, served)
    except PassThrough as rejected:
        return _pass_through(generation, call, rejected)
    except ChainDeadline as err:
        model = call.model
        if model is not None and model.degraded and call.endpoint is not Endpoint.EMBEDDINGS:
            return await degraded(call, model.degraded, err)
        return refusal(err)
    except PrismError as err:
        return refusal(err)
    except ConnectionResetError:
        # The caller left while its answer was being written (a relay answers that
        # itself, with what was delivered), before aiohttp noticed and cancelled us.
        return gone(settlements.aborted(call.served))
    except Exception:
        log.exception("unexpected failure in %s", call.request_id)
        failure = PrismError(
            500,
            "internal_error",
            f"Prism failed unexpectedly; the log has the details under {call.request_id}",
            type="api_error",
        )
        return refusal(failure)


async def _admitted(pending: list[Awaitable[None]]) -> None:
    """Wait for every admission (each reserved what it could), then refuse on the first no."""
    if len(pending) == 1:
        await pending[0]
        return
    for outcome in await asyncio.gather(*pending, return_exceptions=True):
        if isinstance(outcome, BaseException):
            raise outcome


#: Marks a call as operator traffic (a kind a plugin registers, ``prism_traffic_kinds``):
#: never billed to a customer, never evidence for the breaker.  Only with the
#: admin token or the internal one.
TRAFFIC_HEADER = "x-prism-traffic"


def _internal(call: Call, generation: Generation) -> bool:
    """A call Prism makes to itself (a probe): its internal token, no authentication."""
    presented = call.request.headers.get(INTERNAL_HEADER)
    if presented is None:
        return False
    token = generation.self_link.token
    if not hmac.compare_digest(presented.encode(), token.encode()):
        raise PrismError(403, "invalid_internal_token", f"{INTERNAL_HEADER} is not this gateway's")
    # No default kind: the core names none, the plugin sending the call does.
    call.traffic = _traffic_kind(generation, call.request.headers.get(TRAFFIC_HEADER, ""))
    return True


def _traffic(generation: Generation, call: Call) -> None:
    kind = call.request.headers.get(TRAFFIC_HEADER)
    if kind is None:
        return
    kind = _traffic_kind(generation, kind)
    if not is_admin(call.request, header=ADMIN_HEADER):
        raise PrismError(
            403,
            "traffic_not_allowed",
            f"{TRAFFIC_HEADER} needs the admin token in {ADMIN_HEADER}",
            param=TRAFFIC_HEADER,
        )
    call.traffic = kind


def _traffic_kind(generation: Generation, kind: str) -> str:
    kinds = generation.traffic_kinds
    if kind not in kinds:
        raise PrismError(
            400,
            "invalid_traffic",
            f"{TRAFFIC_HEADER} must be one of the traffic kinds plugins register: "
            f"{', '.join(sorted(kinds)) or 'none'}",
            param=TRAFFIC_HEADER,
        )
    return kind


def _pass_through(generation: Generation, call: Call, rejected: PassThrough) -> Answer:
    """The caller's own mistake, as the upstream said it.

    Unchanged when the caller speaks the upstream's wire format; otherwise the
    upstream's message in the caller's error shape, with the same status.  An
    error event inside a 200 stream is answered as the 400 it stands for.
    """
    result = rejected.result
    status = 400 if result.status in (None, 200) else result.status
    err = PrismError(status, "upstream_request_error", _upstream_message(result.json))
    provider = generation.providers[rejected.attempt.binding.provider]
    wire = client_wire(call.request, call.endpoint)
    if wire.name == provider.wire and isinstance(result.json, dict):
        return BodyAnswer(
            result.body, status=status, unbilled=True, settlement=settlements.refused(err)
        )
    return refusal(err)


def _upstream_message(payload: Any) -> str:
    error = payload.get("error") if isinstance(payload, dict) else None
    message = error.get("message") if isinstance(error, dict) else None
    return str(message) if message else "the upstream rejected the request"


def _anthropic_client(request: web.Request) -> bool:
    """The Anthropic SDK expects its own shapes, for the model list as for errors."""
    return client_wire(request) is ANTHROPIC


def authenticated_call(request: web.Request) -> Call:
    """The caller of a request to a plugin's own endpoint, authenticated as API calls are.

    ``call.principal`` is who ``prism_authenticate`` says is calling (and
    ``call.endpoint`` is ``models``: such a call is never dispatched nor
    settled).  Raises ``PrismError`` (401, 403) where authentication refuses.
    """
    return caller(request, Endpoint.MODELS)


def _models_caller(request: web.Request) -> tuple[Generation, Call, web.Response | None]:
    """The model list is part of the API: whoever may call may list (``prism_authenticate``)."""
    call = caller(request, Endpoint.MODELS, authenticated=False)
    generation = call.generation
    try:
        authenticate(generation, call)
    except PrismError as err:
        refused = error_response(err, request=request, headers=_id_header(call))
        return generation, call, refused
    return generation, call, None


def _id_header(call: Call) -> dict[str, str]:
    return {REQUEST_ID_HEADER: call.request_id}


def _allowed(generation: Generation, call: Call, model: ModelSpec) -> bool:
    """Whether every plugin lets this caller use ``model`` (``prism_model_allowed``)."""
    answers = generation.pm.hook.prism_model_allowed(call=call, model=model)
    return False not in answers


async def list_models(request: web.Request) -> web.Response:
    generation, call, refused = _models_caller(request)
    if refused is not None:
        return refused
    catalog = generation.catalog
    # Models, then aliases (each allowed as its target is); wildcards name no one model.
    names = [
        name
        for name, model in [*catalog.models.items(), *catalog.aliases.items()]
        if _allowed(generation, call, model)
    ]
    if _anthropic_client(request):
        body: dict[str, Any] = {
            "data": [_anthropic_model(name) for name in names],
            "has_more": False,
            "first_id": names[0] if names else None,
            "last_id": names[-1] if names else None,
        }
    else:
        body = {"object": "list", "data": [_model_object(name) for name in names]}
    return web.json_response(body, dumps=_dumps, headers=_id_header(call))


async def get_model(request: web.Request) -> web.Response:
    generation, call, refused = _models_caller(request)
    if refused is not None:
        return refused
    name = request.match_info["model"]
    model = generation.catalog.resolve(name)
    # A model this caller may not use is as absent as an unknown one: a key
    # learns nothing about the catalog beyond what it may call.
    if model is None or not _allowed(generation, call, model):
        err = PrismError(
            404, "model_not_found", f"model '{echo(name)}' is not in the catalog", param="model"
        )
        return error_response(err, request=request, headers=_id_header(call))
    body = _anthropic_model(name) if _anthropic_client(request) else _model_object(name)
    return web.json_response(body, dumps=_dumps, headers=_id_header(call))


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
    generation = gw.current
    body: dict[str, Any] = {
        "status": "ready",
        "pid": os.getpid(),
        "generation": generation.number,
        "plugins": generation.loaded(),
        "disabled": sorted(generation.config.disable),
        "models": len(generation.catalog.models),
    }
    for facts in generation.pm.hook.prism_readyz(generation=generation):
        for key, value in (facts or {}).items():
            body.setdefault(key, value)
    return web.json_response(body, dumps=_dumps)


@admin_handler
async def reload(request: web.Request) -> web.Response:
    """Reload the configuration file (as SIGHUP does); 400 ``reload_refused`` names the mistake."""
    try:
        generation = await request.app[GATEWAY].reload()
    except ConfigError as exc:
        raise PrismError(400, "reload_refused", f"configuration error: {exc}") from None
    return web.json_response({"status": "reloaded", "generation": generation.number})


async def stats(request: web.Request) -> web.Response:
    """Event counters (no secrets, no prompt data): e.g. ``chain_exceeded_max_time``."""
    counters = request.app[GATEWAY].counters
    return web.json_response({"counters": dict(counters)}, dumps=_dumps)
