"""The Amazon Bedrock Runtime wire: Converse and ConverseStream, SigV4-checked.

Routes (under ``/s/{scenario}/v1/``): ``POST model/{modelId}/converse`` (a
JSON answer) and ``POST model/{modelId}/converse-stream`` (an
``application/vnd.amazon.eventstream`` body of binary frames: prelude, headers
``:event-type``/``:content-type``/``:message-type``, payload, CRC32s).

Every request's SigV4 signature is recomputed with botocore from the secret of
its access key (:data:`CREDENTIALS`) and compared; a wrong one is refused as
AWS refuses it (403, ``x-amzn-ErrorType: InvalidSignatureException``).
Scenarios named ``guardrail…`` or ``contentfiltered…`` end the answer with
``stopReason`` ``guardrail_intervened`` / ``content_filtered``.
"""

from __future__ import annotations

import binascii
import hmac
import os
import re
import struct
import time
from collections.abc import Mapping, Sequence
from types import MappingProxyType
from typing import Any

import attrs
import orjson
from aiohttp import web

from .answers import (
    content_text,
    count_words,
    default_answer,
    split_tokens,
    tool_arguments,
    tool_arguments_json,
    tool_result_answer,
)
from .exchange import Exchange, Route, WireFormat, json_bytes

__all__ = [
    "ACCESS_KEY_ID",
    "CREDENTIALS",
    "SECRET_ACCESS_KEY",
    "SESSION_ACCESS_KEY_ID",
    "SESSION_SECRET_ACCESS_KEY",
    "SESSION_TOKEN",
    "bedrock_wire",
    "encode_frame",
    "error_response",
]

#: Long-term test credentials the fake accepts.
ACCESS_KEY_ID = "AKIAPRISMFAKE0000001"
SECRET_ACCESS_KEY = "fakeSecret/Key+0000000000000000000000001"
#: Temporary test credentials: the session token must come too.
SESSION_ACCESS_KEY_ID = "ASIAPRISMFAKE0000002"
SESSION_SECRET_ACCESS_KEY = "fakeSecret/Session+00000000000000000002"
SESSION_TOKEN = "FwoGZXIvYXdzEPrismFakeSessionToken0002"
#: access key id -> (secret, session token or None).
CREDENTIALS: Mapping[str, tuple[str, str | None]] = MappingProxyType(
    {
        ACCESS_KEY_ID: (SECRET_ACCESS_KEY, None),
        SESSION_ACCESS_KEY_ID: (SESSION_SECRET_ACCESS_KEY, SESSION_TOKEN),
    }
)
SERVICE = "bedrock"

_JSON = "application/json"
_EVENT_STREAM = "application/vnd.amazon.eventstream"
_AUTH = re.compile(
    r"AWS4-HMAC-SHA256 Credential=(?P<credential>[^,\s]+),\s*"
    r"SignedHeaders=(?P<signed>[^,\s]+),\s*Signature=(?P<signature>[0-9a-f]+)"
)
_BAD_SIGNATURE = (
    "The request signature we calculated does not match the signature you provided. "
    "Check your AWS Secret Access Key and signing method. "
    "Consult the service documentation for details."
)
_BAD_TOKEN = "The security token included in the request is invalid."

# (x-amzn-ErrorType, message) by status, as Bedrock Runtime answers them.
_ERROR_DEFAULTS: Mapping[int, tuple[str, str]] = MappingProxyType(
    {
        400: ("ValidationException", "Malformed input request, please reformat your input."),
        403: (
            "AccessDeniedException",
            "You don't have access to the model with the specified model ID.",
        ),
        404: ("ResourceNotFoundException", "The provided model identifier is invalid."),
        408: ("ModelTimeoutException", "Model has timed out in processing the request."),
        424: ("ModelErrorException", "The model produced an error."),
        429: ("ThrottlingException", "Too many requests, please wait before trying again."),
        500: ("InternalServerException", "The server encountered an internal error."),
        503: ("ServiceUnavailableException", "Bedrock is unable to process your request."),
    }
)
_MESSAGES_BY_TYPE: Mapping[str, str] = MappingProxyType(
    {
        **{kind: message for kind, message in _ERROR_DEFAULTS.values()},
        "ServiceQuotaExceededException": "Your request exceeds the service quota for your account.",
        "ModelNotReadyException": "The model is not ready to serve inference requests.",
    }
)


