"""Google's Gemini wire: ``models/{model}:generateContent`` and friends, and Vertex AI's.

The Gemini API (``x-goog-api-key``) under ``models/``, and Vertex AI
(``Authorization: Bearer`` a token this fake issued at its ``token``
endpoint, which takes a service account's signed JWT as google-auth posts
it) under ``projects/{project}/locations/{location}/publishers/google/models/``.
Streams (``:streamGenerateContent?alt=sse``) are ``data: {json}\\r\\n\\r\\n`` per
chunk, as Google frames them, and end with the connection: no final event.

Scenario names ending ``-finish-<REASON>`` (``filtered-finish-SAFETY``) end
the answer with that finishReason after its text, as a safety filter cuts
an answer; ``-block-<REASON>`` refuses the prompt (``promptFeedback``, no
candidates).
"""

from __future__ import annotations

import base64
import binascii
import itertools
import os
from collections.abc import Mapping, Sequence
from types import MappingProxyType
from typing import Any

import attrs
import orjson
from aiohttp import web

from .answers import count_words, default_answer, split_tokens, tool_arguments, tool_result_answer
from .exchange import Exchange, Route, WireFormat, json_bytes, stream_answer
from .vectors import embedding_for_text, unpack_floats

__all__ = ["GeminiTokens", "error_body", "error_response", "gemini_wire"]

_JSON_HEADERS: Mapping[str, str] = MappingProxyType(
    {"Content-Type": "application/json; charset=UTF-8"}
)
_SSE_HEADERS: Mapping[str, str] = MappingProxyType({"Content-Type": "text/event-stream"})
_VERTEX = "projects/{project}/locations/{location}/publishers/google/models/"
DEFAULT_EMBEDDING_DIMS = 8
#: How long the tokens this fake issues live (seconds), as Google's do.
TOKEN_LIFETIME_S = 3599
_JWT_GRANT = "urn:ietf:params:oauth:grant-type:jwt-bearer"

# (status, message) as Google sends them for the documented statuses.
_ERROR_DEFAULTS: Mapping[int, tuple[str, str]] = MappingProxyType(
    {
        400: ("INVALID_ARGUMENT", "Request contains an invalid argument."),
        401: (
            "UNAUTHENTICATED",
            "Request had invalid authentication credentials. Expected OAuth 2 access token, "
            "login cookie or other valid authentication credential.",
        ),
        403: ("PERMISSION_DENIED", "The caller does not have permission"),
        404: ("NOT_FOUND", "Requested entity was not found."),
        429: ("RESOURCE_EXHAUSTED", "Resource has been exhausted (e.g. check quota)."),
        500: ("INTERNAL", "An internal error has occurred. Please retry or report in the docs."),
        503: ("UNAVAILABLE", "The model is overloaded. Please try again later."),
        504: ("DEADLINE_EXCEEDED", "Deadline expired before operation could complete."),
    }
)


def error_body(status: int, message: str | None = None) -> dict[str, Any]:
    name, default = _ERROR_DEFAULTS.get(
        status, ("INTERNAL" if status >= 500 else "FAILED_PRECONDITION", f"Error {status}.")
    )
    return {"error": {"code": status, "message": message or default, "status": name}}


def error_response(
    status: int, message: str | None = None, headers: Mapping[str, str] = _JSON_HEADERS
) -> web.Response:
    merged = {**_JSON_HEADERS, **headers}
    if status in (204, 304):
        return web.Response(status=status, headers=merged)
    return web.Response(
        status=status, body=orjson.dumps(error_body(status, message)), headers=merged
    )


def _refuse(ex: Exchange, status: int, message: str | None = None) -> web.Response:
    return web.Response(
        status=status,
        body=orjson.dumps(error_body(status, message)),
        headers=ex.response_headers(_JSON_HEADERS),
    )


@attrs.define
class GeminiTokens:
    """The bearer tokens this fake's token endpoint issued (per fake, never shared)."""

    issued: list[str] = attrs.field(factory=list)
    counter: itertools.count[int] = attrs.field(factory=lambda: itertools.count(1))

    def issue(self) -> str:
        token = f"ya29.fake-{next(self.counter)}"
        self.issued.append(token)
        return token


def _jwt_claims(assertion: str) -> dict[str, Any] | None:
    pieces = assertion.split(".")
    if len(pieces) != 3 or not all(pieces):
        return None
    try:
        claims = orjson.loads(base64.urlsafe_b64decode(pieces[1] + "=" * (-len(pieces[1]) % 4)))
    except (binascii.Error, ValueError):
        return None
    return claims if isinstance(claims, dict) else None


