"""A key's life through the gateway with the openai SDK: create, call, rotate (both texts work
for the grace period, the old one not after), revoke, expire; every write audited, no secret
in the audit log; usage as the ledger says."""

from __future__ import annotations

import calendar
import io
import json
import time
from pathlib import Path
from typing import Any

import openai
import pytest
from prism_keys import hash_key

from prism_proxy.cli import main

MESSAGES = [{"role": "user", "content": "hello"}]


async def chat(api: Any, key: str, model: str = "m") -> tuple[int, str | None]:
    client = api.gateway.openai(api_key=key)
    try:
        await client.chat.completions.create(model=model, messages=MESSAGES)
    except openai.APIStatusError as exc:
        body = exc.body if isinstance(exc.body, dict) else {}
        return exc.status_code, body.get("code") or (body.get("error") or {}).get("code")
    finally:
        await client.close()
    return 200, None


def stamp(text: str) -> float:
    return float(calendar.timegm(time.strptime(text, "%Y-%m-%dT%H:%M:%SZ")))


def rfc3339(at: float) -> str:
    return time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(at))


async def test_create_call_rotate_revoke_expire(api, prism_clock):
    await api.ok("POST", "/orgs", json={"name": "acme"})
    made = await api.ok("POST", "/keys", json={"org": "acme", "scopes": ["chat", "model:*"]})
    old, key_id = made["key"], made["id"]
    assert old.startswith(made["prefix"])
    assert await chat(api, old) == (200, None)
    listed = await api.ok("GET", f"/keys/{key_id}")
    assert listed["last_used"] is not None and "key" not in listed

    rotated = await api.ok("POST", f"/keys/{key_id}/rotate", json={"grace_s": 60})
    new = rotated["key"]
    assert new != old and rotated["id"] == key_id
    assert await chat(api, old) == (200, None)
    assert await chat(api, new) == (200, None)
    prism_clock.advance(61)
    assert await chat(api, old) == (401, "invalid_api_key")
    assert await chat(api, new) == (200, None)

    await api.ok("DELETE", f"/keys/{key_id}")
    assert await chat(api, new) == (401, "invalid_api_key")

    short = await api.ok("POST", "/keys", json={"org": "acme", "scopes": ["chat", "model:*"]})
    expires = rfc3339(stamp(short["created"]) + 300)
    await api.ok("PATCH", f"/keys/{short['id']}", json={"expires_at": expires})
    assert await chat(api, short["key"]) == (200, None)
    prism_clock.advance(400)
    assert await chat(api, short["key"]) == (401, "key_expired")
    assert (await api.ok("GET", f"/keys/{short['id']}"))["expired"] is True

    entries = (await api.ok("GET", "/audit"))["entries"]
    actions = [e["action"] for e in reversed(entries)]
    assert actions == [
        "org.create",
        "key.create",
        "key.rotate",
        "key.revoke",
        "key.create",
        "key.update",
    ]
    assert all(e["actor"] == "admin" and e["address"] == "127.0.0.1" for e in entries)
    assert entries[0]["before"]["expires_at"] is None
    assert entries[0]["after"]["expires_at"] == expires
    dumped = json.dumps(entries)
    for secret in (old, new, short["key"]):
        assert secret not in dumped
        # The random part (after sk-prism-ID-); it may itself hold dashes.
        tail = secret[secret.index("-", len("sk-prism-")) + 1 :]
        assert len(tail) > 20 and tail not in dumped
        assert hash_key(secret) not in dumped


async def test_an_org_admin_key_writes_are_audited_as_that_key(api):
    await api.ok("POST", "/orgs", json={"name": "acme"})
    boss = await api.ok("POST", "/keys", json={"org": "acme", "scopes": ["admin"]})
    made = await api.ok("POST", "/keys", boss["key"], json={"org": "acme", "scopes": ["chat"]})
    entry = (await api.ok("GET", "/audit", boss["key"]))["entries"][0]
    assert entry["actor"] == f"key:{boss['id']}"
    assert entry["subject"] == f"key:{made['id']}"
    # Its organisation's settings are the operator's ceiling: it may not change them.
    status, answer = await api.call(
        "PATCH", "/orgs/acme", boss["key"], json={"settings": {"max_output_price": "1"}}
    )
    assert status == 403 and "admin token" in answer["error"]["message"]


async def test_usage_equals_the_ledger_export(api, tmp_path: Path, capsys, engine):
    if engine != "sqlite":
        pytest.skip("the ledger is SQLite in both; one run is enough")
    await api.ok("POST", "/orgs", json={"name": "acme"})
    await api.ok("POST", "/orgs", json={"name": "beta"})
    a = await api.ok("POST", "/keys", json={"org": "acme", "scopes": ["chat", "model:*"]})
    b = await api.ok("POST", "/keys", json={"org": "beta", "scopes": ["chat", "model:*"]})
    for key, model in ((a, "m"), (a, "m"), (a, "n"), (b, "m")):
        assert await chat(api, key["key"], model) == (200, None)
    await api.gateway.gateway.current.drain() if hasattr(
        api.gateway.gateway.current, "drain"
    ) else None

    ini = tmp_path / "prism.ini"
    ini.write_text("[prism]\ncatalog = c.toml\n\n[prism:billing]\nledger_path = ledger.db\n")
    capsys.readouterr()
    assert main(["ledger", "export", "--format", "jsonl", "--config", str(ini)]) == 0
    rows = [json.loads(line) for line in capsys.readouterr().out.splitlines() if line]
    expected: dict[tuple[str, str], dict[str, Any]] = {}
    for row in rows:
        group = expected.setdefault(
            (row["key_id"], row["model"]), {"calls": 0, "input_tokens": 0, "output_tokens": 0}
        )
        group["calls"] += 1
        group["input_tokens"] += row["input_tokens"]
        group["output_tokens"] += row["output_tokens"]
    assert sum(g["calls"] for g in expected.values()) == 4

    usage = await api.ok("GET", "/usage?group_by=key,model")
    got = {
        (g["key"], g["model"]): {n: g[n] for n in ("calls", "input_tokens", "output_tokens")}
        for g in usage["groups"]
    }
    assert got == expected
    # An org admin reads its own organisation's only; as CSV too.
    boss = await api.ok("POST", "/keys", json={"org": "beta", "scopes": ["admin"]})
    own = await api.ok("GET", "/usage?group_by=org,model,hour", boss["key"])
    assert [(g["org"], g["calls"]) for g in own["groups"]] == [("beta", 1)]
    status, text = await api.call("GET", "/usage?group_by=key&format=csv")
    assert status == 200
    lines = list(io.StringIO(text))
    assert lines[0].startswith("key,calls,") and len(lines) == 3