def _request_id() -> str:
    return os.urandom(16).hex()


def error_response(
    status: int, message: str | None = None, headers: Mapping[str, str] = MappingProxyType({})
) -> web.Response:
    """A Bedrock error: ``{"message": ...}`` with its type in ``x-amzn-ErrorType``."""
    kind, default = _ERROR_DEFAULTS.get(
        status,
        ("InternalServerException", f"The server returned an error ({status}).")
        if status >= 500
        else ("ValidationException", f"The request failed ({status})."),
    )
    named = next((v for k, v in headers.items() if k.lower() == "x-amzn-errortype"), None)
    if named is not None:
        kind = named.split(":", 1)[0]
        default = _MESSAGES_BY_TYPE.get(kind, default)
    merged = {
        "Content-Type": _JSON,
        "x-amzn-RequestId": _request_id(),
        "x-amzn-ErrorType": f"{kind}:http://internal.amazon.com/coral/com.amazon.bedrock/",
        **{k: v for k, v in headers.items() if k.lower() != "x-amzn-errortype"},
    }
    return web.Response(
        status=status,
        body=orjson.dumps({"message": message if message is not None else default}),
        headers=merged,
    )


def _refuse(kind: str, message: str) -> web.Response:
    return error_response(403, message, {"x-amzn-ErrorType": kind})


async def verify_signature(ex: Exchange) -> web.Response | None:
    """None when the request is signed right for a known key, else AWS's refusal."""
    # Imported here: only a Bedrock request needs botocore.
    from botocore.auth import SigV4Auth
    from botocore.awsrequest import AWSRequest
    from botocore.credentials import Credentials

    request = ex.request
    found = _AUTH.fullmatch(request.headers.get("Authorization", "").strip())
    amz_date = request.headers.get("X-Amz-Date", "")
    if found is None or not amz_date:
        return _refuse("MissingAuthenticationTokenException", "Missing Authentication Token")
    parts = found["credential"].split("/")
    if len(parts) != 5 or parts[4] != "aws4_request":
        return _refuse("IncompleteSignatureException", "Credential is malformed.")
    key_id, day, region, service, _ = parts
    known = CREDENTIALS.get(key_id)
    if known is None:
        return _refuse("UnrecognizedClientException", _BAD_TOKEN)
    secret, token = known
    if token is not None and request.headers.get("X-Amz-Security-Token") != token:
        return _refuse("UnrecognizedClientException", _BAD_TOKEN)
    if service != SERVICE:
        return _refuse(
            "InvalidSignatureException",
            f"Credential should be scoped to correct service: '{SERVICE}'.",
        )
    if day != amz_date[:8]:
        return _refuse("InvalidSignatureException", "Date in Credential scope does not match.")
    signed = found["signed"].split(";")
    if "host" not in signed:
        return _refuse("InvalidSignatureException", "'Host' must be a signed header.")
    headers = {name: request.headers.get(name, "") for name in signed}
    url = f"{request.scheme}://{request.headers.get('Host', '')}{request.raw_path}"
    aws = AWSRequest(method=request.method, url=url, data=await request.read(), headers=headers)
    aws.context["timestamp"] = amz_date
    auth = SigV4Auth(Credentials(key_id, secret, token), service, region)
    string_to_sign = auth.string_to_sign(aws, auth.canonical_request(aws))
    expected = auth.signature(string_to_sign, aws)
    if not hmac.compare_digest(expected, found["signature"]):
        return _refuse("InvalidSignatureException", _BAD_SIGNATURE)
    return None