def _token_endpoint(tokens: GeminiTokens) -> Any:
    async def handle(ex: Exchange) -> web.StreamResponse:
        form = await ex.request.post()
        assertion = form.get("assertion")
        claims = _jwt_claims(assertion) if isinstance(assertion, str) else None
        if form.get("grant_type") != _JWT_GRANT or claims is None:
            body = {"error": "invalid_grant", "error_description": "Invalid grant: malformed JWT."}
            return web.Response(status=400, body=orjson.dumps(body), headers=_JSON_HEADERS)
        missing = [key for key in ("iss", "aud", "iat", "exp", "scope") if key not in claims]
        if missing:
            body = {"error": "invalid_grant", "error_description": f"JWT lacks {missing}."}
            return web.Response(status=400, body=orjson.dumps(body), headers=_JSON_HEADERS)
        answer = {
            "access_token": tokens.issue(),
            "expires_in": TOKEN_LIFETIME_S,
            "token_type": "Bearer",
        }
        return web.Response(body=orjson.dumps(answer), headers=ex.response_headers(_JSON_HEADERS))

    return handle


def _credentials_problem(ex: Exchange, tokens: GeminiTokens, vertex: bool) -> web.Response | None:
    headers = ex.request.headers
    if vertex:
        auth = headers.get("Authorization", "")
        if not auth.startswith("Bearer ") or auth[7:] not in tokens.issued:
            return _refuse(ex, 401)
        return None
    if not headers.get("x-goog-api-key"):
        return _refuse(
            ex,
            403,
            "Method doesn't allow unregistered callers (callers without established identity). "
            "Please use API Key or other form of API consumer identity to call this API.",
        )
    return None


def _texts(content: Any) -> list[str]:
    parts = content.get("parts") if isinstance(content, dict) else None
    return [
        p["text"] for p in parts or () if isinstance(p, dict) and isinstance(p.get("text"), str)
    ]


def _prompt_tokens(body: Mapping[str, Any]) -> int:
    contents = [body.get("systemInstruction"), *(body.get("contents") or ())]
    return sum(count_words(text) for content in contents for text in _texts(content))


def _validate(body: Any) -> str | None:
    if not isinstance(body, dict):
        return "Invalid JSON payload received."
    contents = body.get("contents")
    if not isinstance(contents, list) or not contents:
        return "* GenerateContentRequest.contents: contents is not specified"
    for index, content in enumerate(contents):
        if not isinstance(content, dict) or content.get("role") not in ("user", "model"):
            return f"* GenerateContentRequest.contents[{index}].role: must be user or model"
        parts = content.get("parts")
        if not isinstance(parts, list) or not parts:
            return f"* GenerateContentRequest.contents[{index}].parts: contains no parts"
        calls = [p for p in parts if isinstance(p, dict) and "functionCall" in p]
        if calls and "thoughtSignature" not in calls[0]:
            # Gemini 3's rule: a model turn's (first) function call carries its signature.
            name = calls[0]["functionCall"].get("name")
            return (
                "Function call is missing a thought_signature in functionCall parts. "
                f"Additional data, function call `default_api:{name}` , position {index + 1}."
            )
    return None


@attrs.frozen
class _Plan:
    tokens: Sequence[str]
    finish: str
    call: Mapping[str, Any] | None = None
    blocked: str | None = None
    thoughts: int = 0


def _tool_results(contents: Sequence[Any]) -> list[str] | None:
    last = contents[-1]
    results = [
        orjson.dumps(p["functionResponse"].get("response")).decode()
        for p in last.get("parts") or ()
        if isinstance(p, dict) and isinstance(p.get("functionResponse"), dict)
    ]
    return results or None


def _tool_to_call(body: Mapping[str, Any]) -> Mapping[str, Any] | None:
    declarations = [
        d
        for tool in body.get("tools") or ()
        if isinstance(tool, dict)
        for d in tool.get("functionDeclarations") or ()
        if isinstance(d, dict) and isinstance(d.get("name"), str)
    ]
    config = (body.get("toolConfig") or {}).get("functionCallingConfig") or {}
    if not declarations or config.get("mode") == "NONE":
        return None
    allowed = config.get("allowedFunctionNames") or ()
    for declaration in declarations:
        if declaration["name"] in allowed:
            return declaration
    return declarations[0]


