"""The azure-openai provider kind against the fake upstream, through the real gateway."""

from __future__ import annotations

import logging

import aiohttp
import openai
import pytest
from prism_fake_upstream import Fault

from prism_proxy import ConfigError

from .azure_support import KEY, MESSAGES, azure, catalog


async def test_chat_plain_streamed_and_embeddings_through_the_openai_sdk(prism_fake, prism_gateway):
    gw = await prism_gateway(
        catalog({"az": azure(prism_fake, "az", api_version="2024-06-01")}, [("az", "gpt4o-prod")])
    )
    client = gw.openai()
    answer = await client.chat.completions.create(model="m", messages=MESSAGES)
    assert answer.choices[0].message.content.startswith("Hello from gpt4o-prod")
    stream = await client.chat.completions.create(
        model="m", messages=MESSAGES, stream=True, stream_options={"include_usage": True}
    )
    text, usage = "", None
    async for chunk in stream:
        if chunk.choices:
            text += chunk.choices[0].delta.content or ""
        usage = chunk.usage or usage
    assert text.startswith("Hello from gpt4o-prod") and usage is not None
    vectors = await client.embeddings.create(model="m", input=["a", "b"])
    assert len(vectors.data) == 2

    seen = prism_fake.requests("az")
    assert [r.path for r in seen] == [
        "openai/deployments/gpt4o-prod/chat/completions",
        "openai/deployments/gpt4o-prod/chat/completions",
        "openai/deployments/gpt4o-prod/embeddings",
    ]
    assert all(r.headers["api-key"] == KEY for r in seen)
    assert all("Authorization" not in r.headers for r in seen)
    # The streamed call always asks for usage, so that it can be billed.
    assert seen[1].body["stream_options"] == {"include_usage": True}


async def test_api_version_goes_in_the_query(prism_fake, prism_gateway):
    # The fake, like Azure, refuses a request without one (400): the call passing
    # proves it was sent; the fake's own check is exercised directly.
    gw = await prism_gateway(catalog({"az": azure(prism_fake, "q")}, [("az", "dep")]))
    await gw.openai().chat.completions.create(model="m", messages=MESSAGES)
    async with aiohttp.ClientSession() as session:
        url = prism_fake.base_url("q") + "/openai/deployments/dep/chat/completions"
        async with session.post(url, json={"messages": MESSAGES}, headers={"api-key": "k"}) as r:
            assert r.status == 400
            assert (await r.json())["error"]["code"] == "MissingApiVersionParameter"
        async with session.post(url + "?api-version=2024-10-21", json={"messages": MESSAGES}) as r:
            assert r.status == 401


async def test_anthropic_sdk_messages_on_an_azure_line(prism_fake, prism_gateway):
    gw = await prism_gateway(catalog({"az": azure(prism_fake, "anth")}, [("az", "gpt4o")]))
    message = await gw.anthropic().messages.create(model="m", max_tokens=100, messages=MESSAGES)
    assert message.content[0].text.startswith("Hello from gpt4o")
    assert message.stop_reason == "end_turn"
    [seen] = prism_fake.requests("anth")
    assert seen.path == "openai/deployments/gpt4o/chat/completions"
    assert seen.body["messages"][-1]["role"] == "user"


async def test_429_waits_as_retry_after_ms_says_then_fails_over(
    prism_fake, prism_gateway, prism_clock
):
    prism_fake.clock = prism_clock
    prism_fake.script(
        "busy",
        [Fault(status=429, headers={"retry-after": "2", "retry-after-ms": "1500"})] * 2,
    )
    gw = await prism_gateway(
        catalog(
            {"az": azure(prism_fake, "busy"), "az2": azure(prism_fake, "spare")},
            [("az", "dep"), ("az2", "dep")],
            retries=1,
        ),
        clock=prism_clock,
    )
    raw = await gw.openai().chat.completions.with_raw_response.create(model="m", messages=MESSAGES)
    assert raw.headers["x-prism-provider"] == "az2"
    assert raw.headers["x-prism-attempt-log"].startswith(
        "az/dep rate_limited 429 0ms; az/dep rate_limited 429 0ms; az2/dep ok 200"
    )
    assert prism_clock.slept == [1.5]  # retry-after-ms wins over retry-after
    assert prism_fake.hits("busy") == 2 and prism_fake.hits("spare") == 1


async def test_deployment_not_found_moves_on_without_a_retry(prism_fake, prism_gateway):
    gw = await prism_gateway(
        catalog(
            {"az": azure(prism_fake, "nodeployment"), "az2": azure(prism_fake, "west")},
            [("az", "gone"), ("az2", "dep")],
            retries=2,
        )
    )
    raw = await gw.openai().chat.completions.with_raw_response.create(model="m", messages=MESSAGES)
    assert raw.headers["x-prism-attempt-log"].startswith("az/gone permanent 404")
    assert prism_fake.hits("nodeployment") == 1

    alone = await prism_gateway(
        catalog({"az": azure(prism_fake, "nodeployment")}, [("az", "gone")])
    )
    with pytest.raises(openai.APIStatusError) as err:
        await alone.openai().chat.completions.create(model="m", messages=MESSAGES)
    assert err.value.status_code == 503
    assert err.value.body["code"] == "upstream_model_not_found"


async def test_the_key_never_reaches_logs_or_error_bodies(prism_fake, prism_gateway, caplog):
    prism_fake.script("denied", [Fault(status=401)])
    with caplog.at_level(logging.DEBUG):
        gw = await prism_gateway(catalog({"az": azure(prism_fake, "denied")}, [("az", "dep")]))
        async with aiohttp.ClientSession() as session:
            async with session.post(
                gw.base_url + "/chat/completions", json={"model": "m", "messages": MESSAGES}
            ) as response:
                body = await response.text()
                headers = str(dict(response.headers))
    assert response.status == 503
    assert "upstream_auth_failed" in body
    assert prism_fake.requests("denied")[0].headers["api-key"] == KEY
    assert KEY not in body and KEY not in headers
    assert KEY not in caplog.text


@pytest.mark.parametrize(
    ("options", "field"),
    [
        ({"base_url": "NAME.openai.azure.com"}, "base_url"),
        ({"auth": "bearer"}, "auth"),
        ({"api_version": "2024-10-21&x=1"}, "api_version"),
        ({"api_key_env": None}, "api_key_env"),
        ({"auth": "entra", "credential": "client_secret", "client_id": "c"}, "api_key_env"),
        ({"api_key_env": None, "auth": "entra", "credential": "magic"}, "credential"),
        ({"api_key_env": None, "auth": "entra", "credential": "client_secret"}, "tenant_id"),
        ({"api_key_env": None, "auth": "entra", "authority": "http://x"}, "authority"),
        ({"tenant_id": "t"}, "tenant_id"),
        ({"deployment": "x"}, "deployment"),
    ],
)
async def test_bad_options_stop_start_up_naming_the_field(
    prism_fake, prism_gateway, options, field
):
    table = {**azure(prism_fake, "ok"), **options}
    table = {k: v for k, v in table.items() if v is not None}
    with pytest.raises(ConfigError) as err:
        await prism_gateway(catalog({"az": table}, [("az", "dep")]))
    assert err.value.key == f"providers.az.{field}"


async def test_base_url_may_end_in_openai(prism_fake, prism_gateway):
    table = azure(prism_fake, "slash")
    table["base_url"] += "/openai/"
    gw = await prism_gateway(catalog({"az": table}, [("az", "dep")]))
    await gw.openai().chat.completions.create(model="m", messages=MESSAGES)
    assert prism_fake.requests("slash")[0].path == "openai/deployments/dep/chat/completions"
