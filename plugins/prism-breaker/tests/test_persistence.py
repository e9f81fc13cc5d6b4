"""Transitions reach the SQLite file; a new process starts from it, never from 'all healthy'."""

from __future__ import annotations

import asyncio
import signal
import time

import aiohttp
import pytest
from prism_breaker import Settings, SqliteStore
from prism_fake_upstream import Fault

from prism_proxy import ConfigError, config_from_mapping, load_config
from prism_proxy.testing import free_port, serve_process

MESSAGES = [{"role": "user", "content": "hello"}]


def catalog(fake) -> dict:
    return {
        "providers": {
            name: {"kind": "openai", "base_url": fake.base_url(name)} for name in ("x", "y", "ok")
        },
        "models": {
            "mx": {"chain": [{"provider": "x", "model": "up-x"}, {"provider": "ok", "model": "o"}]},
            "my": {"chain": [{"provider": "y", "model": "up-y"}, {"provider": "ok", "model": "o"}]},
        },
    }


def catalog_toml(fake) -> str:
    lines = []
    for name in ("x", "y", "ok"):
        lines += [f"[providers.{name}]", 'kind = "openai"', f'base_url = "{fake.base_url(name)}"']
    lines += [
        "[models.mx]",
        'chain = [{ provider = "x", model = "up-x" }, { provider = "ok", model = "o" }]',
        "[models.my]",
        'chain = [{ provider = "y", model = "up-y" }, { provider = "ok", model = "o" }]',
    ]
    return "\n".join(lines) + "\n"


async def test_a_restart_keeps_isolation_and_resumes_trials(
    prism_fake, prism_gateway, kit, fake_time, tmp_path
):
    prism_fake.script("x", [Fault(status=500)] * 100)
    prism_fake.script("y", [Fault(status=500)] * 3)
    gw = await prism_gateway(
        catalog(prism_fake),
        clock=fake_time.clock,
        sleep=fake_time.sleep,
        sections={"breaker": {"state_path": str(tmp_path / "breaker.sqlite")}},
    )
    await kit.chat(gw, model="my")  # y trips
    fake_time.advance(31)
    trial = await kit.chat(gw, model="my")  # y's window ended: one trial success (of 5)
    assert trial.headers["x-prism-breaker"] == "trial y/up-y"
    await kit.chat(gw, model="mx")  # x trips
    await gw.stop()
    hits_x = prism_fake.hits("x")

    port = free_port()
    (tmp_path / "catalog.toml").write_text(catalog_toml(prism_fake))
    (tmp_path / "prism.ini").write_text(
        f"[prism]\nlisten = 127.0.0.1:{port}\ncatalog = catalog.toml\n"
        "[prism:breaker]\nstate_path = breaker.sqlite\n"
    )
    process = await serve_process(tmp_path / "prism.ini", port)
    try:
        url = f"http://127.0.0.1:{port}"
        async with aiohttp.ClientSession() as session:
            async with session.get(url + "/prism/health") as response:
                states = {b["binding"]: b for b in (await response.json())["bindings"]}
            assert states["x/up-x"]["state"] == "isolated"
            assert states["x/up-x"]["cause"].startswith("3 consecutive failures")
            assert states["y/up-y"]["state"] == "trial"
            assert states["y/up-y"]["trial"]["successes"] == 0  # evidence starts over
            assert states["ok/o"]["state"] == "eligible"
            body = {"model": "mx", "messages": MESSAGES}
            async with session.post(url + "/v1/chat/completions", json=body) as response:
                assert response.status == 200
                assert response.headers["x-prism-provider"] == "ok"
                log = response.headers["x-prism-attempt-log"]
                assert log.startswith("x/up-x skipped breaker: isolated")
            body = {"model": "my", "messages": MESSAGES}
            async with session.post(url + "/v1/chat/completions", json=body) as response:
                assert response.headers["x-prism-breaker"] == "trial y/up-y"
                assert response.headers["x-prism-provider"] == "y"
        assert prism_fake.hits("x") == hits_x
    finally:
        process.send_signal(signal.SIGTERM)
        assert await asyncio.wait_for(process.wait(), 15) == 0


async def test_every_transition_is_a_row_with_time_cause_evidence_and_revision(
    prism_fake, prism_gateway, kit, fake_time, tmp_path
):
    path = tmp_path / "state.sqlite"
    prism_fake.script("x", [Fault(status=500)] * 3)
    gw = await prism_gateway(
        catalog(prism_fake),
        clock=fake_time.clock,
        sleep=fake_time.sleep,
        sections={"breaker": {"state_path": str(path)}},
    )
    started = time.time()
    await kit.chat(gw, model="mx")
    await gw.stop()
    store = SqliteStore(str(path))
    await store.open()
    try:
        rows = list(reversed(await store.audit(subjects=["x/up-x"])))
        [record] = [r for r in await store.load_bindings() if r.binding == "x/up-x"]
    finally:
        await store.close()
    assert [(r.from_state, r.to_state, r.revision) for r in rows] == [
        ("eligible", "suspect", 1),
        ("suspect", "isolated", 2),
    ]
    isolated = rows[1]
    assert isolated.actor == "breaker" and isolated.action == "transition"
    assert isolated.cause == "3 consecutive failures (transient 500: upstream 500)"
    assert isolated.evidence["consecutive_failures"] == 3
    assert isolated.evidence["window_failures"] == 3
    assert isolated.evidence["isolation_s"] == 30
    # The deciding attempt, and the revision it started under (the suspect state's).
    assert isolated.evidence["attempt"]["id"].startswith("att_")
    assert isolated.evidence["attempt"]["revision"] == 1
    assert started - 5 < isolated.at < time.time() + 5
    assert (record.state, record.revision, record.isolated_revision) == ("isolated", 2, 2)
    assert record.isolated_until == pytest.approx(isolated.at + 30)
    # Nothing of the conversation is in the file.
    assert b"hello" not in path.read_bytes()


