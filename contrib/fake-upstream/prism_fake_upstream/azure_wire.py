"""Azure OpenAI: OpenAI's answers behind Azure's paths, query, keys, errors and content filter.

``POST /s/{scenario}/v1/openai/deployments/{deployment}/chat/completions?api-version=…``
and ``…/embeddings?api-version=…``: the base URL of an Azure provider is the
fake's ``/s/{scenario}/v1``.  The answers are openai_wire's (the deployment
stands in for a missing ``model``); what Azure does differently is here:

- no ``api-version`` query: 400 ``MissingApiVersionParameter``;
- neither an ``api-key`` header nor ``Authorization: Bearer``: 401;
- scenario ``nodeployment…``: 404 ``DeploymentNotFound``;
- scenario ``cfprompt…``: the prompt refused, 400 ``content_filter`` with
  ``innererror.content_filter_result``;
- scenario ``cfanswer…``: the answer cut by the filter after two tokens,
  ``finish_reason: "content_filter"`` (streamed: after those tokens);
  ``cfnothing…``: cut before any text;
- error statuses (``errNNN``, a Fault's status) in Azure's ``{"error": {"code",
  "message"}}`` shape; a 429 carries ``retry-after`` and ``retry-after-ms``.
"""

from __future__ import annotations

import os
import time
from collections.abc import Mapping
from types import MappingProxyType
from typing import Any

import orjson
from aiohttp import web

from .answers import count_message_words, default_answer, split_tokens
from .exchange import Exchange, Route, WireFormat, json_bytes, stream_answer
from .openai_wire import (
    _chat_completions,
    _ChunkFrames,
    _embeddings,
    _stream_error_event,
    _usage,
)

__all__ = ["azure_error_body", "azure_wire"]

_JSON_HEADERS: Mapping[str, str] = MappingProxyType({"Content-Type": "application/json"})
_SSE_HEADERS: Mapping[str, str] = MappingProxyType(
    {"Content-Type": "text/event-stream; charset=utf-8", "Cache-Control": "no-cache"}
)
_DONE = b"data: [DONE]\n\n"
_SAFE = {"filtered": False, "severity": "safe"}
#: Tokens of the answer that get out before the filter cuts it (``cfanswer``).
CUT_AFTER = 2

# (code, message) as Azure OpenAI answers these statuses.
_ERRORS: Mapping[int, tuple[str, str]] = MappingProxyType(
    {
        400: ("BadRequest", "Invalid request."),
        401: (
            "401",
            "Access denied due to invalid subscription key or wrong API endpoint. Make sure to "
            "provide a valid key for an active subscription and use a correct regional API "
            "endpoint for your resource.",
        ),
        403: ("PermissionDenied", "Principal does not have access to API/Operation."),
        404: ("404", "Resource not found"),
        429: (
            "429",
            "Requests to the ChatCompletions_Create Operation under Azure OpenAI API version "
            "2024-10-21 have exceeded token rate limit of your current OpenAI S0 pricing tier. "
            "Please retry after 1 second. Please go here: https://aka.ms/oai/quotaincrease if "
            "you would like to further increase the default rate limit.",
        ),
        500: ("InternalServerError", "The server had an error processing your request."),
    }
)


def azure_error_body(status: int, message: str | None = None) -> dict[str, Any]:
    code, default = _ERRORS.get(status, (str(status), f"The request failed ({status})."))
    return {"error": {"code": code, "message": message if message is not None else default}}


def _error_response(
    status: int, message: str | None = None, headers: Mapping[str, str] = _JSON_HEADERS
) -> web.Response:
    merged = {**_JSON_HEADERS}
    if status == 429:
        merged.update({"retry-after": "1", "retry-after-ms": "1000"})
    merged.update(headers)
    if status in (204, 304):
        return web.Response(status=status, headers=merged)
    return web.Response(
        status=status, body=orjson.dumps(azure_error_body(status, message)), headers=merged
    )


def _reply(ex: Exchange, status: int, payload: Any) -> web.Response:
    return web.Response(
        status=status, body=json_bytes(payload), headers=ex.response_headers(_JSON_HEADERS)
    )


def _filter_results(cut: bool) -> dict[str, Any]:
    results: dict[str, Any] = {
        "hate": dict(_SAFE),
        "self_harm": dict(_SAFE),
        "sexual": dict(_SAFE),
        "violence": dict(_SAFE),
    }
    if cut:
        results["violence"] = {"filtered": True, "severity": "medium"}
    return results