# -- event-stream frames -------------------------------------------------------


def _header(name: str, value: str) -> bytes:
    raw_name, raw_value = name.encode(), value.encode()
    # Type 7: a UTF-8 string with a 2-byte length.
    return (
        struct.pack("!B", len(raw_name))
        + raw_name
        + struct.pack("!BH", 7, len(raw_value))
        + raw_value
    )


def encode_frame(headers: Sequence[tuple[str, str]], payload: bytes) -> bytes:
    """One event-stream message: prelude (lengths + CRC), headers, payload, message CRC."""
    head = b"".join(_header(name, value) for name, value in headers)
    total = 12 + len(head) + len(payload) + 4
    prelude = struct.pack("!II", total, len(head))
    prelude += struct.pack("!I", binascii.crc32(prelude) & 0xFFFFFFFF)
    message = prelude + head + payload
    return message + struct.pack("!I", binascii.crc32(message) & 0xFFFFFFFF)


def _event(name: str, payload: Mapping[str, Any]) -> bytes:
    return encode_frame(
        ((":event-type", name), (":content-type", _JSON), (":message-type", "event")),
        json_bytes(payload),
    )


def _exception(error: Mapping[str, Any]) -> bytes:
    kind = str(error.get("type") or "modelStreamErrorException")
    body = {k: v for k, v in error.items() if k != "type"}
    body.setdefault("message", "The model stream encountered an error.")
    return encode_frame(
        ((":exception-type", kind), (":content-type", _JSON), (":message-type", "exception")),
        json_bytes(body),
    )


# -- the answer ----------------------------------------------------------------


@attrs.frozen
class _Answer:
    tokens: Sequence[str]  # text pieces, or the tool input's JSON fragments
    stop_reason: str
    tool_id: str | None = None
    tool_name: str | None = None
    tool_input: Mapping[str, Any] | None = None

    def content(self) -> list[dict[str, Any]]:
        if self.tool_name is not None:
            tool = {"toolUseId": self.tool_id, "name": self.tool_name, "input": self.tool_input}
            return [{"toolUse": tool}]
        return [{"text": "".join(self.tokens)}] if self.tokens else []


def _texts(blocks: Any) -> list[str]:
    texts: list[str] = []
    for block in blocks if isinstance(blocks, list) else ():
        if isinstance(block, dict):
            if isinstance(block.get("text"), str):
                texts.append(block["text"])
            result = block.get("toolResult")
            if isinstance(result, dict):
                texts.extend(_texts(result.get("content")))
    return texts


def _input_tokens(body: Mapping[str, Any]) -> int:
    total = sum(count_words(t) for t in _texts(body.get("system")))
    for message in body.get("messages") or ():
        if isinstance(message, dict):
            total += sum(count_words(t) for t in _texts(message.get("content")))
    return total


def _validate(body: Any) -> str | None:
    if not isinstance(body, dict):
        return "Malformed input request: the body must be a JSON object."
    messages = body.get("messages")
    if not isinstance(messages, list) or not messages:
        return "A conversation must start with a user message."
    for message in messages:
        if not isinstance(message, dict) or message.get("role") not in ("user", "assistant"):
            return "Each message's role must be user or assistant."
        if not isinstance(message.get("content"), list) or not message["content"]:
            return "Each message must have content blocks."
    if messages[0].get("role") != "user":
        return "A conversation must start with a user message."
    uses = any(
        isinstance(block, dict) and ("toolUse" in block or "toolResult" in block)
        for message in messages
        for block in message["content"]
    )
    if uses and not isinstance(body.get("toolConfig"), dict):
        return (
            "The toolConfig field must be defined when using toolUse and toolResult content blocks."
        )
    inference = body.get("inferenceConfig")
    if inference is not None and not isinstance(inference, dict):
        return "inferenceConfig must be an object."
    return None


