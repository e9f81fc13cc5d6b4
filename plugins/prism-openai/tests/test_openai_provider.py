"""The openai provider kind against the fake upstream, through the real gateway."""

from __future__ import annotations

import logging

import aiohttp
import pytest

from prism_proxy import ConfigError

MESSAGES = [{"role": "user", "content": "hi"}]


def catalog(provider: dict, model: str = "up") -> dict:
    return {
        "providers": {"p": {"kind": "openai", **provider}},
        "models": {"m": {"chain": [{"provider": "p", "model": model}]}},
    }


async def test_bearer_key_from_the_environment(prism_fake, prism_gateway, monkeypatch):
    monkeypatch.setenv("TEST_UPSTREAM_KEY", "sk-test-123")
    gw = await prism_gateway(
        catalog(
            {
                "base_url": prism_fake.base_url("ok"),
                "api_key_env": "TEST_UPSTREAM_KEY",
                "headers": {"x-team": "search"},
            }
        )
    )
    await gw.openai(api_key="caller-key").chat.completions.create(model="m", messages=MESSAGES)
    [seen] = prism_fake.requests("ok")
    assert seen.headers["Authorization"] == "Bearer sk-test-123"
    assert seen.headers["x-team"] == "search"
    assert seen.body["model"] == "up"
    # The gateway names itself upstream, never the caller's SDK or aiohttp.
    assert seen.headers["User-Agent"].startswith("prism-llm-gateway/")


async def test_azure_style_deployment_urls_and_api_key_header(
    prism_fake, prism_gateway, monkeypatch
):
    monkeypatch.setenv("AZ_KEY", "az-secret")
    gw = await prism_gateway(
        catalog(
            {
                "base_url": prism_fake.url + "/s/azure/v1",
                "api_key_env": "AZ_KEY",
                "auth": "api-key",
                "deployments": True,
                "query": {"api-version": "2024-10-21"},
            },
            model="gpt-4o-deploy",
        )
    )
    async with aiohttp.ClientSession() as session:
        await session.post(
            gw.base_url + "/chat/completions", json={"model": "m", "messages": MESSAGES}
        )
    [seen] = prism_fake.requests("azure")
    assert seen.path == "deployments/gpt-4o-deploy/chat/completions"
    assert seen.headers["api-key"] == "az-secret"
    assert "Authorization" not in seen.headers


async def test_unset_key_variable_warns_and_sends_no_key(
    prism_fake, prism_gateway, monkeypatch, caplog
):
    monkeypatch.delenv("NOT_SET_ANYWHERE", raising=False)
    with caplog.at_level(logging.WARNING):
        gw = await prism_gateway(
            catalog({"base_url": prism_fake.base_url("ok"), "api_key_env": "NOT_SET_ANYWHERE"})
        )
    assert (
        "providers.p.api_key_env: environment variable NOT_SET_ANYWHERE is not set" in caplog.text
    )
    await gw.openai().chat.completions.create(model="m", messages=MESSAGES)
    assert "Authorization" not in prism_fake.requests("ok")[0].headers


async def test_the_key_never_reaches_logs_or_error_bodies(
    prism_fake, prism_gateway, monkeypatch, caplog
):
    import openai

    monkeypatch.setenv("SECRET_KEY_VAR", "sk-never-show-me")
    gw = await prism_gateway(
        catalog({"base_url": prism_fake.base_url("err401"), "api_key_env": "SECRET_KEY_VAR"})
    )
    with caplog.at_level(logging.DEBUG), pytest.raises(openai.APIStatusError) as info:
        await gw.openai().chat.completions.create(model="m", messages=MESSAGES)
    assert info.value.code == "upstream_auth_failed"
    assert "sk-never-show-me" not in info.value.response.text
    assert "sk-never-show-me" not in caplog.text


@pytest.mark.parametrize(
    ("options", "key", "problem"),
    [
        ({}, "providers.p.base_url", "expected an http(s) URL"),
        (
            {"base_url": "http://x/v1", "auth": "basic", "api_key_env": "K"},
            "providers.p.auth",
            "'bearer' or 'api-key'",
        ),
        (
            {"base_url": "http://x/v1", "headers": {"a": 1}},
            "providers.p.headers",
            "table of string values",
        ),
        (
            {"base_url": "http://x/v1", "max_connections": 0},
            "providers.p.max_connections",
            "positive",
        ),
        (
            {"base_url": "http://x/v1", "deployment": True},
            "providers.p.deployment",
            "unknown option",
        ),
        (
            {"base_url": "http://x/v1", "responses": "yes"},
            "providers.p.responses",
            "'native' or 'translate'",
        ),
    ],
)
async def test_option_errors_name_the_key(prism_gateway, options, key, problem):
    with pytest.raises(ConfigError) as info:
        await prism_gateway(catalog(options))
    assert key in str(info.value) and problem in str(info.value)


@pytest.mark.parametrize(
    ("options", "native"),
    [
        ({"base_url": "https://api.openai.com/v1"}, True),
        ({"base_url": "https://api.openai.com/v1/", "responses": "translate"}, False),
        ({"base_url": "http://127.0.0.1:8000/v1"}, False),
        ({"base_url": "http://127.0.0.1:8000/v1", "responses": "native"}, True),
    ],
)
def test_the_responses_api_is_native_on_openais_own_api_by_default(options, native):
    from prism_openai import OpenAIProvider

    from prism_proxy import Endpoint, ProviderSpec

    provider = OpenAIProvider(ProviderSpec("p", "openai", options, "catalog.toml"))
    assert (provider.native_wires.get(Endpoint.RESPONSES) == "responses") is native