def _prompt_refused() -> dict[str, Any]:
    """Azure's 400 for a prompt its content filter refuses."""
    return {
        "error": {
            "message": "The response was filtered due to the prompt triggering Azure OpenAI's "
            "content management policy. Please modify your prompt and retry. To learn more "
            "about our content filtering policies please read our documentation: "
            "https://go.microsoft.com/fwlink/?linkid=2198766",
            "type": None,
            "param": "prompt",
            "code": "content_filter",
            "status": 400,
            "innererror": {
                "code": "ResponsibleAIPolicyViolation",
                "content_filter_result": {
                    **_filter_results(False),
                    "hate": {"filtered": True, "severity": "high"},
                    "jailbreak": {"filtered": False, "detected": False},
                },
            },
        }
    }


def _refusal(ex: Exchange) -> web.Response | None:
    """What Azure answers before it looks at the body, if it refuses the request."""
    if not ex.request.query.get("api-version"):
        return _reply(
            ex,
            400,
            {
                "error": {
                    "code": "MissingApiVersionParameter",
                    "message": "The api-version query parameter (?api-version=) is required "
                    "for all requests.",
                }
            },
        )
    headers = ex.request.headers
    bearer = headers.get("Authorization", "").startswith("Bearer ")
    if not headers.get("api-key") and not bearer:
        return _reply(ex, 401, azure_error_body(401))
    if ex.scenario.startswith("nodeployment"):
        return _reply(
            ex,
            404,
            {
                "error": {
                    "code": "DeploymentNotFound",
                    "message": "The API deployment for this resource does not exist. If you "
                    "created the deployment within the last 5 minutes, please wait a moment "
                    "and try again.",
                }
            },
        )
    return None


def _with_model(ex: Exchange) -> None:
    # Azure takes the model from the deployment; openai_wire wants one in the body.
    if isinstance(ex.body, dict) and not ex.body.get("model"):
        ex.body["model"] = ex.request.match_info["deployment"]


async def _chat(ex: Exchange) -> web.StreamResponse:
    refused = _refusal(ex)
    if refused is not None:
        return refused
    _with_model(ex)
    body = ex.body
    scenario = ex.scenario
    if scenario.startswith("cfprompt"):
        return _reply(ex, 400, _prompt_refused())
    if not isinstance(body, dict) or not scenario.startswith(("cfanswer", "cfnothing")):
        return await _chat_completions(ex)
    messages = body.get("messages")
    if not isinstance(messages, list) or not messages:
        return await _chat_completions(ex)  # openai_wire says what is wrong
    return await _filtered_answer(ex, body, messages, scenario.startswith("cfnothing"))


async def _filtered_answer(
    ex: Exchange, body: dict[str, Any], messages: list[Any], nothing: bool
) -> web.StreamResponse:
    """An answer the content filter cut: what got out, then ``finish_reason: content_filter``."""
    model = str(body["model"])
    generated = split_tokens(default_answer(model))
    sent = [] if nothing else generated[:CUT_AFTER]
    # The whole generation is billed, the withheld part included.
    usage = _usage(count_message_words(messages), len(generated), ex.fault.usage)
    completion_id = "chatcmpl-" + os.urandom(12).hex()
    created = int(time.time())
    prompt_filter = [{"prompt_index": 0, "content_filter_results": _filter_results(False)}]
    if body.get("stream") is True:
        options = body.get("stream_options")
        include_usage = isinstance(options, dict) and options.get("include_usage") is True
        frames = _ChunkFrames.for_request(completion_id, created, model, include_usage)
        # Azure opens every stream with the prompt's filter results, and no choices.
        opening = (
            b'data: {"choices":[],"created":0,"id":"","model":"","object":"",'
            b'"prompt_filter_results":' + orjson.dumps(prompt_filter) + b"}\n\n" + frames.role()
        )
        closing = [frames.finish("content_filter")]
        if include_usage:
            closing.append(frames.usage(usage))
        closing.append(_DONE)
        return await stream_answer(
            ex,
            _SSE_HEADERS,
            opening,
            [frames.content(token) for token in sent],
            b"".join(closing),
            _stream_error_event,
        )
    return _reply(
        ex,
        200,
        {
            "id": completion_id,
            "object": "chat.completion",
            "created": created,
            "model": model,
            "prompt_filter_results": prompt_filter,
            "choices": [
                {
                    "index": 0,
                    "message": {"role": "assistant", "content": "".join(sent) or None},
                    "logprobs": None,
                    "finish_reason": "content_filter",
                    "content_filter_results": _filter_results(True),
                }
            ],
            "usage": usage,
        },
    )


async def _embed(ex: Exchange) -> web.StreamResponse:
    refused = _refusal(ex)
    if refused is not None:
        return refused
    _with_model(ex)
    return await _embeddings(ex)


def azure_wire() -> WireFormat:
    """Azure OpenAI's deployment routes (under the fake's ``/s/{scenario}/v1/``)."""
    return WireFormat(
        name="azure",
        routes=(
            Route("POST", "openai/deployments/{deployment}/chat/completions", _chat),
            Route("POST", "openai/deployments/{deployment}/embeddings", _embed),
        ),
        error_response=_error_response,
    )
