"""`prism preflight` as an operator runs it: verdicts, exit status, suites, preflight traffic."""

from __future__ import annotations

import asyncio
import sqlite3
import sys
from pathlib import Path
from typing import Any

import aiohttp
import orjson
from prism_fake_upstream import Fault

from prism_proxy.testing import installed_plugins

LINES = ("fast", "slow", "brokentool", "fallback")


def write_config(tmp_path: Path, fake: Any, *, billing: bool = False) -> Path:
    providers = "".join(
        f'[providers.{n}]\nkind = "openai"\nbase_url = "{fake.base_url(n)}"\n' for n in LINES
    )
    price = ", price = { input = 1.0, output = 2.0 }" if billing else ""
    models = (
        '[models.m]\nchain = [ { provider = "fast", model = "up-fast", capabilities = ["tools"]'
        f'{price} }}, {{ provider = "fallback", model = "up-fallback"{price} }} ]\n'
        f'[models.s]\nchain = [ {{ provider = "slow", model = "up-slow"{price} }} ]\n'
        '[models.t]\nchain = [ { provider = "brokentool", model = "up-bt", '
        f'capabilities = ["tools"]{price} }} ]\n'
    )
    (tmp_path / "catalog.toml").write_text(providers + models)
    keep = {"openai", "probes"} | ({"billing"} if billing else set())
    disable = ", ".join(sorted(set(installed_plugins()) - keep))
    ini = tmp_path / "prism.ini"
    ini.write_text(
        f"[prism]\ncatalog = catalog.toml\nlog_level = WARNING\ndisable = {disable}\n"
        + ("[prism:billing]\nledger_path = ledger.sqlite\n" if billing else "")
    )
    return ini


async def preflight(ini: Path, *args: str) -> tuple[int, str, str]:
    process = await asyncio.create_subprocess_exec(
        sys.executable, "-m", "prism_proxy.cli", "preflight", "--config", str(ini), *args,
        stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE,
    )  # fmt: skip
    out, err = await asyncio.wait_for(process.communicate(), 60)
    assert process.returncode is not None
    return process.returncode, out.decode(), err.decode()


async def test_a_fast_capable_line_passes_every_verdict(prism_fake, tmp_path):
    ini = write_config(tmp_path, prism_fake)
    status, out, err = await preflight(ini, "--binding", "fast/up-fast", "--json")
    assert status == 0, out + err
    (report,) = orjson.loads(out)
    assert [report[v]["ok"] for v in ("reachable", "capable", "fast")] == [True] * 3
    assert report["capable"]["detail"] == "chat, tool"  # the line declares tools
    # reachable, the chat fixture, the tool fixture, the long prompt: four calls.
    assert prism_fake.hits("fast") == 4
    long_prompt = prism_fake.requests("fast")[-1]
    assert len(orjson.dumps(long_prompt.body)) > 8000  # the production-shaped prompt


async def test_a_line_correct_but_slow_on_the_long_prompt_fails_fast(prism_fake, tmp_path):
    ini = write_config(tmp_path, prism_fake)
    # Quick on the short checks, slow on the long prompt: seed 002's replacement model.
    prism_fake.script("slow", [Fault(), Fault(), Fault(first_token_delay_s=1.5)])
    status, out, _ = await preflight(ini, "--model", "s", "--first-token-ms", "1000")
    assert status == 1
    row = next(line for line in out.splitlines() if line.startswith("slow/up-slow"))
    assert "ok" in row.split("FAIL")[0]  # reachable and capable passed
    assert "FAIL first token" in row and "> 1000 ms" in row
    assert "NOT READY" in out


async def test_a_tool_call_whose_arguments_do_not_parse_fails_capable(prism_fake, tmp_path):
    ini = write_config(tmp_path, prism_fake)
    broken = {
        "id": "chatcmpl-x",
        "object": "chat.completion",
        "created": 0,
        "model": "up-bt",
        "choices": [
            {
                "index": 0,
                "message": {
                    "role": "assistant",
                    "content": None,
                    "tool_calls": [
                        {
                            "id": "call_1",
                            "type": "function",
                            "function": {"name": "get_weather", "arguments": '{"city": Lisb'},
                        }
                    ],
                },
                "finish_reason": "tool_calls",
            }
        ],
        "usage": {"prompt_tokens": 10, "completion_tokens": 5, "total_tokens": 15},
    }
    prism_fake.script("brokentool", [Fault(), Fault(), Fault(body=broken)])
    status, out, _ = await preflight(ini, "--model", "t", "--json")
    assert status == 1
    (report,) = orjson.loads(out)
    assert report["reachable"]["ok"] and not report["capable"]["ok"]
    assert report["capable"]["detail"] == "tool: tool arguments do not parse as JSON"


