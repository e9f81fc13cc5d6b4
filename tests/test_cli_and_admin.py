"""Plugins add CLI commands and admin routes through the core's one mechanism each."""

from __future__ import annotations

import aiohttp
import pytest
from aiohttp import web

from prism_proxy import admin_handler, hookimpl
from prism_proxy.cli import main


class Greeter:
    @hookimpl
    def prism_cli(self, commands):
        parser = commands.add("greet", "say hello", self.run)
        parser.add_argument("name")

    def run(self, args, config):
        print(f"hello {args.name} from {config.source}")
        return 3

    @hookimpl
    def prism_app_setup(self, app, config):
        @admin_handler
        async def secret(request: web.Request) -> web.Response:
            return web.json_response({"secret": "admin only"})

        app.router.add_get("/greeter/admin", secret)


def test_plugin_command_runs_with_the_loaded_config(tmp_path, monkeypatch, capsys):
    (tmp_path / "prism.ini").write_text("[prism]\ncatalog = c.toml\n")
    monkeypatch.chdir(tmp_path)
    monkeypatch.setattr(
        "prism_proxy.cli.make_plugin_manager",
        _with_plugin(Greeter()),
    )
    assert main(["greet", "world"]) == 3
    assert f"hello world from {tmp_path / 'prism.ini'}" in capsys.readouterr().out


def test_plugin_command_without_a_config_says_so(tmp_path, monkeypatch, capsys):
    monkeypatch.chdir(tmp_path)
    monkeypatch.setattr("prism_proxy.cli.make_plugin_manager", _with_plugin(Greeter()))
    assert main(["greet", "world"]) == 2
    assert "no configuration found" in capsys.readouterr().err


def _with_plugin(plugin):
    from prism_proxy import plugins

    def make(config, **kwargs):
        return plugins.make_plugin_manager(config, extra_plugins=[(plugin, "greeter")])

    return make


async def test_admin_routes_need_the_token(prism_fake, prism_gateway, catalog, monkeypatch):
    monkeypatch.setenv("TEST_ADMIN_TOKEN", "s3cret-admin")
    gw = await prism_gateway(
        catalog, config={"admin_token_env": "TEST_ADMIN_TOKEN"}, plugins=[(Greeter(), "greeter")]
    )
    async with aiohttp.ClientSession() as session:
        url = gw.url + "/greeter/admin"
        async with session.get(url) as response:
            assert response.status == 401
            assert (await response.json())["error"]["code"] == "invalid_admin_token"
        async with session.get(url, headers={"Authorization": "Bearer wrong"}) as response:
            assert response.status == 401
        async with session.get(url, headers={"Authorization": "Bearer s3cret-admin"}) as response:
            assert response.status == 200
            assert await response.json() == {"secret": "admin only"}


async def test_admin_routes_are_off_without_a_token(prism_fake, prism_gateway, catalog):
    gw = await prism_gateway(catalog, plugins=[(Greeter(), "greeter")])
    async with aiohttp.ClientSession() as session:
        async with session.get(
            gw.url + "/greeter/admin", headers={"Authorization": "Bearer anything"}
        ) as response:
            assert response.status == 403
            assert (await response.json())["error"]["code"] == "admin_disabled"


class Tagger:
    """Uses attempt_start, settle-time headers and a route that forbids cross-tier fallback."""

    def __init__(self) -> None:
        self.started: list[int] = []

    @hookimpl
    def prism_attempt_start(self, call, attempt):
        attempt.extensions["tagger"] = len(self.started)
        self.started.append(attempt.number)

    @hookimpl
    def prism_settle(self, call, settlement):
        call.response_headers["x-tagger-cost"] = "0.25"


async def test_attempt_start_and_late_stream_headers(prism_fake, prism_gateway, recorder):
    from prism_fake_upstream import Fault

    tagger = Tagger()
    prism_fake.script("ok", [Fault(status=503)])
    catalog = {
        "providers": {"p": {"kind": "openai", "base_url": prism_fake.base_url("ok")}},
        "models": {"m": {"chain": [{"provider": "p", "model": "x"}]}},
    }
    gw = await prism_gateway(catalog, plugins=[(tagger, "tagger")], random=lambda: 0.0)
    async with aiohttp.ClientSession() as session:
        async with session.post(
            gw.base_url + "/chat/completions",
            json={"model": "m", "messages": [{"role": "user", "content": "hi"}], "stream": True},
        ) as response:
            body = await response.read()
        async with session.post(
            gw.base_url + "/chat/completions",
            json={"model": "m", "messages": [{"role": "user", "content": "hi"}]},
        ) as plain:
            assert plain.headers["x-tagger-cost"] == "0.25"
    assert "x-tagger-cost" not in response.headers
    assert body.endswith(b": x-tagger-cost: 0.25\n\ndata: [DONE]\n\n")
    assert tagger.started == [1, 2, 1]
    assert [a.extensions["tagger"] for a in recorder.attempts] == [0, 1, 2]