def _plan(ex: Exchange, body: Mapping[str, Any], model: str) -> _Plan:
    fault = ex.fault
    scenario = ex.scenario
    thoughts = len(split_tokens(fault.thinking)) if fault.thinking else 0
    if "-block-" in scenario:
        return _Plan((), "", blocked=scenario.rsplit("-block-", 1)[1])
    config = body.get("generationConfig") or {}
    if fault.empty_length:
        # The thinking spent the whole budget: no parts at all.
        return _Plan((), "MAX_TOKENS", thoughts=thoughts or config.get("maxOutputTokens", 1))
    text = fault.text
    if text is None:
        results = _tool_results(body["contents"])
        if results is not None:
            text = tool_result_answer(results)
        else:
            declaration = _tool_to_call(body)
            if declaration is not None:
                schema = declaration.get("parametersJsonSchema") or declaration.get("parameters")
                call = {"name": declaration["name"], "args": tool_arguments(schema)}
                return _Plan((), "STOP", call=call, thoughts=thoughts)
            text = default_answer(model)
    tokens = split_tokens(text)
    finish = "STOP"
    if "-finish-" in scenario:
        finish = scenario.rsplit("-finish-", 1)[1]
    limit = config.get("maxOutputTokens")
    if isinstance(limit, int) and limit < len(tokens):
        tokens, finish = tokens[:limit], "MAX_TOKENS"
    return _Plan(tokens, finish, thoughts=thoughts)


def _usage(ex: Exchange, body: Mapping[str, Any], plan: _Plan) -> dict[str, Any]:
    prompt = _prompt_tokens(body)
    output = len(plan.tokens) + (1 if plan.call is not None else 0)
    usage: dict[str, Any] = {
        "promptTokenCount": prompt,
        "candidatesTokenCount": output,
        "totalTokenCount": prompt + output + plan.thoughts,
        "promptTokensDetails": [{"modality": "TEXT", "tokenCount": prompt}],
    }
    if plan.thoughts:
        usage["thoughtsTokenCount"] = plan.thoughts
    usage.update(ex.fault.usage or {})
    return usage


def _candidate(parts: list[dict[str, Any]], finish: str | None) -> dict[str, Any]:
    candidate: dict[str, Any] = {"content": {"parts": parts, "role": "model"}, "index": 0}
    if not parts:
        candidate["content"] = {"role": "model"}
    if finish:
        candidate["finishReason"] = finish
    if finish in ("SAFETY", "PROHIBITED_CONTENT", "BLOCKLIST", "SPII"):
        candidate["safetyRatings"] = [
            {"category": "HARM_CATEGORY_DANGEROUS_CONTENT", "probability": "HIGH", "blocked": True}
        ]
    return candidate


def _call_part(plan: _Plan) -> dict[str, Any]:
    # Gemini 3 signs each turn's function call; the next turn must send it back.
    signature = base64.b64encode(os.urandom(48)).decode()
    return {"functionCall": dict(plan.call or {}), "thoughtSignature": signature}


def _answer(
    body: Mapping[str, Any], plan: _Plan, usage: dict[str, Any], model: str
) -> dict[str, Any]:
    head = {"usageMetadata": usage, "modelVersion": model, "responseId": os.urandom(9).hex()}
    if plan.blocked is not None:
        return {"promptFeedback": {"blockReason": plan.blocked}, **head}
    parts: list[dict[str, Any]] = []
    if plan.call is not None:
        parts.append(_call_part(plan))
    elif plan.tokens:
        parts.append({"text": "".join(plan.tokens)})
    return {"candidates": [_candidate(parts, plan.finish)], **head}


def _event(payload: Any) -> bytes:
    return b"data: " + json_bytes(payload) + b"\r\n\r\n"


def _stream_error_event(error: Mapping[str, Any]) -> bytes:
    if not error:
        return _event(error_body(503))
    return _event(dict(error) if "error" in error else {"error": dict(error)})


async def _stream(
    ex: Exchange, answer: dict[str, Any], plan: _Plan, usage: dict[str, Any]
) -> web.StreamResponse:
    head = {"modelVersion": answer["modelVersion"], "responseId": answer["responseId"]}
    early = {
        "promptTokenCount": usage["promptTokenCount"],
        "totalTokenCount": usage["promptTokenCount"],
    }
    if plan.blocked is not None or plan.call is not None:
        return await stream_answer(
            ex, _SSE_HEADERS, b"", [_event(answer)], b"", _stream_error_event
        )
    pieces = [
        _event({"candidates": [_candidate([{"text": t}], None)], "usageMetadata": early, **head})
        for t in plan.tokens
    ]
    closing = _event({"candidates": [_candidate([], plan.finish)], "usageMetadata": usage, **head})
    return await stream_answer(ex, _SSE_HEADERS, b"", pieces, closing, _stream_error_event)


