"""OpenAI chat requests as Gemini ``generateContent`` requests.

Everything that changes the answer and has no Gemini form raises
``Untranslatable`` (the line is skipped before dispatch, the record says
why); what cannot change it (``user``, ``store``…) is dropped and said so.

A Gemini 3 function call carries a ``thoughtSignature`` the next turn must
send back with it.  OpenAI callers keep nothing but the tool call's id, so
the signature travels inside the id (``call_<hex>_ts_<signature>``) and is
restored from it; a call without one (history written elsewhere) gets the
validator-skipping signature Google documents for such turns.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from typing import Any

import orjson

from prism_proxy import (
    CHAT_CARRIED,
    OPENAI_ONLY_PARAMS,
    Untranslatable,
    chat_turns,
    check_chat_params,
    data_url,
    system_text,
    tool_arguments,
    tool_result_text,
)

__all__ = ["embeddings_request", "openai_to_gemini", "signed_id", "split_id"]

#: OpenAI chat parameters Gemini carries over (the rest are refused or dropped).
_CARRIED = CHAT_CARRIED | {"seed", "presence_penalty", "frequency_penalty"}
_SIGNATURE_MARK = "_ts_"
#: Google's documented stand-in for a function call whose signature was not kept.
SKIP_SIGNATURE = "skip_thought_signature_validator"
_AUDIO_TYPES = {"wav": "audio/wav", "mp3": "audio/mp3"}


def signed_id(signature: Any) -> str:
    """A new tool call id, carrying the call's thought signature when it has one."""
    head = "call_" + os.urandom(12).hex()
    if not isinstance(signature, str) or not signature:
        return head
    return head + _SIGNATURE_MARK + signature.replace("+", "-").replace("/", "_")


def split_id(call_id: Any) -> str | None:
    """The thought signature a tool call id carries, or None."""
    if not isinstance(call_id, str) or _SIGNATURE_MARK not in call_id:
        return None
    signature = call_id.split(_SIGNATURE_MARK, 1)[1]
    return signature.replace("-", "+").replace("_", "/") or None


def _data_url(url: str, what: str) -> dict[str, Any]:
    inline = data_url(url, what, remote=f"{what} that is not a base64 data URL")
    mime = inline.media_type or "application/octet-stream"
    return {"inlineData": {"mimeType": mime, "data": inline.data}}


def _parts(content: Any) -> list[dict[str, Any]]:
    if content is None:
        return []
    if isinstance(content, str):
        return [{"text": content}] if content else []
    parts: list[dict[str, Any]] = []
    for part in content:
        kind = part.get("type")
        if kind in ("text", "refusal"):
            text = part.get(kind) or ""
            if text:
                parts.append({"text": text})
        elif kind == "image_url":
            url = str((part.get("image_url") or {}).get("url", ""))
            parts.append(_data_url(url, "an image"))
        elif kind == "input_audio":
            audio = part.get("input_audio") or {}
            mime = _AUDIO_TYPES.get(str(audio.get("format")))
            if mime is None:
                raise Untranslatable(f"audio format {audio.get('format')!r}")
            parts.append({"inlineData": {"mimeType": mime, "data": audio.get("data", "")}})
        elif kind == "file":
            data = (part.get("file") or {}).get("file_data")
            if not isinstance(data, str):
                raise Untranslatable("a file by id (Gemini takes the file's data)")
            parts.append(_data_url(data, "a file"))
        else:
            raise Untranslatable(f"content part type {kind!r}")
    return parts


def _function_calls(message: Mapping[str, Any], names: dict[str, str]) -> list[dict[str, Any]]:
    parts = []
    for index, call in enumerate(message.get("tool_calls") or ()):
        name = str((call.get("function") or {}).get("name"))
        names[str(call.get("id"))] = name
        part: dict[str, Any] = {"functionCall": {"name": name, "args": tool_arguments(call)}}
        signature = split_id(call.get("id"))
        if signature is not None:
            part["thoughtSignature"] = signature
        elif index == 0:
            # Parallel calls: only the first of a turn carries one.
            part["thoughtSignature"] = SKIP_SIGNATURE
        parts.append(part)
    return parts


def _tool_response(message: Mapping[str, Any], names: dict[str, str]) -> dict[str, Any]:
    call_id = str(message.get("tool_call_id"))
    name = names.get(call_id)
    if name is None:
        raise Untranslatable("a tool result whose call is not in the conversation")
    text = tool_result_text(message.get("content"))
    try:
        response = orjson.loads(text)
    except orjson.JSONDecodeError:
        response = None
    if not isinstance(response, dict):
        response = {"result": text}
    return {"functionResponse": {"name": name, "response": response}}