async def test_an_unusable_state_file_stops_start_up(prism_fake, prism_gateway, kit, tmp_path):
    path = tmp_path / "newer.sqlite"
    store = SqliteStore(str(path))
    await store.open()
    await store.close()
    import sqlite3

    with sqlite3.connect(path) as conn:
        conn.execute("PRAGMA user_version=99")
    with pytest.raises(ConfigError, match=r"state_path: .* written by a newer prism-breaker"):
        await prism_gateway(kit.catalog("ok"), sections={"breaker": {"state_path": str(path)}})


def test_the_state_file_defaults_to_beside_the_config_file(tmp_path):
    (tmp_path / "prism.ini").write_text("[prism]\ncatalog = c.toml\n")
    assert Settings.from_config(load_config(tmp_path / "prism.ini")).state_path == str(
        (tmp_path / "prism-breaker.sqlite").resolve()
    )
    # Built in memory (tests, embedding apps): no file unless one is named.
    in_memory = config_from_mapping({}, catalog_data={})
    assert Settings.from_config(in_memory).state_path == ":memory:"
    named = config_from_mapping(
        {}, {"breaker": {"state_path": "b.sqlite"}}, base_dir=tmp_path, catalog_data={}
    )
    assert Settings.from_config(named).state_path == str((tmp_path / "b.sqlite").resolve())


@pytest.mark.parametrize(
    ("values", "message"),
    [
        ({"consecutive_failure": "3"}, r"\[prism:breaker\] consecutive_failure: unknown key"),
        ({"policies": "consecutive, latncy"}, r"policies: unknown policy latncy"),
        ({"error_rate": "25"}, r"error_rate: must be a fraction between 0 and 1"),
        ({"isolation_s": "60", "isolation_max_s": "30"}, r"isolation_max_s: must be at least 60"),
        ({"trial_max_in_flight": "0"}, r"trial_max_in_flight: must be at least 1"),
        ({"latency_window_s": "30"}, r"latency_window_s: must be longer than latency_sustain_s"),
        ({"state_path": "/nonexistent-dir/x.sqlite"}, r"state_path: directory .* does not exist"),
    ],
)
def test_configuration_mistakes_name_the_key(values, message):
    config = config_from_mapping({}, {"breaker": values}, source="prism.ini", catalog_data={})
    with pytest.raises(ConfigError, match=message):
        Settings.from_config(config)


class FailingWrites:
    """The real store, whose next few transition writes fail (a full disk, say)."""

    def __init__(self, store, failures: int) -> None:
        self.store = store
        self.failures = failures

    def __getattr__(self, name):
        return getattr(self.store, name)

    async def record_transitions(self, transitions):
        if self.failures > 0:
            self.failures -= 1
            raise OSError("disk full")
        return await self.store.record_transitions(transitions)


async def test_a_failing_store_never_stops_routing_and_catches_up(
    prism_fake, prism_gateway, kit, tmp_path, caplog
):
    from prism_breaker import breaker_of

    prism_fake.script("x", [Fault(status=500)] * 3)
    gw = await prism_gateway(
        catalog(prism_fake),
        sections={"breaker": {"state_path": str(tmp_path / "s.sqlite"), "refresh_s": 0.05}},
    )
    breaker = breaker_of(gw.gateway.current)
    flaky = FailingWrites(breaker.store, failures=1_000_000)
    breaker.store = flaky
    assert (await kit.chat(gw, model="mx")).provider == "ok"

    async def failed() -> bool:
        return (await kit.health(gw))["store"]["last_error"] == "OSError: disk full"

    await kit.eventually(failed)
    second = await kit.chat(gw, model="mx")  # routing still reads memory
    assert second.log[0] == "x/up-x skipped breaker: isolated"
    flaky.failures = 0  # the disk has room again

    async def caught_up() -> bool:
        store = (await kit.health(gw))["store"]
        return store["pending_writes"] == 0 and store["last_error"] is None

    await kit.eventually(caught_up)
    rows = await breaker.store.audit(subjects=["x/up-x"])
    assert [r.to_state for r in reversed(rows)] == ["suspect", "isolated"]
    isolations = [r for r in caplog.records if "suspect -> isolated" in r.getMessage()]
    assert len(isolations) == 1  # logged once, not once per retry