def _generate(tokens: GeminiTokens, vertex: bool, stream: bool) -> Any:
    async def handle(ex: Exchange) -> web.StreamResponse:
        refused = _credentials_problem(ex, tokens, vertex)
        if refused is not None:
            return refused
        problem = _validate(ex.body)
        if problem is not None:
            return _refuse(ex, 400, problem)
        if stream and ex.request.query.get("alt") != "sse":
            return _refuse(ex, 400, "this fake streams Server-Sent Events only: add ?alt=sse")
        body: dict[str, Any] = ex.body
        model = ex.request.match_info["model"]
        fault = ex.fault
        if fault.die_after_chunks is not None and not stream:
            return ex.hang_up()
        plan = _plan(ex, body, model)
        usage = _usage(ex, body, plan)
        answer = _answer(body, plan, usage, model)
        if stream:
            return await _stream(ex, answer, plan, usage)
        await ex.pause(fault.first_token_delay_s)
        return web.Response(body=json_bytes(answer), headers=ex.response_headers(_JSON_HEADERS))

    return handle


def _embedding(request: Any) -> dict[str, Any] | None:
    if not isinstance(request, dict):
        return None
    text = " ".join(_texts(request.get("content")))
    dims = request.get("outputDimensionality") or DEFAULT_EMBEDDING_DIMS
    if not isinstance(dims, int) or dims < 1 or not text:
        return None
    return {"values": unpack_floats(embedding_for_text(text, dims))}


def _embed(tokens: GeminiTokens, batch: bool) -> Any:
    async def handle(ex: Exchange) -> web.StreamResponse:
        refused = _credentials_problem(ex, tokens, False)
        if refused is not None:
            return refused
        body = ex.body if isinstance(ex.body, dict) else {}
        requests = body.get("requests") if batch else [body]
        if not isinstance(requests, list) or not requests:
            return _refuse(ex, 400, "* BatchEmbedContentsRequest.requests: requests is empty")
        vectors = [_embedding(request) for request in requests]
        if any(vector is None for vector in vectors):
            return _refuse(ex, 400, "* EmbedContentRequest.content: contains an empty Part.")
        answer = {"embeddings": vectors} if batch else {"embedding": vectors[0]}
        return web.Response(body=json_bytes(answer), headers=ex.response_headers(_JSON_HEADERS))

    return handle


def _predict(tokens: GeminiTokens) -> Any:
    """Vertex's ``:predict`` for embedding models: ``instances`` of ``content``."""

    async def handle(ex: Exchange) -> web.StreamResponse:
        refused = _credentials_problem(ex, tokens, True)
        if refused is not None:
            return refused
        body = ex.body if isinstance(ex.body, dict) else {}
        instances = body.get("instances")
        dims = (body.get("parameters") or {}).get("outputDimensionality", DEFAULT_EMBEDDING_DIMS)
        if not isinstance(instances, list) or not instances:
            return _refuse(ex, 400, "instances: must not be empty")
        predictions = []
        for instance in instances:
            text = instance.get("content") if isinstance(instance, dict) else None
            if not isinstance(text, str) or not text or not isinstance(dims, int) or dims < 1:
                return _refuse(ex, 400, "instances[].content: a non-empty text is required")
            values = unpack_floats(embedding_for_text(text, dims))
            stats = {"token_count": count_words(text), "truncated": False}
            predictions.append({"embeddings": {"values": values, "statistics": stats}})
        answer = {"predictions": predictions, "metadata": {"billableCharacterCount": 0}}
        return web.Response(body=json_bytes(answer), headers=ex.response_headers(_JSON_HEADERS))

    return handle


def gemini_wire() -> WireFormat:
    """The Gemini API and Vertex AI's Gemini endpoints, with a token endpoint of their own."""
    tokens = GeminiTokens()
    routes = [
        Route("POST", "models/{model}:generateContent", _generate(tokens, False, False)),
        Route("POST", "models/{model}:streamGenerateContent", _generate(tokens, False, True)),
        Route("POST", "models/{model}:embedContent", _embed(tokens, False)),
        Route("POST", "models/{model}:batchEmbedContents", _embed(tokens, True)),
        Route("POST", _VERTEX + "{model}:generateContent", _generate(tokens, True, False)),
        Route("POST", _VERTEX + "{model}:streamGenerateContent", _generate(tokens, True, True)),
        Route("POST", _VERTEX + "{model}:predict", _predict(tokens)),
        Route("POST", "token", _token_endpoint(tokens)),
    ]
    return WireFormat(name="gemini", routes=tuple(routes), error_response=error_response)