async def test_a_suite_names_the_fallback_that_fails_what_the_primary_passes(prism_fake, tmp_path):
    ini = write_config(tmp_path, prism_fake)
    suite = tmp_path / "suite.toml"
    suite.write_text(
        'system = "You are a support agent."\n'
        '[[cases]]\nname = "greets"\nprompt = "Say hello."\n'
        '[cases.expect]\nregex = "^Hello"\nmax_ms = 5000\n'
    )
    prism_fake.script("fallback", [Fault(text="Goodbye.")])
    status, out, _ = await preflight(ini, "--model", "m", "--suite", str(suite))
    assert status == 1
    assert (
        "parity: fallback/up-fallback fails 'greets', which fast/up-fast passes "
        "(answer does not match /^Hello/)" in out
    )


async def test_preflight_calls_are_preflight_traffic_in_the_ledger(prism_fake, tmp_path):
    ini = write_config(tmp_path, prism_fake, billing=True)
    status, out, err = await preflight(ini, "--binding", "fast/up-fast")
    assert status == 0, out + err
    conn = sqlite3.connect(tmp_path / "ledger.sqlite")
    try:
        traffic = {row[0] for row in conn.execute("SELECT traffic FROM ledger")}
    finally:
        conn.close()
    assert traffic == {"preflight"}


async def test_unknown_lines_and_bad_suites_are_usage_errors(prism_fake, tmp_path):
    ini = write_config(tmp_path, prism_fake)
    status, _, err = await preflight(ini, "--binding", "nope/x")
    assert status == 2 and "--binding: no 'nope/x' in the catalog" in err
    bad = tmp_path / "bad.toml"
    bad.write_text('[[cases]]\nname = "x"\nprompt = "p"\n[cases.expect]\nregex = "("\n')
    status, _, err = await preflight(ini, "--model", "m", "--suite", str(bad))
    assert status == 2 and "cases[0].expect.regex" in err


async def test_operator_traffic_needs_the_admin_token_and_is_no_evidence(
    prism_fake, prism_gateway, monkeypatch
):
    monkeypatch.setenv("PROBES_TEST_ADMIN", "probes-admin")
    catalog = {
        "providers": {"x": {"kind": "openai", "base_url": prism_fake.base_url("x")}},
        "models": {"m": {"retries": 0, "chain": [{"provider": "x", "model": "up-x"}]}},
    }
    gw = await prism_gateway(
        catalog,
        config={"admin_token_env": "PROBES_TEST_ADMIN"},
        sections={"breaker": {"policies": "consecutive", "consecutive_failures": 1}},
        load_plugins=["openai", "breaker", "probes"],
    )
    body = {"model": "x/up-x", "messages": [{"role": "user", "content": "hi"}]}

    async def post(headers: dict[str, str]) -> tuple[int, Any]:
        async with aiohttp.ClientSession() as session:
            async with session.post(
                gw.url + "/v1/chat/completions", json=body, headers=headers
            ) as response:
                return response.status, await response.json()

    status, answer = await post({"x-prism-traffic": "preflight"})
    assert (status, answer["error"]["code"]) == (403, "traffic_not_allowed")
    status, answer = await post({"x-prism-traffic": "free", "x-prism-admin-token": "probes-admin"})
    assert (status, answer["error"]["code"]) == (400, "invalid_traffic")
    status, answer = await post({"x-prism-internal-token": "guess"})
    assert (status, answer["error"]["code"]) == (403, "invalid_internal_token")

    # x fails once for a customer: isolated.  Preflight still reaches it, and its
    # failure or success changes nothing in the breaker.
    prism_fake.script("x", [Fault(status=500), Fault(status=500)])
    assert (await post({}))[0] == 503
    operator = {"x-prism-traffic": "preflight", "x-prism-admin-token": "probes-admin"}
    assert (await post(operator))[0] == 503
    assert (await post(operator))[0] == 200
    async with aiohttp.ClientSession() as session:
        async with session.get(gw.url + "/prism/health") as response:
            (entry,) = (await response.json())["bindings"]
    assert entry["state"] == "isolated" and entry["revision"] == 1
    assert entry["counts"] == {"transient": 1, "stale_ignored": 0}


