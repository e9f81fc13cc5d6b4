"""Vertex AI lines: a service account's JWT really signed and exchanged, tokens reused and
refreshed before they expire (the generation's manual clock), a refused key failing over."""

from __future__ import annotations

import asyncio
import json
import logging

import pytest
from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric import rsa
from prism_fake_upstream import Fault

from prism_proxy import ConfigError
from prism_proxy.testing import eventually

PLUGINS = ["gemini"]
KEY_ENV = "PRISM_TEST_GEMINI_KEY"
KEY = "AIzaSy-vertex-test-secret-42"
PATH = "projects/proj-1/locations/us-central1/publishers/google/models/gemini-v:generateContent"


@pytest.fixture
def credentials_file(tmp_path, prism_fake):
    """A service account key file whose token endpoint is the fake's (scenario ``tok``)."""
    key = rsa.generate_private_key(public_exponent=65537, key_size=2048)
    pem = key.private_bytes(
        serialization.Encoding.PEM,
        serialization.PrivateFormat.PKCS8,
        serialization.NoEncryption(),
    ).decode()
    path = tmp_path / "sa.json"
    path.write_text(
        json.dumps(
            {
                "type": "service_account",
                "project_id": "proj-1",
                "private_key_id": "k1",
                "private_key": pem,
                "client_email": "prism@proj-1.iam.gserviceaccount.com",
                "client_id": "1",
                "token_uri": prism_fake.base_url("tok") + "/token",
            }
        )
    )
    return path


def vertex_catalog(fake, credentials_file, *more: str) -> dict:
    providers = {
        "v": {
            "kind": "vertex",
            "project": "proj-1",
            "location": "us-central1",
            "base_url": fake.base_url("vtx"),
            "credentials_file": str(credentials_file),
        },
        **{
            name: {"kind": "gemini", "base_url": fake.base_url(name), "api_key_env": KEY_ENV}
            for name in more
        },
    }
    chain = [{"provider": "v", "model": "gemini-v"}]
    chain += [{"provider": name, "model": f"gemini-{name}"} for name in more]
    return {"providers": providers, "models": {"m": {"chain": chain, "retries": 0}}}


async def chat(gw):
    return await gw.openai().chat.completions.with_raw_response.create(
        model="m", messages=[{"role": "user", "content": "Hi"}]
    )


def bearer(fake) -> str:
    return fake.requests("vtx")[-1].headers["Authorization"]


async def test_tokens_are_shared_reused_and_refreshed_before_expiry(
    prism_fake, prism_gateway, prism_clock, credentials_file
):
    prism_fake.clock = prism_clock
    prism_fake.script("tok", [Fault(stall_s=1)])  # the exchange waits for the test
    gw = await prism_gateway(
        vertex_catalog(prism_fake, credentials_file), clock=prism_clock, load_plugins=PLUGINS
    )
    calls = [asyncio.ensure_future(chat(gw)) for _ in range(3)]
    # All three calls are in, waiting for the one exchange under way.
    await eventually(lambda: prism_fake.hits("tok") == 1 and gw.gateway.current.in_flight == 3)
    assert prism_fake.hits("vtx") == 0
    prism_clock.advance(1)
    answers = await asyncio.gather(*calls)
    assert {raw.headers["x-prism-provider"] for raw in answers} == {"v"}
    # One exchange of a really signed JWT served all three.
    [exchange] = prism_fake.requests("tok")
    assert exchange.path == "token"
    assert exchange.body is None  # a form, as google-auth posts it: not JSON
    assert [r.path for r in prism_fake.requests("vtx")] == [PATH] * 3
    assert bearer(prism_fake) == "Bearer ya29.fake-1"

    prism_clock.advance(3000)  # the token (3599 s) has ten minutes left: still good
    await chat(gw)
    assert len(prism_fake.requests("tok")) == 1
    assert bearer(prism_fake) == "Bearer ya29.fake-1"

    prism_clock.advance(400)  # under five minutes left: replaced before it expires
    await chat(gw)
    assert len(prism_fake.requests("tok")) == 2
    assert bearer(prism_fake) == "Bearer ya29.fake-2"


