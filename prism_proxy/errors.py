"""Errors: configuration mistakes and caller-visible API errors."""

from __future__ import annotations

from typing import Any

__all__ = ["ECHO_LIMIT", "ConfigError", "PrismError", "echo"]

#: The most characters of a caller's text (a model name, a path) an error or a
#: log line repeats: enough for any real model name, while a hostile 100 KB
#: name costs no more to answer and log than a short one.
ECHO_LIMIT = 128


class ConfigError(Exception):
    """A configuration or catalog mistake; stops start-up.

    The message always names the file, the key and what is wrong, so an
    operator can fix it without reading code.
    """

    def __init__(self, source: str, key: str, problem: str) -> None:
        self.source = source
        self.key = key
        self.problem = problem
        super().__init__(f"{source}: {key}: {problem}")


class PrismError(Exception):
    """An error answered to the caller with an OpenAI- or Anthropic-shaped body.

    ``code`` is machine-readable and stable; ``param`` names the offending
    field when the caller's input is at fault.  The message never contains
    prompt text or credentials.
    """

    def __init__(
        self,
        status: int,
        code: str,
        message: str,
        *,
        param: str | None = None,
        type: str | None = None,
        extra: dict[str, Any] | None = None,
    ) -> None:
        self.status = status
        self.code = code
        self.message = message
        self.param = param
        self.type = type or _default_type(status)
        self.extra = extra or {}
        super().__init__(f"{status} {code}: {message}")


def _default_type(status: int) -> str:
    if status == 401:
        return "authentication_error"
    if status == 403:
        return "permission_error"
    if status == 404:
        return "not_found_error"
    if status == 429:
        return "rate_limit_error"
    if status < 500:
        return "invalid_request_error"
    return "api_error"


def echo(text: str) -> str:
    """``text`` as an answer or a log line may repeat it: at most :data:`ECHO_LIMIT`
    characters, a longer one cut there and marked with ``…``."""
    if len(text) <= ECHO_LIMIT:
        return text
    return text[:ECHO_LIMIT] + "…"
