"""prism-keys through the real gateway: keys made by the CLI, used with the openai SDK."""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import sqlite3
from pathlib import Path

import aiohttp
import openai
import pytest
from prism_keys import hash_key, ring_of

from prism_proxy import Call, Principal, hookimpl
from prism_proxy.cli import main
from prism_proxy.testing import out_of_file_handles

MESSAGES = [{"role": "user", "content": "hello"}]


@pytest.fixture
def ini(tmp_path: Path) -> Path:
    path = tmp_path / "prism.ini"
    path.write_text("[prism]\ncatalog = catalog.toml\n\n[prism:keys]\ndb_path = keys.db\n")
    return path


def keys_cli(ini: Path, capsys: pytest.CaptureFixture[str], *args: str) -> tuple[int, str]:
    capsys.readouterr()
    status = main(["keys", *args, "--config", str(ini)])
    captured = capsys.readouterr()
    return status, captured.out + captured.err


def create_key(ini: Path, capsys: pytest.CaptureFixture[str], org: str, scopes: str) -> str:
    status, out = keys_cli(ini, capsys, "create", "--org", org, "--scopes", scopes)
    assert status == 0, out
    return out.rstrip("\n").splitlines()[-1]


def catalog(fake) -> dict:
    return {
        "providers": {"alpha": {"kind": "openai", "base_url": fake.base_url("ok")}},
        "models": {
            "chat-a": {"chain": [{"provider": "alpha", "model": "up-a"}]},
            "chat-b": {"chain": [{"provider": "alpha", "model": "up-b"}]},
            "embed-a": {"chain": [{"provider": "alpha", "model": "text-embed"}]},
        },
    }


async def start(prism_gateway, prism_fake, tmp_path: Path, **section: object):
    return await prism_gateway(
        catalog(prism_fake),
        sections={"keys": {"db_path": "keys.db", "refresh_s": 0.05, **section}},
        base_dir=tmp_path,
    )


async def post(gw, path: str, headers: dict[str, str], body: dict) -> tuple[int, dict]:
    async with aiohttp.ClientSession() as session:
        async with session.post(gw.base_url + path, json=body, headers=headers) as response:
            return response.status, await response.json()


async def chat_with(gw, headers: dict[str, str]) -> tuple[int, dict]:
    return await post(gw, "/chat/completions", headers, {"model": "chat-a", "messages": MESSAGES})


async def test_key_lifecycle_create_use_revoke(
    prism_fake, prism_gateway, tmp_path, ini, capsys, caplog
):
    caplog.set_level(logging.DEBUG)
    key = create_key(ini, capsys, "acme", "chat,model:*")
    assert key.startswith("sk-prism-")
    gw = await start(prism_gateway, prism_fake, tmp_path)

    # The official SDK sends it as a Bearer token.
    answer = await gw.openai(api_key=key).chat.completions.create(model="chat-a", messages=MESSAGES)
    assert answer.choices[0].message.content
    # Anthropic-style clients send x-api-key.
    status, _ = await chat_with(gw, {"x-api-key": key})
    assert status == 200

    wrong = key[:-4] + ("AAAA" if not key.endswith("AAAA") else "BBBB")
    refusals = [
        await chat_with(gw, {}),
        await chat_with(gw, {"Authorization": f"Bearer {wrong}"}),
        await chat_with(gw, {"Authorization": "Bearer not-even-a-prism-key"}),
    ]
    with pytest.raises(openai.AuthenticationError):
        await gw.openai(api_key=wrong).chat.completions.create(model="chat-a", messages=MESSAGES)

    key_id = key.split("-")[2]
    status, out = keys_cli(ini, capsys, "revoke", key_id)
    assert status == 0 and "revoked" in out
    ring = ring_of(gw.gateway.current)
    await ring.next_refresh()
    await ring.next_refresh()  # the first may have started before the revocation
    refusals.append(await chat_with(gw, {"Authorization": f"Bearer {key}"}))
    with pytest.raises(openai.AuthenticationError):
        await gw.openai(api_key=key).chat.completions.create(model="chat-a", messages=MESSAGES)

    # Missing, wrong, malformed and revoked look exactly alike.
    assert [status for status, _ in refusals] == [401] * 4
    assert all(body == refusals[0][1] for _, body in refusals)
    assert refusals[0][1]["error"]["code"] == "invalid_api_key"
    assert prism_fake.hits("ok") == 2  # refused calls never reach the upstream

    status, out = keys_cli(ini, capsys, "list")
    assert key_id in out and "revoked" in out and key not in out

    # The key text is nowhere: not in the database files, not in any log line.
    db_bytes = b"".join(p.read_bytes() for p in tmp_path.glob("keys.db*"))
    secret = key[len("sk-prism-") + 13 :]
    assert hash_key(key).encode() in db_bytes
    assert key.encode() not in db_bytes and secret.encode() not in db_bytes
    assert key not in caplog.text and secret not in caplog.text
    assert wrong not in caplog.text