def _tool_config(choice: Any) -> dict[str, Any] | None:
    if choice is None:
        return None
    if choice in ("auto", "none", "required"):
        mode = {"auto": "AUTO", "none": "NONE", "required": "ANY"}[choice]
        return {"functionCallingConfig": {"mode": mode}}
    if isinstance(choice, dict) and choice.get("type") == "function":
        name = (choice.get("function") or {}).get("name")
        return {"functionCallingConfig": {"mode": "ANY", "allowedFunctionNames": [name]}}
    raise Untranslatable(f"tool_choice {choice!r}")


def _generation_config(body: dict[str, Any]) -> dict[str, Any]:
    config: dict[str, Any] = {}
    max_tokens = body.get("max_completion_tokens") or body.get("max_tokens")
    if max_tokens is not None:
        config["maxOutputTokens"] = max_tokens
    for ours, theirs in (
        ("temperature", "temperature"),
        ("top_p", "topP"),
        ("seed", "seed"),
        ("presence_penalty", "presencePenalty"),
        ("frequency_penalty", "frequencyPenalty"),
    ):
        if body.get(ours) is not None:
            config[theirs] = body[ours]
    stop = body.get("stop")
    if stop:
        config["stopSequences"] = [stop] if isinstance(stop, str) else list(stop)
    response_format = body.get("response_format")
    kind = response_format.get("type") if response_format else None
    if kind == "json_object":
        config["responseMimeType"] = "application/json"
    elif kind == "json_schema":
        assert response_format is not None
        spec = response_format.get("json_schema")
        schema = spec.get("schema") if isinstance(spec, dict) else None
        if not isinstance(schema, dict):
            raise Untranslatable("response_format json_schema without a schema object")
        config["responseMimeType"] = "application/json"
        # JSON Schema as callers write it: ``responseSchema`` takes only an OpenAPI subset.
        config["responseJsonSchema"] = schema
    elif kind not in (None, "text"):
        raise Untranslatable(f"response_format {kind}")
    return config


def openai_to_gemini(
    body: dict[str, Any], provider: Any = None
) -> tuple[dict[str, Any], list[str]]:
    """A validated chat completion request as a ``generateContent`` body."""
    adjusted = check_chat_params(body, unsupported=OPENAI_ONLY_PARAMS, carried=_CARRIED)
    system = system_text(body)
    # Gemini names a function's response by the function: the calls before it tell.
    names: dict[str, str] = {}
    contents = chat_turns(
        body,
        user=lambda message: _parts(message.get("content")),
        assistant=lambda message: _parts(message.get("content")) + _function_calls(message, names),
        tool=lambda message: [_tool_response(message, names)],
        assistant_role="model",
        key="parts",
    )
    out: dict[str, Any] = {"contents": contents}
    if system is not None:
        out["systemInstruction"] = {"parts": [{"text": system}]}
    tools = body.get("tools")
    if tools:
        declarations = []
        for tool in tools:
            if tool.get("type") != "function":
                raise Untranslatable(f"tool type {tool.get('type')!r}")
            function = tool.get("function") or {}
            declaration: dict[str, Any] = {"name": function.get("name")}
            if function.get("description"):
                declaration["description"] = function["description"]
            if function.get("parameters"):
                declaration["parametersJsonSchema"] = function["parameters"]
            declarations.append(declaration)
        out["tools"] = [{"functionDeclarations": declarations}]
    config = _tool_config(body.get("tool_choice"))
    if config is not None:
        out["toolConfig"] = config
    generation = _generation_config(body)
    if generation:
        out["generationConfig"] = generation
    if body.get("parallel_tool_calls") is False:
        adjusted.append("dropped parallel_tool_calls (Gemini has no switch for it)")
    return out, adjusted


def embeddings_request(
    body: dict[str, Any], provider: Any = None
) -> tuple[dict[str, Any], list[str]]:
    """An embeddings request as ``batchEmbedContents`` (the line sends one as ``embedContent``)."""
    value = body["input"]
    texts = [value] if isinstance(value, str) else value
    if not all(isinstance(text, str) for text in texts):
        raise Untranslatable("token ids as embeddings input (Gemini embeds text)")
    extra: dict[str, Any] = {}
    if body.get("dimensions") is not None:
        extra["outputDimensionality"] = body["dimensions"]
    requests = [{"content": {"parts": [{"text": text}]}, **extra} for text in texts]
    out: dict[str, Any] = {"requests": requests}
    if body.get("encoding_format") == "base64":
        # Not Gemini's: the line takes it off and marks the answer (see provider).
        out["encodingFormat"] = "base64"
    handled = ("model", "input", "dimensions", "encoding_format")
    adjusted = [f"dropped {key}" for key in body if key not in handled and body[key] is not None]
    return out, adjusted
