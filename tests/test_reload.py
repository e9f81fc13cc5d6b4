"""Generations: a reload builds the next configuration beside the running one and swaps it in."""

from __future__ import annotations

import asyncio
import signal
from pathlib import Path

import aiohttp
import openai
import pytest
from prism_fake_upstream import Fault

from prism_proxy import ConfigError, config_from_mapping, hookimpl
from prism_proxy.testing import free_port, serve_process

MESSAGES = [{"role": "user", "content": "hi"}]
ADMIN_ENV = "PRISM_RELOAD_TEST_ADMIN"


def catalog_toml(fake, models: dict[str, str]) -> str:
    """One provider per scenario; each model served by the scenario it names."""
    lines = []
    for scenario in sorted(set(models.values())):
        lines += [
            f"[providers.{scenario}]",
            'kind = "openai"',
            f'base_url = "{fake.base_url(scenario)}"',
        ]
    for model, scenario in models.items():
        lines += [f"[models.{model}]", f'chain = [ {{ provider = "{scenario}", model = "up" }} ]']
    return "\n".join(lines) + "\n"


async def start(tmp_path: Path, fake, models: dict[str, str], extra: str = ""):
    port = free_port()
    (tmp_path / "catalog.toml").write_text(catalog_toml(fake, models))
    (tmp_path / "prism.ini").write_text(
        f"[prism]\nlisten = 127.0.0.1:{port}\ncatalog = catalog.toml\n"
        f"admin_token_env = {ADMIN_ENV}\n{extra}"
    )
    process = await serve_process(
        tmp_path / "prism.ini", port, env={ADMIN_ENV: "s3cret"}, stderr=asyncio.subprocess.PIPE
    )
    return process, f"http://127.0.0.1:{port}"


async def stop(process) -> bytes:
    process.send_signal(signal.SIGTERM)
    _, stderr = await asyncio.wait_for(process.communicate(), 20)
    assert process.returncode == 0
    return stderr


async def generation(session: aiohttp.ClientSession, url: str) -> int:
    async with session.get(url + "/readyz") as response:
        return (await response.json())["generation"]


async def until_generation(session, url: str, number: int) -> None:
    for _ in range(200):
        if await generation(session, url) == number:
            return
        await asyncio.sleep(0.05)
    raise AssertionError(f"generation {number} never came")


async def chat(session, url: str, model: str) -> tuple[int, dict]:
    body = {"model": model, "messages": MESSAGES}
    async with session.post(url + "/v1/chat/completions", json=body) as response:
        return response.status, await response.json()


async def test_a_model_added_to_the_catalog_is_served_after_sighup(prism_fake, tmp_path):
    process, url = await start(tmp_path, prism_fake, {"m": "ok"})
    try:
        async with aiohttp.ClientSession() as session:
            assert (await chat(session, url, "new"))[0] == 404
            (tmp_path / "catalog.toml").write_text(
                catalog_toml(prism_fake, {"m": "ok", "new": "ok2"})
            )
            process.send_signal(signal.SIGHUP)
            await until_generation(session, url, 2)
            status, body = await chat(session, url, "new")
            assert status == 200, body
            assert prism_fake.hits("ok2") == 1
            assert (await chat(session, url, "m"))[0] == 200
    finally:
        stderr = await stop(process)
    assert b"generation 2 serving" in stderr


async def test_a_stream_in_flight_during_sighup_completes(prism_fake, tmp_path):
    prism_fake.script("slow", [Fault(token_delay_s=0.15, text="one two three four five six")])
    process, url = await start(tmp_path, prism_fake, {"m": "slow"})
    try:
        async with aiohttp.ClientSession() as session:
            body = {"model": "m", "messages": MESSAGES, "stream": True}
            async with session.post(url + "/v1/chat/completions", json=body) as response:
                first = await response.content.readline()
                (tmp_path / "catalog.toml").write_text(
                    catalog_toml(prism_fake, {"m": "ok", "other": "ok"})
                )
                process.send_signal(signal.SIGHUP)
                await until_generation(session, url, 2)
                rest = await response.content.read()
            stream = first + rest
            assert stream.rstrip().endswith(b"data: [DONE]")
            text = b"".join(
                part.split(b'"content":"')[1].split(b'"')[0]
                for part in stream.split(b"\n\n")
                if b'"content":"' in part
            )
            assert text == b"one two three four five six"
            # New calls go to the new generation's line.
            assert (await chat(session, url, "m"))[0] == 200
            assert prism_fake.hits("ok") == 1
    finally:
        await stop(process)


async def test_a_broken_catalog_on_sighup_leaves_the_old_one_serving(prism_fake, tmp_path):
    process, url = await start(tmp_path, prism_fake, {"m": "ok"})
    try:
        async with aiohttp.ClientSession() as session:
            (tmp_path / "catalog.toml").write_text('[models.m]\nchain = "not a list"\n')
            process.send_signal(signal.SIGHUP)
            for _ in range(100):
                async with session.get(url + "/prism/stats") as response:
                    counters = (await response.json())["counters"]
                if counters.get("reloads_refused"):
                    break
                await asyncio.sleep(0.05)
            assert counters["reloads_refused"] == 1
            assert await generation(session, url) == 1
            assert (await chat(session, url, "m"))[0] == 200
            # The admin endpoint refuses it with the same one-line error.
            headers = {"Authorization": "Bearer s3cret"}
            async with session.post(url + "/prism/admin/reload", headers=headers) as response:
                refused = await response.json()
            assert response.status == 400
            assert refused["error"]["code"] == "reload_refused"
            assert "catalog.toml: models.m.chain:" in refused["error"]["message"]
    finally:
        stderr = await stop(process)
    lines = [line for line in stderr.decode().splitlines() if "reload refused" in line]
    # One line per refusal (the signal's and the admin call's), naming the file and key.
    assert len(lines) == 2 and all("catalog.toml: models.m.chain:" in line for line in lines)
    assert "Traceback" not in stderr.decode()