def _tool_results(messages: Sequence[Any]) -> list[str] | None:
    content = messages[-1].get("content") if messages[-1].get("role") == "user" else None
    results = [
        content_text(block["toolResult"].get("content"))
        for block in content or ()
        if isinstance(block, dict) and isinstance(block.get("toolResult"), dict)
    ]
    return results or None


def _tool_to_call(body: Mapping[str, Any]) -> Mapping[str, Any] | None:
    config = body.get("toolConfig")
    tools = config.get("tools") if isinstance(config, dict) else None
    specs: list[Mapping[str, Any]] = [
        t["toolSpec"]
        for t in tools or ()
        if isinstance(t, dict) and isinstance(t.get("toolSpec"), dict)
    ]
    choice = config.get("toolChoice") if isinstance(config, dict) else None
    named = (choice.get("tool") or {}).get("name") if isinstance(choice, dict) else None
    for spec in specs:
        if spec.get("name") == named:
            return spec
    return specs[0] if specs else None


def _plan(body: Mapping[str, Any], model: str, ex: Exchange) -> _Answer:
    fault = ex.fault
    if fault.empty_length:
        return _Answer((), "max_tokens")
    if ex.scenario.startswith(("guardrail", "contentfiltered")):
        reason = (
            "guardrail_intervened" if ex.scenario.startswith("guardrail") else "content_filtered"
        )
        return _Answer(split_tokens(fault.text or "Sorry, the model cannot answer this."), reason)
    text = fault.text
    if text is None:
        results = _tool_results(body["messages"])
        if results is not None:
            text = tool_result_answer(results)
        else:
            tool = _tool_to_call(body)
            if tool is not None:
                schema = (tool.get("inputSchema") or {}).get("json")
                arguments = tool_arguments(schema)
                _text, fragments = tool_arguments_json(arguments)
                return _Answer(
                    fragments,
                    "tool_use",
                    tool_id="tooluse_" + os.urandom(11).hex(),
                    tool_name=str(tool.get("name")),
                    tool_input=arguments,
                )
            text = default_answer(model)
    inference = body.get("inferenceConfig") or {}
    for stop in inference.get("stopSequences") or ():
        if isinstance(stop, str) and stop and stop in text:
            return _Answer(split_tokens(text[: text.index(stop)]), "stop_sequence")
    tokens = split_tokens(text)
    limit = inference.get("maxTokens")
    if isinstance(limit, int) and limit < len(tokens):
        return _Answer(tokens[:limit], "max_tokens")
    return _Answer(tokens, "end_turn")


def _usage(body: Mapping[str, Any], answer: _Answer, ex: Exchange) -> dict[str, Any]:
    usage: dict[str, Any] = {"inputTokens": _input_tokens(body), "outputTokens": len(answer.tokens)}
    usage["totalTokens"] = usage["inputTokens"] + usage["outputTokens"]
    if ex.fault.usage:
        usage.update(ex.fault.usage)
    return usage


def _stream_frames(answer: _Answer, usage: Mapping[str, Any]) -> tuple[bytes, list[bytes], bytes]:
    opening = [_event("messageStart", {"role": "assistant"})]
    if answer.tool_name is not None:
        start = {"toolUse": {"toolUseId": answer.tool_id, "name": answer.tool_name}}
        opening.append(_event("contentBlockStart", {"contentBlockIndex": 0, "start": start}))
        pieces = [
            _event(
                "contentBlockDelta", {"contentBlockIndex": 0, "delta": {"toolUse": {"input": t}}}
            )
            for t in answer.tokens
        ]
    else:
        pieces = [
            _event("contentBlockDelta", {"contentBlockIndex": 0, "delta": {"text": t}})
            for t in answer.tokens
        ]
    closing = b"".join(
        [
            *([_event("contentBlockStop", {"contentBlockIndex": 0})] if pieces else []),
            _event("messageStop", {"stopReason": answer.stop_reason}),
            _event("metadata", {"usage": dict(usage), "metrics": {"latencyMs": 42}}),
        ]
    )
    return b"".join(opening), pieces, closing


