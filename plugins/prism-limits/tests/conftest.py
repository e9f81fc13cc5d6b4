"""Shared pieces for the limits tests: a priced catalog and callers whose limits the test sets."""

from __future__ import annotations

import sqlite3
from collections.abc import Mapping
from typing import Any

import attrs
import pytest
from prism_limits.limits import declarations

from prism_proxy import Principal, hookimpl

#: Per million tokens: 1 for input, 2 for output.
PRICE = {"input": 1.0, "output": 2.0}


def catalog(fake: Any, scenario: str = "a", **line: Any) -> dict[str, Any]:
    return {
        "providers": {scenario: {"kind": "openai", "base_url": fake.base_url(scenario)}},
        "models": {
            "m": {
                "retries": 0,
                "chain": [{"provider": scenario, "model": "up", "price": PRICE, **line}],
            }
        },
    }


def ledger_nanos(path: Any) -> int:
    """What a SQLite ledger's served rows cost, in nano-units."""
    conn = sqlite3.connect(path)
    try:
        (total,) = conn.execute(
            "SELECT COALESCE(SUM(cost_nanos), 0) FROM ledger WHERE provider IS NOT NULL"
        ).fetchone()
    finally:
        conn.close()
    return int(total)


def parsed(settings: Mapping[str, str]) -> dict[str, Any]:
    """Settings as prism-keys hands them over: each parsed by its declaration."""
    parsers = {declared.name: declared.parse for declared in declarations()}
    return {name: parsers[name.partition("@")[0]](value) for name, value in settings.items()}


@attrs.define
class Callers:
    """A stand-in auth plugin: ``x-test-key: KEY@ORG`` names the caller; the test sets
    each organisation's and key's settings (as prism-keys would hand them over)."""

    orgs: dict[str, dict[str, Any]] = attrs.field(factory=dict)
    keys: dict[str, dict[str, Any]] = attrs.field(factory=dict)
    #: One principal per caller until its settings change, as prism-keys keeps them.
    known: dict[str, Principal] = attrs.field(factory=dict)

    def org(self, name: str, **settings: str) -> None:
        self.orgs[name] = parsed(settings)
        self.known.clear()

    def key(self, key_id: str, **settings: str) -> None:
        self.keys[key_id] = parsed(settings)
        self.known.clear()

    @hookimpl
    def prism_authenticate(self, call: Any) -> Principal | None:
        value = call.request.headers.get("x-test-key")
        if not value:
            return None
        found = self.known.get(value)
        if found is None:
            key, _, org = value.partition("@")
            found = self.known[value] = Principal(
                key_id=key,
                org=org or None,
                settings=self.orgs.get(org, {}),
                key_settings=self.keys.get(key, {}),
            )
        return found


@pytest.fixture
def callers(prism_plugin: Any) -> Callers:
    found = Callers()
    prism_plugin(found, "test-callers")
    return found