async def test_scopes_limit_endpoints_and_models(prism_fake, prism_gateway, tmp_path, ini, capsys):
    chat_a_only = create_key(ini, capsys, "acme", "chat,model:chat-a")
    embedder = create_key(ini, capsys, "acme", "embeddings,model:embed-*")
    gw = await start(prism_gateway, prism_fake, tmp_path)

    client = gw.openai(api_key=chat_a_only)
    await client.chat.completions.create(model="chat-a", messages=MESSAGES)
    with pytest.raises(openai.PermissionDeniedError) as denied:
        await client.chat.completions.create(model="chat-b", messages=MESSAGES)
    assert denied.value.code == "insufficient_scope"
    assert "chat-b" in denied.value.message
    with pytest.raises(openai.PermissionDeniedError) as denied:
        await client.embeddings.create(model="embed-a", input="hi")
    assert denied.value.code == "insufficient_scope"
    assert "embeddings" in denied.value.message
    # Naming a binding directly is a model of its own: model:chat-a does not cover it.
    with pytest.raises(openai.PermissionDeniedError):
        await client.chat.completions.create(model="alpha/up-a", messages=MESSAGES)

    vectors = await gw.openai(api_key=embedder).embeddings.create(model="embed-a", input="hi")
    assert vectors.data
    with pytest.raises(openai.PermissionDeniedError):
        await gw.openai(api_key=embedder).chat.completions.create(model="chat-a", messages=MESSAGES)
    assert prism_fake.hits("ok") == 2
    assert gw.gateway.counters["keys_scope_denied"] == 4


async def test_the_model_list_shows_only_what_the_key_may_call(
    prism_fake, prism_gateway, tmp_path, ini, capsys
):
    chat_a_only = create_key(ini, capsys, "acme", "chat,model:chat-a")
    chats = create_key(ini, capsys, "acme", "chat,model:chat-*")
    everything = create_key(ini, capsys, "acme", "*")
    gw = await start(prism_gateway, prism_fake, tmp_path)

    async def listed(key: str) -> list[str]:
        return [model.id async for model in gw.openai(api_key=key).models.list()]

    assert await listed(chat_a_only) == ["chat-a"]
    assert await listed(chats) == ["chat-a", "chat-b"]
    assert await listed(everything) == ["chat-a", "chat-b", "embed-a"]
    anthropic_list = await gw.anthropic(api_key=chats).models.list()
    assert [model.id for model in anthropic_list.data] == ["chat-a", "chat-b"]
    # One the key may not use is as absent as one that does not exist.
    client = gw.openai(api_key=chat_a_only)
    assert (await client.models.retrieve("chat-a")).id == "chat-a"
    for name in ("chat-b", "no-such-model"):
        with pytest.raises(openai.NotFoundError) as absent:
            await client.models.retrieve(name)
        assert absent.value.code == "model_not_found"
    # Listing refuses nothing, so it counts no refusal.
    assert gw.gateway.counters["keys_scope_denied"] == 0


class PrincipalSpy:
    def __init__(self) -> None:
        self.seen: list[Principal] = []

    @hookimpl
    def prism_call_start(self, call: Call) -> None:
        self.seen.append(call.principal)


async def test_org_tags_reach_the_principal(
    prism_fake, prism_gateway, prism_plugin, tmp_path, ini, capsys
):
    spy = PrincipalSpy()
    prism_plugin(spy, "test-principal-spy")
    key = create_key(ini, capsys, "acme", "chat,model:chat-a,tier:gold")
    status, out = keys_cli(ini, capsys, "org-tags", "acme", "--set", "eu,enterprise")
    assert status == 0 and "acme: enterprise,eu" in out
    gw = await start(prism_gateway, prism_fake, tmp_path)

    await gw.openai(api_key=key).chat.completions.create(model="chat-a", messages=MESSAGES)
    principal = spy.seen[-1]
    assert principal.org == "acme"
    assert principal.org_tags == frozenset({"eu", "enterprise"})
    assert principal.scopes == frozenset({"chat", "model:chat-a", "tier:gold"})
    assert principal.key_id == key.split("-")[2]

    keys_cli(ini, capsys, "org-tags", "acme", "--set", "us")
    ring = ring_of(gw.gateway.current)
    await ring.next_refresh()
    await ring.next_refresh()
    await gw.openai(api_key=key).chat.completions.create(model="chat-a", messages=MESSAGES)
    assert spy.seen[-1].org_tags == frozenset({"us"})

    status, out = keys_cli(ini, capsys, "orgs")
    assert status == 0 and "acme" in out and "us" in out
    status, out = keys_cli(ini, capsys, "org-tags", "acme")
    assert out.strip() == "acme: us"


async def test_model_list_needs_a_key(prism_fake, prism_gateway, tmp_path, ini, capsys):
    key = create_key(ini, capsys, "acme", "chat,model:chat-a")
    gw = await start(prism_gateway, prism_fake, tmp_path)
    listed = await gw.openai(api_key=key).models.list()
    assert {m.id for m in listed.data} >= {"chat-a"}
    with pytest.raises(openai.AuthenticationError):
        await gw.openai(api_key="sk-prism-000000000000-nope").models.list()