async def test_a_vision_line_gets_the_vision_fixture_with_an_image(prism_fake, tmp_path):
    ini = write_config(tmp_path, prism_fake)
    catalog = (tmp_path / "catalog.toml").read_text()
    (tmp_path / "catalog.toml").write_text(
        catalog.replace('capabilities = ["tools"]', 'capabilities = ["tools", "vision"]', 1)
    )
    status, out, err = await preflight(ini, "--binding", "fast/up-fast", "--json")
    assert status == 0, out + err
    (report,) = orjson.loads(out)
    assert report["capable"]["detail"] == "chat, tool, vision"
    image_call = prism_fake.requests("fast")[3].body
    parts = image_call["messages"][0]["content"]
    assert parts[1]["image_url"]["url"].startswith("data:image/png;base64,")


def test_probe_takes_chat_embeddings_or_off():
    import pytest

    from prism_proxy import ConfigError, config_from_mapping, create_app

    catalog = {
        "providers": {"p": {"kind": "openai", "base_url": "http://127.0.0.1:9/v1"}},
        "models": {"m": {"chain": [{"provider": "p", "model": "x", "probe": "sometimes"}]}},
    }
    config = config_from_mapping({"disable": ["metrics"]}, catalog_data=catalog)
    with pytest.raises(ConfigError) as info:
        create_app(config)
    assert info.value.key == "models.m.chain[0].probe"


async def test_fixtures_can_be_replaced_and_keep_their_checks(prism_fake, tmp_path):
    ini = write_config(tmp_path, prism_fake)
    fixtures = tmp_path / "fixtures.toml"
    fixtures.write_text(
        '[chat]\nmax_tokens = 20\nmessages = [ { role = "user", content = "Ping for ACME." } ]\n'
    )
    status, out, err = await preflight(
        ini, "--binding", "slow/up-slow", "--fixtures", str(fixtures), "--json"
    )
    assert status == 0, out + err
    sent = [r.body["messages"][0]["content"] for r in prism_fake.requests("slow")]
    assert sent[:2] == ["Ping for ACME.", "Ping for ACME."]  # reachable and the chat fixture
    bad = tmp_path / "bad.toml"
    bad.write_text("[smell]\nmessages = []\n")
    status, _, err = await preflight(ini, "--binding", "slow/up-slow", "--fixtures", str(bad))
    assert status == 2 and "[smell]: no such fixture" in err


def with_keys(ini: Path) -> Path:
    """The configuration of ``write_config`` with prism-keys on (a key database, no key)."""
    text = ini.read_text().replace(", keys,", ",")  # "disable = anthropic, ..., keys, ..."
    assert ", keys," not in text and "keys" in installed_plugins()
    ini.write_text(text + "[prism:keys]\ndb_path = keys.db\n")
    return ini


async def test_with_keys_on_it_asks_for_an_api_key_instead_of_failing_every_line(
    prism_fake, tmp_path, monkeypatch
):
    monkeypatch.delenv("PRISM_API_KEY", raising=False)
    ini = with_keys(write_config(tmp_path, prism_fake))
    status, out, err = await preflight(ini, "--model", "m")
    assert status == 2, out + err
    assert out == ""
    assert err == (
        "prism preflight: this configuration requires an API key (keys.auth): "
        "pass --api-key KEY or set $PRISM_API_KEY\n"
    )
    assert prism_fake.hits("fast") == prism_fake.hits("fallback") == 0

    # A key the gateway does not know: said once, not as two unreachable lines.
    status, out, err = await preflight(ini, "--model", "m", "--api-key", "sk-not-a-key")
    assert status == 2, out + err
    assert err.endswith(
        "prism preflight: the gateway refused the API key given (invalid_api_key)\n"
    )
    assert "sk-not-a-key" not in out + err
    assert prism_fake.hits("fast") == 0
