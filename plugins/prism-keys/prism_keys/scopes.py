"""Scopes: which endpoints and models a key may use, plus labels routing rules can read.

Syntax (one scope per item, items comma-separated on the command line):

- ``*``: every endpoint and every model;
- an endpoint name (``chat``, ``embeddings``): may call that endpoint;
- ``model:<name>``: may use that catalog model (or pinned ``provider/model``);
  ``model:<prefix>*`` any model whose name starts with the prefix;
  ``model:*`` every model;
- ``admin``: may use the admin API for its own organisation (prism-admin);
  grants no endpoint or model here;
- ``<namespace>:<value>`` with any other namespace (``tier:gold``,
  ``data:eu-only``): a label that grants nothing here but that routing
  rules can match on.

A call needs both an endpoint grant and a model grant.  Anything else is
refused when the key is created, so a typo never becomes a silent no-op.
"""

from __future__ import annotations

import re
from collections.abc import Iterable

import attrs

from prism_proxy import Endpoint

__all__ = ["Grants", "ScopeError", "parse_scopes"]

ALL = "*"
#: Administers its own organisation through the admin API; grants nothing here.
ADMIN = "admin"
MODEL_NS = "model"
_MODEL_PATTERN = re.compile(r"[A-Za-z0-9._:/@+-]+\*?|\*")
_LABEL = re.compile(r"([a-z][a-z0-9_.-]*):([A-Za-z0-9._:/@+-]+)")


class ScopeError(ValueError):
    """A scope that is not in the syntax above; the message says which and why."""


def endpoint_names() -> frozenset[str]:
    # Follows the core: a new endpoint becomes a valid scope without a change here.
    return frozenset(endpoint.value for endpoint in Endpoint)


def parse_scopes(items: Iterable[str]) -> tuple[str, ...]:
    """Check every scope; returns them de-duplicated in a stable order."""
    seen: dict[str, None] = {}
    endpoints = endpoint_names()
    for raw in items:
        scope = raw.strip()
        if not scope:
            continue
        if scope == ALL or scope == ADMIN or scope in endpoints:
            seen[scope] = None
            continue
        ns, sep, value = scope.partition(":")
        if not sep:
            known = ", ".join(sorted(endpoints))
            raise ScopeError(
                f"unknown scope {scope!r}: expected *, an endpoint ({known}), "
                "model:<name>, or a label like tier:gold"
            )
        if ns == MODEL_NS:
            if not _MODEL_PATTERN.fullmatch(value):
                raise ScopeError(
                    f"invalid model scope {scope!r}: expected model:<name>, "
                    "model:<prefix>* or model:*"
                )
        elif not _LABEL.fullmatch(scope):
            raise ScopeError(
                f"invalid label scope {scope!r}: expected <namespace>:<value> with a "
                "lower-case namespace and no spaces"
            )
        seen[scope] = None
    if not seen:
        raise ScopeError("no scopes given: a key needs at least an endpoint and a model scope")
    return tuple(seen)


@attrs.frozen
class Grants:
    """What a key's scopes allow, precomputed so each check is a set lookup."""

    endpoints: frozenset[str]
    models: frozenset[str]
    model_prefixes: tuple[str, ...]
    all_endpoints: bool
    all_models: bool

    @classmethod
    def from_scopes(cls, scopes: Iterable[str]) -> Grants:
        endpoints: set[str] = set()
        models: set[str] = set()
        prefixes: list[str] = []
        all_endpoints = all_models = False
        for scope in scopes:
            if scope == ALL:
                all_endpoints = all_models = True
            elif scope.startswith(MODEL_NS + ":"):
                name = scope[len(MODEL_NS) + 1 :]
                if name == ALL:
                    all_models = True
                elif name.endswith(ALL):
                    prefixes.append(name[:-1])
                else:
                    models.add(name)
            elif ":" not in scope and scope != ADMIN:
                endpoints.add(scope)
        return cls(
            endpoints=frozenset(endpoints),
            models=frozenset(models),
            model_prefixes=tuple(prefixes),
            all_endpoints=all_endpoints,
            all_models=all_models,
        )

    def allows_endpoint(self, endpoint: str) -> bool:
        return self.all_endpoints or endpoint in self.endpoints

    def allows_model(self, model: str) -> bool:
        return (
            self.all_models
            or model in self.models
            or any(model.startswith(prefix) for prefix in self.model_prefixes)
        )