async def test_installed_but_unconfigured_keeps_the_open_gateway_warning(
    prism_fake, prism_gateway, tmp_path, ini, capsys, caplog
):
    caplog.set_level(logging.WARNING, logger="prism")
    gw = await prism_gateway(catalog(prism_fake))
    assert "NO AUTHENTICATION PLUGIN IS ENABLED" in caplog.text
    status, _ = await chat_with(gw, {})  # open: anyone gets through, and was told so
    assert status == 200

    caplog.clear()
    create_key(ini, capsys, "acme", "*")
    gw = await start(prism_gateway, prism_fake, tmp_path)
    assert "NO AUTHENTICATION PLUGIN IS ENABLED" not in caplog.text
    status, _ = await chat_with(gw, {})
    assert status == 401


async def test_empty_database_refuses_everyone(prism_fake, prism_gateway, tmp_path, caplog):
    caplog.set_level(logging.WARNING, logger="prism.keys")
    gw = await start(prism_gateway, prism_fake, tmp_path)
    assert "no active API keys" in caplog.text
    status, body = await chat_with(gw, {"Authorization": "Bearer sk-prism-0123456789ab-x"})
    assert status == 401 and body["error"]["code"] == "invalid_api_key"


async def test_a_revocation_takes_effect_when_the_process_is_out_of_file_handles(
    prism_fake, prism_gateway, tmp_path, ini, capsys, caplog
):
    revoked = create_key(ini, capsys, "acme", "chat,model:*")
    kept = create_key(ini, capsys, "acme", "chat,model:*")
    # Polled only when the test says so (refresh_now), never behind its back.
    gw = await start(prism_gateway, prism_fake, tmp_path, refresh_s=300)
    ring = ring_of(gw.gateway.current)
    assert ring.verify(revoked) is not None

    # `prism keys revoke` runs in a process of its own, with file handles to spare.
    status, _ = keys_cli(ini, capsys, "revoke", revoked.split("-")[2])
    assert status == 0
    with out_of_file_handles():
        assert ring.verify(revoked) is not None  # not re-read yet
        assert await ring.refresh_now()
        assert ring.verify(revoked) is None
        assert ring.verify(kept) is not None
    assert "cannot re-read" not in caplog.text

    status, body = await chat_with(gw, {"Authorization": f"Bearer {revoked}"})
    assert (status, body["error"]["code"]) == (401, "invalid_api_key")
    status, _ = await chat_with(gw, {"Authorization": f"Bearer {kept}"})
    assert status == 200


async def test_a_failed_refresh_keeps_the_last_keys_and_the_next_one_recovers(
    prism_fake, prism_gateway, tmp_path, ini, capsys, caplog
):
    key = create_key(ini, capsys, "acme", "chat,model:*")
    gw = await start(prism_gateway, prism_fake, tmp_path)
    ring = ring_of(gw.gateway.current)
    loaded = ring.snapshot.revision

    # A row the gateway cannot read, written by something other than `prism keys`.
    with contextlib.closing(sqlite3.connect(tmp_path / "keys.db")) as db, db:
        db.execute("UPDATE orgs SET tags = 'not json' WHERE name = 'acme'")
        db.execute("UPDATE revision SET value = value + 1")
    async with asyncio.timeout(10):
        await ring.next_refresh()
        await ring.next_refresh()
    assert "keys: cannot re-read" in caplog.text
    assert ring.snapshot.revision == loaded  # the last good keys stay in use
    assert ring.verify(key) is not None

    # Repaired with the CLI (which would wait, then fail, on a transaction the
    # gateway left open): the background task is still polling and picks it up.
    status, _ = keys_cli(ini, capsys, "org-tags", "acme", "--set", "eu")
    assert status == 0
    async with asyncio.timeout(10):
        await ring.next_refresh()
        await ring.next_refresh()
    active = ring.verify(key)
    assert active is not None and active.principal.org_tags == frozenset({"eu"})


async def test_a_key_file_put_in_place_of_the_old_one_is_read(
    prism_fake, prism_gateway, tmp_path, ini, capsys
):
    old = create_key(ini, capsys, "acme", "chat,model:*")
    gw = await start(prism_gateway, prism_fake, tmp_path, refresh_s=300)
    ring = ring_of(gw.gateway.current)

    # A database made elsewhere (a restored backup, say), at the same revision.
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    (elsewhere / "prism.ini").write_text(ini.read_text())
    new = create_key(elsewhere / "prism.ini", capsys, "acme", "chat,model:*")
    os.replace(elsewhere / "keys.db", tmp_path / "keys.db")

    assert ring.verify(old) is not None
    assert await ring.refresh_now()
    assert ring.verify(old) is None
    assert ring.verify(new) is not None
