"""The Responses API's conversation state, and Anthropic's token counting.

``POST /v1/responses`` itself is an ordinary call (``prism_proxy.endpoints``);
this module adds what surrounds it:

- :func:`expand_previous`: before dispatch, ``previous_response_id``'s stored
  items go in front of the request's ``input`` (the line sees the whole
  conversation, so it goes on on any line, after a failover too);
- :func:`remember`: once the call is settled and before the answer's last
  bytes leave, the Response and its conversation are kept (unless
  ``store: false``), so a follow-up sent the moment the answer arrives finds it;
- ``GET`` and ``DELETE /v1/responses/{id}`` and ``GET
  /v1/responses/{id}/input_items``, answered to the owner only (another
  organisation, or an anonymous caller, is told it does not exist);
- ``POST /v1/messages/count_tokens``: sent to an Anthropic line of the model
  as Anthropic documents it, else Prism's estimate, marked
  ``x-prism-estimated: true``.

Items are the caller's prompts and answers: nothing here logs them.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping
from typing import Any

import orjson
from aiohttp import web

from .answers import Answer, BodyAnswer, StreamAnswer, error_response
from .call import Call, Endpoint
from .callers import caller
from .catalog import ModelSpec
from .errors import PrismError, echo
from .gate import prompt_tokens
from .generation import Generation
from .record import REQUEST_ID_HEADER
from .request_body import read_json
from .response_store import ResponseStore, StoredResponse, owner_of
from .services import RESPONSE_STORE
from .wire import ANTHROPIC, RESPONSES
from .wire.shape import bad, member

__all__ = [
    "COUNT_TOKENS_PATH",
    "count_tokens",
    "delete_response",
    "expand_previous",
    "get_response",
    "list_input_items",
    "remember",
]

log = logging.getLogger("prism")

COUNT_TOKENS_PATH = "/v1/messages/count_tokens"
ESTIMATED_HEADER = "x-prism-estimated"
#: Upstream statuses that are the caller's request, not the line's trouble: passed on.
_CALLERS_FAULT = frozenset({400, 404, 413, 422})


def _store(generation: Generation) -> ResponseStore:
    store = generation.services.get(RESPONSE_STORE)
    if store is None:  # the core declares a default: only a broken provider gets here
        raise _unavailable()
    return store


def _unavailable() -> PrismError:
    return PrismError(
        503,
        "response_store_unavailable",
        "Prism could not reach the store of responses; retry",
        type="api_error",
    )


def _as_items(inputs: Any) -> list[dict[str, Any]]:
    """``input`` as items: a string is one user message."""
    if isinstance(inputs, str):
        return [{"type": "message", "role": "user", "content": inputs}]
    return list(inputs) if isinstance(inputs, list) else []


async def expand_previous(generation: Generation, call: Call) -> None:
    """Put ``previous_response_id``'s conversation in front of ``input`` (after authentication).

    404 ``previous_response_not_found`` when the caller's owner has no such
    response (none, expired, deleted, or another's).
    """
    body = call.body
    # Left in the body: the answer repeats it; no line is sent it (translations
    # drop it, a native line keeps no state of the gateway's conversations).
    previous = body.get("previous_response_id")
    if previous is None:
        return
    owner = owner_of(call.principal)
    try:
        stored = await _store(generation).get(previous, owner)
    except PrismError:
        raise
    except Exception as exc:
        log.warning(
            "response store failed reading %s for %s: %s", echo(previous), owner, type(exc).__name__
        )
        raise _unavailable() from None
    if stored is None:
        raise PrismError(
            404,
            "previous_response_not_found",
            f"Previous response with id '{echo(previous)}' not found.",
            param="previous_response_id",
        )
    body["input"] = [*stored.items, *_as_items(body["input"])]


def _served_response(answer: Answer) -> dict[str, Any] | None:
    """The whole Response the caller is getting, if it is one worth keeping."""
    response: Any = None
    if isinstance(answer, BodyAnswer):
        if answer.status != 200:
            return None
        try:
            response = orjson.loads(answer.body)
        except orjson.JSONDecodeError:
            return None
    elif isinstance(answer, StreamAnswer):
        # ``final`` set: the stream broke (it ends in response.failed); nothing to follow on.
        if answer.final is not None or answer.upstream is None:
            return None
        response = getattr(answer.upstream.translator, "final", None)
    if not isinstance(response, dict) or response.get("status") not in ("completed", "incomplete"):
        return None
    if not isinstance(response.get("id"), str) or not isinstance(response.get("output"), list):
        return None
    return response


async def remember(generation: Generation, call: Call, answer: Answer) -> None:
    """Keep the served Response with its conversation, unless the caller said ``store: false``.

    A store that fails is logged (the id and owner only) and the answer still
    leaves: the caller has its answer, only a follow-up on it will be 404.
    """
    body = call.body
    if body is None or body.get("store") is False:
        return
    response = _served_response(answer)
    if response is None:
        return
    owner = owner_of(call.principal)
    response_id = response["id"]
    try:
        store = _store(generation)
        items = [*_as_items(body.get("input")), *response["output"]]
        stored = StoredResponse(response_id, owner, store.now() + store.ttl_s, response, items)
        await store.put(stored)
    except Exception as exc:
        log.warning(
            "response %s of %s was not stored: %s (%s)",
            response_id,
            owner,
            type(exc).__name__,
            call.request_id,
        )


def _not_found(response_id: str) -> PrismError:
    return PrismError(
        404,
        "response_not_found",
        f"Response with id '{echo(response_id)}' not found.",
        param="response_id",
    )


_GET, _DELETE, _INPUT_ITEMS = "get", "delete", "input_items"


async def _stored_answer(request: web.Request, action: str) -> web.Response:
    response_id = request.match_info["response_id"]
    headers: dict[str, str] = {}
    try:
        call = caller(request, Endpoint.RESPONSES)
        headers[REQUEST_ID_HEADER] = call.request_id
        # The query is checked first: a mistake in it is told even of a response gone.
        page = _page(request.query) if action == _INPUT_ITEMS else None
        owner = owner_of(call.principal)
        store = _store(call.generation)
        try:
            if action == _DELETE:
                found: Any = await store.delete(response_id, owner)
            else:
                found = await store.get(response_id, owner)
        except Exception as exc:
            log.warning(
                "response store failed on %s for %s: %s",
                echo(response_id),
                owner,
                type(exc).__name__,
            )
            raise _unavailable() from None
        if not found:
            raise _not_found(response_id)
        if action == _DELETE:
            body: Mapping[str, Any] = {"id": response_id, "object": "response", "deleted": True}
        elif page is not None:
            body = _input_items(found, *page)
        else:
            body = found.response
    except PrismError as err:
        return error_response(err, wire=RESPONSES, headers=headers)
    return web.Response(body=orjson.dumps(body), content_type="application/json", headers=headers)


async def get_response(request: web.Request) -> web.Response:
    """``GET /v1/responses/{id}``: the Response as it was served, to its owner only."""
    return await _stored_answer(request, _GET)


async def delete_response(request: web.Request) -> web.Response:
    """``DELETE /v1/responses/{id}``: forget it; OpenAI's ``deleted`` answer."""
    return await _stored_answer(request, _DELETE)


async def list_input_items(request: web.Request) -> web.Response:
    """``GET /v1/responses/{id}/input_items``: what the response answered, OpenAI's list page.

    ``limit`` (1 to 100, default 20), ``order`` (``desc``, the default, or
    ``asc``) and ``after`` (an item id); to the response's owner only.
    """
    return await _stored_answer(request, _INPUT_ITEMS)


def _page(query: Mapping[str, str]) -> tuple[int, bool, str | None]:
    """(limit, newest first, after) from the query, or a 400 naming the parameter."""
    raw = query.get("limit", "20")
    limit = int(raw) if raw.isdigit() else 0
    if not 1 <= limit <= 100:
        raise bad("invalid_value", "'limit' must be a whole number from 1 to 100", "limit")
    order = query.get("order", "desc")
    if order not in ("asc", "desc"):
        raise bad("invalid_value", "'order' must be 'asc' or 'desc'", "order")
    return limit, order == "desc", query.get("after")


#: The id prefix of an input item that came without an id, by its type.
_ID_PREFIX = {"message": "msg", "function_call": "fc", "function_call_output": "fco"}


def _listed(item: dict[str, Any], response_id: str, index: int) -> dict[str, Any]:
    """An input item as OpenAI lists it: with an id, a message's content as parts."""
    out = {"type": "message", **item}
    if not isinstance(out.get("id"), str):
        prefix = _ID_PREFIX.get(str(out["type"]), "item")
        out["id"] = f"{prefix}_{response_id.removeprefix('resp_')}_{index}"
    if out["type"] == "message":
        content = out.get("content")
        if isinstance(content, str):
            kind = "output_text" if out.get("role") == "assistant" else "input_text"
            out["content"] = [{"type": kind, "text": content}]
        out.setdefault("status", "completed")
    return out


def _input_items(
    stored: StoredResponse, limit: int, newest_first: bool, after: str | None
) -> dict[str, Any]:
    output = stored.response.get("output") or []
    inputs = stored.items[: len(stored.items) - len(output)]
    items = [_listed(item, stored.id, index) for index, item in enumerate(inputs)]
    if newest_first:
        items.reverse()
    if after is not None:
        ids = [item["id"] for item in items]
        if after not in ids:
            raise bad("invalid_value", f"'after' names no input item ('{echo(after)}')", "after")
        items = items[ids.index(after) + 1 :]
    data = items[:limit]
    return {
        "object": "list",
        "data": data,
        "first_id": data[0]["id"] if data else None,
        "last_id": data[-1]["id"] if data else None,
        "has_more": len(items) > limit,
    }


# -- POST /v1/messages/count_tokens -----------------------------------------------------


def _count_body(body: dict[str, Any]) -> str:
    model = member(body, "model", "", (str,), "a non-empty string", required=True)
    if not model:
        raise bad("invalid_type", "'model' must be a non-empty string", "model")
    messages = member(body, "messages", "", (list,), "an array of messages", required=True)
    if not messages:
        raise bad("invalid_value", "'messages' must contain at least one message", "messages")
    for index, message in enumerate(messages):
        if not isinstance(message, dict):
            raise bad(
                "invalid_type", f"'messages[{index}]' must be an object", f"messages[{index}]"
            )
    member(body, "system", "", (str, list), "a string or an array of blocks")
    member(body, "tools", "", (list,), "an array")
    return str(model)


async def _native_count(
    generation: Generation, call: Call, model: ModelSpec, body: dict[str, Any]
) -> web.Response | None:
    """The count from the first Anthropic line of the route that answers it, else None."""
    hooks = generation.hooks
    if hooks.call_start is not None:
        hooks.call_start(call=call)
    route = hooks.select_route(call=call, model=model) if hooks.select_route else None
    for binding in route.bindings if route is not None else ():
        provider = generation.providers.get(binding.provider)
        url = getattr(provider, "url", None)
        post = getattr(provider, "post", None)
        if provider is None or provider.wire != "anthropic" or not isinstance(url, str):
            continue
        if post is None or not url.endswith("/messages"):
            continue
        # Every gate a call's attempt passes (residency above all) applies to the count too.
        if hooks.admit_attempt is not None and hooks.admit_attempt(call=call, binding=binding):
            continue
        payload = orjson.dumps({**body, "model": binding.model})
        try:
            answer = await post(url + "/count_tokens", getattr(provider, "headers", {}), payload)
            raw = await answer.read()
        except (OSError, TimeoutError) as exc:
            log.info("count_tokens on %s failed: %s", binding.id, type(exc).__name__)
            continue
        except Exception as exc:  # aiohttp's client errors, among others
            log.info("count_tokens on %s failed: %s", binding.id, type(exc).__name__)
            continue
        headers = {
            REQUEST_ID_HEADER: call.request_id,
            "x-prism-provider": binding.provider,
            "x-prism-model": binding.model,
        }
        if answer.status in _CALLERS_FAULT:
            # The caller's request, as the line judged it: unchanged (both speak Anthropic).
            return web.Response(
                status=answer.status, body=raw, content_type="application/json", headers=headers
            )
        if answer.status != 200:
            continue
        try:
            counted = orjson.loads(raw).get("input_tokens")
        except (orjson.JSONDecodeError, AttributeError):
            counted = None
        if type(counted) is not int:
            continue
        return web.Response(
            body=orjson.dumps({"input_tokens": counted}),
            content_type="application/json",
            headers=headers,
        )
    return None


async def count_tokens(request: web.Request) -> web.Response:
    """Anthropic's ``POST /v1/messages/count_tokens``: the line's count, else Prism's estimate.

    Never billed nor counted against limits (a count is free upstream).
    """
    headers: dict[str, str] = {}
    try:
        call = caller(request, Endpoint.MESSAGES)
        headers[REQUEST_ID_HEADER] = call.request_id
        generation = call.generation
        config = generation.config
        body = await read_json(request, config.max_body_bytes, config.header_timeout_s)
        name = _count_body(body)
        model = generation.catalog.resolve(name)
        allowed = model is not None and False not in generation.pm.hook.prism_model_allowed(
            call=call, model=model
        )
        if model is None or not allowed:
            raise PrismError(
                404,
                "model_not_found",
                f"model '{echo(name)}' is not in the catalog (GET /v1/models lists them)",
                param="model",
            )
        call.model_name, call.model, call.body = name, model, body
        native = await _native_count(generation, call, model, body)
        if native is not None:
            return native
    except PrismError as err:
        return error_response(err, wire=ANTHROPIC, headers=headers)
    headers[ESTIMATED_HEADER] = "true"
    return web.Response(
        body=orjson.dumps({"input_tokens": prompt_tokens(call)}),
        content_type="application/json",
        headers=headers,
    )