async def test_a_streamed_vertex_answer(prism_fake, prism_gateway, credentials_file):
    gw = await prism_gateway(vertex_catalog(prism_fake, credentials_file), load_plugins=PLUGINS)
    stream = await gw.openai().chat.completions.create(
        model="m", messages=[{"role": "user", "content": "Hi"}], stream=True
    )
    text = "".join([c.choices[0].delta.content or "" async for c in stream if c.choices])
    assert text == "Hello from gemini-v. This is the fake upstream answering."
    assert prism_fake.requests("vtx")[0].path == PATH.replace(":generate", ":streamGenerate")


async def test_refused_credentials_fail_over_without_leaking_the_key(
    prism_fake, prism_gateway, credentials_file, caplog, monkeypatch
):
    monkeypatch.setenv(KEY_ENV, KEY)
    caplog.set_level(logging.DEBUG)
    refusal = {"error": "invalid_grant", "error_description": "Invalid JWT Signature."}
    prism_fake.script("tok", [Fault(status=400, body=refusal)])
    gw = await prism_gateway(
        vertex_catalog(prism_fake, credentials_file, "g"), load_plugins=PLUGINS
    )
    raw = await chat(gw)
    assert raw.headers["x-prism-provider"] == "g"
    first = raw.headers["x-prism-attempt-log"].split("; ")[0]
    assert first.startswith("v/gemini-v permanent 401")
    assert prism_fake.hits("vtx") == 0
    private_key = json.loads(credentials_file.read_text())["private_key"]
    secret_line = private_key.splitlines()[1]
    assert secret_line not in caplog.text
    assert secret_line not in raw.http_response.text
    assert KEY not in caplog.text


@pytest.mark.parametrize(
    ("options", "key"),
    [
        ({"location": "us-central1"}, "project"),
        ({"project": "p", "location": "a/b"}, "location"),
        ({"project": "p", "location": "l", "credentials_file": 3}, "credentials_file"),
        ({"project": "p", "location": "l", "api_key_env": "X"}, "api_key_env"),
        ({"project": "p", "region": "us-east1", "location": "europe-west4"}, "location"),
    ],
)
async def test_bad_vertex_options_stop_start_up_naming_the_key(prism_gateway, options, key):
    catalog = {
        "providers": {"v": {"kind": "vertex", **options}},
        "models": {"m": {"chain": [{"provider": "v", "model": "x"}]}},
    }
    with pytest.raises(ConfigError) as info:
        await prism_gateway(catalog, load_plugins=PLUGINS)
    assert key in str(info.value)


async def test_an_unreadable_key_file_stops_start_up_naming_the_option(
    prism_fake, prism_gateway, tmp_path
):
    bad = tmp_path / "sa.json"
    bad.write_text('{"type": "service_account", "private_key": "SECRETPEM"}')
    with pytest.raises(ConfigError) as info:
        await prism_gateway(vertex_catalog(prism_fake, bad), load_plugins=PLUGINS)
    assert "credentials_file" in str(info.value)
    assert "SECRETPEM" not in str(info.value)
    with pytest.raises(ConfigError) as info:
        await prism_gateway(
            vertex_catalog(prism_fake, tmp_path / "gone.json"), load_plugins=PLUGINS
        )
    assert "cannot read it" in str(info.value)


async def test_vertex_embeddings_go_through_predict(prism_fake, prism_gateway, credentials_file):
    gw = await prism_gateway(vertex_catalog(prism_fake, credentials_file), load_plugins=PLUGINS)
    answer = await gw.openai().embeddings.create(
        model="m", input=["one two", "three"], dimensions=4, encoding_format="float"
    )
    assert [len(item.embedding) for item in answer.data] == [4, 4]
    assert answer.usage.prompt_tokens == 3
    [request] = prism_fake.requests("vtx")
    assert request.path == PATH.replace(":generateContent", ":predict")
    assert request.body == {
        "instances": [{"content": "one two"}, {"content": "three"}],
        "parameters": {"outputDimensionality": 4},
    }


async def test_location_defaults_to_the_providers_region(
    prism_fake, prism_gateway, credentials_file
):
    catalog = vertex_catalog(prism_fake, credentials_file)
    del catalog["providers"]["v"]["location"]
    catalog["providers"]["v"]["region"] = "us-central1"
    gw = await prism_gateway(catalog, load_plugins=PLUGINS)
    await chat(gw)
    # The path names the region as Vertex's location; regions report it as the line's.
    [seen] = prism_fake.requests("vtx")
    assert seen.path == PATH
