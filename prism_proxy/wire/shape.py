"""The shape of a caller's request below its top-level fields.

Two checks, both before anything is sent upstream, both the caller's 400
naming the field:

- how deep the body nests: the encoder that writes the upstream request
  refuses more than 254 levels, and a body it cannot write must never reach
  a provider (where the failure would look like the upstream's);
  :data:`MAX_DEPTH` leaves room for what a translation adds;
- the members the translations read (tools, tool calls and results, content
  parts, ``tool_choice``, stop sequences …) are the types the API defines,
  so a translation never meets one it cannot handle, and a native upstream
  is never sent a tool schema that is not an object.

Only what is present is looked at; what the translations refuse as
inexpressible (a server tool, a document block) is theirs to say.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from ..errors import PrismError, echo

__all__ = [
    "ANTHROPIC_MEMBERS",
    "CHAT_MEMBERS",
    "MAX_DEPTH",
    "anthropic_block",
    "check_depth",
    "deeper_than",
    "openai_message",
    "openai_part",
]

#: The deepest a request may nest arrays and objects, the body itself being the
#: first level.  orjson writes at most 254; a translation adds a few at most
#: (tool call arguments, parsed, nest six levels down, and no deeper than this).
MAX_DEPTH = 128

_STR: tuple[type, ...] = (str,)
_DICT: tuple[type, ...] = (dict,)
_BOOL: tuple[type, ...] = (bool,)
_LIST: tuple[type, ...] = (list,)


def bad(code: str, message: str, param: str) -> PrismError:
    """A caller's 400, naming the field (``param``): every wire's request errors."""
    return PrismError(400, code, message, param=param)


def deeper_than(value: Any, limit: int) -> bool:
    """Whether ``value`` (an array or object) nests more than ``limit`` levels, itself one.

    Level by level, without recursion: a hostile body may nest a thousand deep.
    """
    level = [value]
    for _ in range(limit):
        below = []
        for item in level:
            for child in item.values() if type(item) is dict else item:
                if type(child) is dict or type(child) is list:
                    below.append(child)
        if not below:
            return False
        level = below
    return True


def check_depth(body: dict[str, Any], raw: bytes) -> None:
    """Refuse a body (``raw``, parsed) nested deeper than :data:`MAX_DEPTH`, naming its field."""
    # Each level opens a bracket: a body with few of them needs no walk (most do not).
    if raw.count(b"[") + raw.count(b"{") <= MAX_DEPTH:
        return
    for key, value in body.items():
        if (type(value) is dict or type(value) is list) and deeper_than(value, MAX_DEPTH - 1):
            name = echo(key)  # any member, known or not: the caller's text
            raise bad(
                "body_too_deep",
                f"'{name}' nests arrays and objects more than {MAX_DEPTH} levels deep",
                name,
            )


def _invalid(where: str, what: str) -> PrismError:
    return bad("invalid_type", f"'{where}' must be {what}", where)


def member(
    holder: dict[str, Any],
    key: str,
    where: str,
    types: tuple[type, ...],
    what: str,
    required: bool = False,
) -> Any:
    """``holder[key]`` when it is one of ``types`` (null counts as absent).

    ``where`` is the holder's path (empty for the body itself); the member's
    path is only spelt out for an error, so a passing body builds no strings.
    """
    value = holder.get(key)
    if value is None:
        if required:
            at = f"{where}.{key}" if where else key
            raise bad("missing_field", f"'{at}' is required", at)
        return None
    if not isinstance(value, types) or (isinstance(value, bool) and bool not in types):
        raise _invalid(f"{where}.{key}" if where else key, what)
    return value


def _object(value: Any, where: str) -> dict[str, Any]:
    if not isinstance(value, dict):
        raise _invalid(where, "an object")
    return value


def _strings(value: list[Any], where: str) -> None:
    for index, item in enumerate(value):
        if not isinstance(item, str):
            raise _invalid(f"{where}[{index}]", "a string")


# -- OpenAI chat ---------------------------------------------------------------


def _openai_function(function: dict[str, Any], where: str) -> None:
    member(function, "name", where, _STR, "a string", required=True)
    member(function, "description", where, _STR, "a string")
    member(function, "parameters", where, _DICT, "an object (a JSON Schema)")


def _openai_tools(tools: list[Any]) -> None:
    for index, tool in enumerate(tools):
        where = f"tools[{index}]"
        _object(tool, where)
        if member(tool, "type", where, _STR, "a string", required=True) == "function":
            function = member(tool, "function", where, _DICT, "an object", required=True)
            _openai_function(function, f"{where}.function")


def _openai_tool_choice(choice: Any) -> None:
    if isinstance(choice, dict):
        kind = member(choice, "type", "tool_choice", _STR, "a string", required=True)
        if kind == "function":
            function = member(choice, "function", "tool_choice", _DICT, "an object", required=True)
            member(function, "name", "tool_choice.function", _STR, "a string", required=True)


def _stop(stop: Any) -> None:
    if isinstance(stop, list):
        _strings(stop, "stop")


def _response_format(value: dict[str, Any]) -> None:
    member(value, "type", "response_format", _STR, "a string", required=True)


#: Chat fields (already of their top-level type) whose members are checked.
CHAT_MEMBERS: dict[str, Callable[[Any], None]] = {
    "tools": _openai_tools,
    "tool_choice": _openai_tool_choice,
    "stop": _stop,
    "modalities": lambda value: _strings(value, "modalities"),
    "response_format": _response_format,
}


def openai_part(part: dict[str, Any], kind: str, where: str) -> None:
    """The members of a content part (already known to be a part of type ``kind``)."""
    if kind == "text":
        member(part, "text", where, _STR, "a string", required=True)
    elif kind == "image_url":
        image = member(part, "image_url", where, _DICT, "an object", required=True)
        member(image, "url", f"{where}.image_url", _STR, "a string", required=True)


def openai_message(message: dict[str, Any], role: str, where: str) -> None:
    """What an assistant or tool message carries besides its content."""
    if role == "assistant":
        calls = member(message, "tool_calls", where, _LIST, "an array of tool calls")
        for index, call in enumerate(calls or ()):
            at = f"{where}.tool_calls[{index}]"
            _object(call, at)
            member(call, "id", at, _STR, "a string", required=True)
            if member(call, "type", at, _STR, "a string") in (None, "function"):
                function = member(call, "function", at, _DICT, "an object", required=True)
                member(function, "name", f"{at}.function", _STR, "a string", required=True)
                member(function, "arguments", f"{at}.function", _STR, "a string", required=True)
    elif role == "tool":
        member(message, "tool_call_id", where, _STR, "a string", required=True)


# -- Anthropic Messages --------------------------------------------------------


def _anthropic_text(block: Any, where: str) -> None:
    """A block of a system prompt or a tool result: an object, and text if it says so."""
    _object(block, where)
    kind = member(block, "type", where, _STR, "a string", required=True)
    if kind == "text":
        member(block, "text", where, _STR, "a string", required=True)


def anthropic_block(block: dict[str, Any], kind: str, where: str) -> None:
    """The members of a message's content block (already known to be of type ``kind``)."""
    if kind == "text":
        member(block, "text", where, _STR, "a string", required=True)
    elif kind == "image":
        source = member(block, "source", where, _DICT, "an object", required=True)
        at = f"{where}.source"
        source_type = member(source, "type", at, _STR, "a string", required=True)
        if source_type == "base64":
            member(source, "media_type", at, _STR, "a string", required=True)
            member(source, "data", at, _STR, "a string", required=True)
        elif source_type == "url":
            member(source, "url", at, _STR, "a string", required=True)
    elif kind == "tool_use":
        member(block, "id", where, _STR, "a string", required=True)
        member(block, "name", where, _STR, "a string", required=True)
        member(block, "input", where, _DICT, "an object", required=True)
    elif kind == "tool_result":
        member(block, "tool_use_id", where, _STR, "a string", required=True)
        member(block, "is_error", where, _BOOL, "true or false")
        content = member(
            block, "content", where, (str, list), "a string or an array of content blocks"
        )
        if isinstance(content, list):
            for index, inner in enumerate(content):
                _anthropic_text(inner, f"{where}.content[{index}]")