class NoCrossTier:
    @hookimpl
    def prism_select_route(self, call, model):
        from prism_proxy import Route

        return Route(bindings=model.chain, name="pinned-region", cross_tier=False)


async def test_a_route_can_forbid_cross_tier_fallback(prism_fake, prism_gateway):
    import openai

    catalog = {
        "providers": {
            "a": {"kind": "openai", "base_url": prism_fake.base_url("err500")},
            "b": {"kind": "openai", "base_url": prism_fake.base_url("ok")},
        },
        "models": {
            "big": {
                "tier": "t1",
                "chain": [{"provider": "a", "model": "x"}],
                "retries": 0,
                "fallback_models": ["small"],
                "cross_tier_fallback": True,
            },
            "small": {"tier": "t2", "chain": [{"provider": "b", "model": "y"}]},
        },
    }
    gw = await prism_gateway(catalog, plugins=[(NoCrossTier(), "region")])
    with pytest.raises(openai.APIStatusError) as info:
        await gw.openai().chat.completions.create(
            model="big", messages=[{"role": "user", "content": "hi"}]
        )
    assert info.value.response.headers["x-prism-route"] == "pinned-region"
    assert prism_fake.hits("ok") == 0


class Crashing:
    """A plugin with a bug in an effect hook and one in a decision hook."""

    @hookimpl
    def prism_call_start(self, call):
        if call.model_name == "crash":
            raise RuntimeError("plugin bug")


async def test_a_plugin_bug_is_a_500_with_the_request_id_and_still_settles(
    prism_fake, prism_gateway, catalog, recorder
):
    import openai

    catalog["models"]["crash"] = catalog["models"]["chat-a"]
    gw = await prism_gateway(catalog, plugins=[(Crashing(), "crashing")])
    with pytest.raises(openai.InternalServerError) as info:
        await gw.openai().chat.completions.create(
            model="crash", messages=[{"role": "user", "content": "hi"}]
        )
    assert info.value.code == "internal_error"
    request_id = info.value.response.headers["x-prism-request-id"]
    assert request_id in info.value.message
    [settlement] = recorder.settlements_for(request_id)
    assert settlement.outcome == "error" and settlement.status == 500


class BrokenLedger:
    @hookimpl
    def prism_settle(self, call, settlement):
        async def commit():
            raise OSError("disk full")

        return commit()


@pytest.mark.parametrize("stream", [False, True])
async def test_an_answer_that_cannot_be_recorded_is_withheld(
    prism_fake, prism_gateway, catalog, stream, prism_clock
):
    import openai

    gw = await prism_gateway(catalog, plugins=[(BrokenLedger(), "ledger")], clock=prism_clock)
    client = gw.openai()
    with pytest.raises(openai.APIError) as info:
        result = await client.chat.completions.create(
            model="chat-a", messages=[{"role": "user", "content": "hi"}], stream=stream
        )
        if stream:
            async for _ in result:
                pass
    assert "settlement_failed" in str(info.value.body) or info.value.code == "settlement_failed"


class VetoSecondTry:
    """Lets each binding be tried once; vetoes any retry."""

    def __init__(self) -> None:
        self.tried: set[str] = set()

    @hookimpl
    def prism_admit_attempt(self, call, binding):
        if binding.id in self.tried:
            return "veto: one try each"
        self.tried.add(binding.id)
        return None


async def test_admit_attempt_can_veto_a_retry(prism_fake, prism_gateway, catalog):
    gw = await prism_gateway(catalog, plugins=[(VetoSecondTry(), "veto")])
    raw = await gw.openai().chat.completions.with_raw_response.create(
        model="chat-a", messages=[{"role": "user", "content": "hi"}]
    )
    assert prism_fake.hits("err500") == 1  # no retry of the failing binding
    log = raw.headers["x-prism-attempt-log"]
    # In order: the attempt, then the veto of its retry, then the next binding.
    assert log.startswith("beta/up-beta transient 500 ")
    assert "; beta/up-beta vetoed veto: one try each; alpha/up-alpha ok 200 " in log
    assert raw.headers["x-prism-provider"] == "alpha"