async def _stream(
    ex: Exchange, opening: bytes, pieces: list[bytes], closing: bytes
) -> web.StreamResponse:
    """The frames with the Fault's timing, cuts, exception frame and bad frame."""
    fault = ex.fault
    headers = {"Content-Type": _EVENT_STREAM, "x-amzn-RequestId": _request_id()}
    resp = web.StreamResponse(headers=ex.response_headers(headers))
    await resp.prepare(ex.request)
    await ex.pause(fault.first_token_delay_s)
    pending = [opening]
    cut = fault.die_after_chunks
    if cut is None and fault.stream_error is not None:
        cut = 0
    emitted = pieces if cut is None else pieces[:cut]
    bad = None
    if fault.bad_event is not None:
        # A frame whose CRCs are right but whose payload is not JSON.
        bad = encode_frame(
            (
                (":event-type", "contentBlockDelta"),
                (":content-type", _JSON),
                (":message-type", "event"),
            ),
            fault.bad_event,
        )
    bad_at = min(fault.bad_event_at, len(pieces))
    if bad is not None and bad_at == 0:
        pending.append(bad)
    for i, piece in enumerate(emitted, 1):
        if i > 1 and fault.token_delay_s:
            await resp.write(b"".join(pending))
            pending.clear()
            await ex.pause(fault.token_delay_s)
        pending.append(piece)
        if bad is not None and i == bad_at:
            pending.append(bad)
    if fault.stream_error is not None:
        pending.append(_exception(fault.stream_error))
        await resp.write_eof(b"".join(pending))
        return resp
    if cut is not None:
        await resp.write(b"".join(pending))
        return ex.hang_up(resp)
    pending.append(closing)
    await resp.write_eof(b"".join(pending))
    return resp


async def _converse(ex: Exchange, stream: bool) -> web.StreamResponse:
    refused = await verify_signature(ex)
    if refused is not None:
        return refused
    problem = _validate(ex.body)
    if problem is not None:
        return error_response(400, problem)
    body: dict[str, Any] = ex.body
    model = ex.request.match_info["modelId"]
    fault = ex.fault
    if fault.context_limit is not None and _input_tokens(body) > fault.context_limit:
        return error_response(400, "Input is too long for requested model.")
    if fault.die_after_chunks is not None and not stream:
        return ex.hang_up()
    answer = _plan(body, model, ex)
    usage = _usage(body, answer, ex)
    if stream:
        return await _stream(ex, *_stream_frames(answer, usage))
    await ex.pause(fault.first_token_delay_s + fault.token_delay_s * max(len(answer.tokens) - 1, 0))
    started = time.monotonic()
    payload = {
        "output": {"message": {"role": "assistant", "content": answer.content()}},
        "stopReason": answer.stop_reason,
        "usage": usage,
        "metrics": {"latencyMs": int((time.monotonic() - started) * 1000) + 42},
    }
    headers = {"Content-Type": _JSON, "x-amzn-RequestId": _request_id()}
    return web.Response(body=json_bytes(payload), headers=ex.response_headers(headers))


async def _converse_whole(ex: Exchange) -> web.StreamResponse:
    return await _converse(ex, stream=False)


async def _converse_stream(ex: Exchange) -> web.StreamResponse:
    return await _converse(ex, stream=True)


def bedrock_wire() -> WireFormat:
    """The Bedrock Runtime wire (POST model/{modelId}/converse, converse-stream)."""
    return WireFormat(
        name="bedrock",
        routes=(
            Route("POST", "model/{modelId}/converse", _converse_whole),
            Route("POST", "model/{modelId}/converse-stream", _converse_stream),
        ),
        error_response=error_response,
    )