async def test_breaker_isolation_survives_sighup(prism_fake, tmp_path):
    extra = "[prism:breaker]\nstate_path = breaker.sqlite\nconsecutive_failures = 1\n"
    process, url = await start(tmp_path, prism_fake, {"m": "err500", "n": "ok"}, extra)
    try:
        async with aiohttp.ClientSession() as session:
            assert (await chat(session, url, "m"))[0] == 503
            async with session.get(url + "/prism/health") as response:
                before = {b["binding"]: b["state"] for b in (await response.json())["bindings"]}
            assert before["err500/up"] == "isolated"
            hits = prism_fake.hits("err500")
            process.send_signal(signal.SIGHUP)
            await until_generation(session, url, 2)
            async with session.get(url + "/prism/health") as response:
                after = {b["binding"]: b["state"] for b in (await response.json())["bindings"]}
            assert after["err500/up"] == "isolated"
            assert prism_fake.hits("err500") == hits
    finally:
        await stop(process)


async def test_admin_reload_needs_the_token_and_swaps_the_generation(prism_fake, tmp_path):
    process, url = await start(tmp_path, prism_fake, {"m": "ok"})
    try:
        async with aiohttp.ClientSession() as session:
            async with session.post(url + "/prism/admin/reload") as response:
                assert response.status == 401
            headers = {"Authorization": "Bearer s3cret"}
            async with session.post(url + "/prism/admin/reload", headers=headers) as response:
                assert response.status == 200
                assert (await response.json())["generation"] == 2
            assert await generation(session, url) == 2
    finally:
        await stop(process)


async def test_a_late_completion_on_a_changed_line_is_not_evidence(prism_fake, prism_gateway):
    """A call that started before a reload changed its line's URL reports on a line that is gone."""
    prism_fake.script("slow", [Fault(stall_s=0.5, status=500)])

    def catalog(scenario: str) -> dict:
        return {
            "providers": {"p": {"kind": "openai", "base_url": prism_fake.base_url(scenario)}},
            "models": {"m": {"retries": 0, "chain": [{"provider": "p", "model": "up"}]}},
        }

    sections = {"breaker": {"consecutive_failures": 1}}
    gw = await prism_gateway(catalog("slow"), sections=sections)
    client = gw.openai()
    late = asyncio.create_task(client.chat.completions.create(model="m", messages=MESSAGES))
    await asyncio.sleep(0.2)  # the attempt is out on generation 1
    gateway = gw.gateway
    await gateway.reload(config_from_mapping({}, sections, catalog_data=catalog("ok")))
    with pytest.raises(openai.APIStatusError):
        await late  # generation 1's line answered 500
    counters = gateway.counters
    assert counters["breaker_stale_evidence"] == 1
    from prism_breaker import breaker_of

    breaker = breaker_of(gateway.current)
    assert str(breaker.machine.get("p/up", gateway.clock()).state) == "eligible"
    answer = await client.chat.completions.create(model="m", messages=MESSAGES)
    assert answer.choices[0].message.content


async def test_an_unchanged_line_keeps_counting_across_a_reload(prism_fake, prism_gateway):
    prism_fake.script("slow", [Fault(stall_s=0.5, status=500)])
    catalog = {
        "providers": {"p": {"kind": "openai", "base_url": prism_fake.base_url("slow")}},
        "models": {"m": {"retries": 0, "chain": [{"provider": "p", "model": "up"}]}},
    }
    sections = {"breaker": {"consecutive_failures": 1}}
    gw = await prism_gateway(catalog, sections=sections)
    late = asyncio.create_task(gw.openai().chat.completions.create(model="m", messages=MESSAGES))
    await asyncio.sleep(0.2)
    gateway = gw.gateway
    await gateway.reload(config_from_mapping({}, sections, catalog_data=catalog))
    with pytest.raises(openai.APIStatusError):
        await late
    from prism_breaker import breaker_of

    breaker = breaker_of(gateway.current)
    assert str(breaker.machine.get("p/up", gateway.clock()).state) == "isolated"


class Misspelt:
    @hookimpl
    def prism_setle(self, call, settlement):  # a typo: no such hook
        return None


class RegistersLate:
    @hookimpl
    def prism_generation(self, generation):
        generation.register(Misspelt(), "late.misspelt")


def test_a_late_registration_with_a_misspelt_hook_stops_start_up(prism_fake):
    from prism_proxy import create_app

    catalog = {
        "providers": {"p": {"kind": "openai", "base_url": prism_fake.base_url("ok")}},
        "models": {"m": {"chain": [{"provider": "p", "model": "up"}]}},
    }
    with pytest.raises(ConfigError, match=r"late\.misspelt.*prism_setle"):
        create_app(
            config_from_mapping({}, catalog_data=catalog),
            plugins=[(RegistersLate(), "registers-late")],
        )