def _system(system: Any) -> None:
    if isinstance(system, list):
        for index, block in enumerate(system):
            where = f"system[{index}]"
            _anthropic_text(block, where)
            if block["type"] != "text":
                raise bad("invalid_value", f"'{where}.type' must be 'text'", f"{where}.type")


def _anthropic_tools(tools: list[Any]) -> None:
    for index, tool in enumerate(tools):
        where = f"tools[{index}]"
        _object(tool, where)
        member(tool, "type", where, _STR, "a string")
        member(tool, "name", where, _STR, "a string", required=True)
        member(tool, "description", where, _STR, "a string")
        member(tool, "input_schema", where, _DICT, "an object (a JSON Schema)")


def _anthropic_tool_choice(choice: dict[str, Any]) -> None:
    kind = member(choice, "type", "tool_choice", _STR, "a string", required=True)
    if kind == "tool":
        member(choice, "name", "tool_choice", _STR, "a string", required=True)
    member(choice, "disable_parallel_tool_use", "tool_choice", _BOOL, "true or false")


#: Messages fields (already of their top-level type) whose members are checked.
ANTHROPIC_MEMBERS: dict[str, Callable[[Any], None]] = {
    "system": _system,
    "tools": _anthropic_tools,
    "tool_choice": _anthropic_tool_choice,
    "stop_sequences": lambda value: _strings(value, "stop_sequences"),
    "metadata": lambda value: member(value, "user_id", "metadata", _STR, "a string"),
}
