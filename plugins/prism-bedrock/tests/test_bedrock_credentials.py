"""Credentials from the standard AWS chain, and every request signed for the path it takes."""

from __future__ import annotations

import json
import logging
import sys
import time
from pathlib import Path

import pytest
from prism_fake_upstream.bedrock_wire import (
    ACCESS_KEY_ID,
    SECRET_ACCESS_KEY,
    SESSION_ACCESS_KEY_ID,
    SESSION_SECRET_ACCESS_KEY,
    SESSION_TOKEN,
)

from prism_proxy import ConfigError

from .bedrock_support import PLUGINS

ARN = (
    "arn:aws:bedrock:us-east-1:123456789012:inference-profile/"
    "us.anthropic.claude-3-haiku-20240307-v1:0"
)


async def hello(gw) -> str:
    completion = await gw.openai().chat.completions.create(
        model="m", messages=[{"role": "user", "content": "Hello"}]
    )
    return completion.choices[0].message.content


async def test_session_credentials_from_the_environment(
    prism_fake, prism_gateway, catalog, aws_env
):
    aws_env.setenv("AWS_ACCESS_KEY_ID", SESSION_ACCESS_KEY_ID)
    aws_env.setenv("AWS_SECRET_ACCESS_KEY", SESSION_SECRET_ACCESS_KEY)
    aws_env.setenv("AWS_SESSION_TOKEN", SESSION_TOKEN)
    gw = await prism_gateway(catalog(("ok", "amazon.nova-lite-v1:0")), load_plugins=PLUGINS)
    assert (await hello(gw)).startswith("Hello from amazon.nova-lite-v1:0")
    [sent] = prism_fake.requests("ok")
    assert sent.headers["X-Amz-Security-Token"] == SESSION_TOKEN
    assert "x-amz-security-token" in sent.headers["Authorization"]


async def test_an_inference_profile_arn_is_one_encoded_path_segment(
    prism_fake, prism_gateway, catalog
):
    gw = await prism_gateway(catalog(("ok", ARN)), load_plugins=PLUGINS)
    assert (await hello(gw)).startswith(f"Hello from {ARN}.")
    stream = await gw.openai().chat.completions.create(
        model="m", messages=[{"role": "user", "content": "Hello"}], stream=True
    )
    assert [c async for c in stream]
    whole, streamed = prism_fake.requests("ok")
    assert whole.path == f"model/{ARN}/converse"
    assert streamed.path == f"model/{ARN}/converse-stream"


async def test_a_shared_credentials_profile(prism_fake, prism_gateway, aws_env, tmp_path: Path):
    aws_env.delenv("AWS_ACCESS_KEY_ID")
    aws_env.delenv("AWS_SECRET_ACCESS_KEY")
    credentials = tmp_path / "shared-credentials"
    credentials.write_text(
        f"[team]\naws_access_key_id = {ACCESS_KEY_ID}\n"
        f"aws_secret_access_key = {SECRET_ACCESS_KEY}\n"
    )
    aws_env.setenv("AWS_SHARED_CREDENTIALS_FILE", str(credentials))
    data = {
        "providers": {
            "p": {
                "kind": "bedrock",
                "region": "eu-west-1",
                "profile": "team",
                "base_url": prism_fake.base_url("ok"),
            }
        },
        "models": {"m": {"chain": [{"provider": "p", "model": "amazon.nova-pro-v1:0"}]}},
    }
    gw = await prism_gateway(data, load_plugins=PLUGINS)
    assert (await hello(gw)).startswith("Hello from amazon.nova-pro-v1:0")
    [sent] = prism_fake.requests("ok")
    assert "/eu-west-1/bedrock/aws4_request" in sent.headers["Authorization"]


async def test_an_unknown_profile_stops_start_up(prism_fake, prism_gateway):
    data = {
        "providers": {
            "p": {
                "kind": "bedrock",
                "region": "us-east-1",
                "profile": "nobody",
                "base_url": prism_fake.base_url("ok"),
            }
        },
        "models": {"m": {"chain": [{"provider": "p", "model": "amazon.nova-pro-v1:0"}]}},
    }
    with pytest.raises(ConfigError, match=r"providers\.p\.profile"):
        await prism_gateway(data, load_plugins=PLUGINS)


async def test_refreshable_credentials_are_refreshed(
    prism_fake, prism_gateway, catalog, aws_env, tmp_path: Path
):
    """A credential_process whose credentials expire soon: botocore refreshes them
    (the process runs again) when they must be, off the event loop."""
    aws_env.delenv("AWS_ACCESS_KEY_ID")
    aws_env.delenv("AWS_SECRET_ACCESS_KEY")
    runs = tmp_path / "runs"
    script = tmp_path / "creds.py"
    # Expiring within botocore's mandatory refresh window: every signing refreshes.
    expiry = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(time.time() + 300))
    answer = {
        "Version": 1,
        "AccessKeyId": SESSION_ACCESS_KEY_ID,
        "SecretAccessKey": SESSION_SECRET_ACCESS_KEY,
        "SessionToken": SESSION_TOKEN,
        "Expiration": expiry,
    }
    script.write_text(
        f"import json\nwith open({str(runs)!r}, 'a') as f: f.write('x')\n"
        f"print(json.dumps({answer!r}))\n"
    )
    config = tmp_path / "config"
    config.write_text(f"[default]\ncredential_process = {sys.executable} {script}\n")
    aws_env.setenv("AWS_CONFIG_FILE", str(config))
    gw = await prism_gateway(catalog(("ok", "amazon.nova-lite-v1:0")), load_plugins=PLUGINS)
    started = len(runs.read_text())
    assert started == 1  # resolved once at start-up
    for _ in range(2):
        assert (await hello(gw)).startswith("Hello from amazon.nova-lite-v1:0")
    assert len(runs.read_text()) == 3
    assert [r.headers["X-Amz-Security-Token"] for r in prism_fake.requests("ok")] == [
        SESSION_TOKEN
    ] * 2


async def test_the_secret_never_reaches_logs_or_error_bodies(
    prism_fake, prism_gateway, catalog, aws_env, caplog
):
    import openai

    caplog.set_level(logging.DEBUG)
    gw = await prism_gateway(catalog(("ok", "amazon.nova-lite-v1:0")), load_plugins=PLUGINS)
    await hello(gw)
    aws_env.setenv("AWS_SECRET_ACCESS_KEY", "wrong-" + SECRET_ACCESS_KEY)
    bad = await prism_gateway(catalog(("ok", "amazon.nova-lite-v1:0")), load_plugins=PLUGINS)
    with pytest.raises(openai.APIStatusError) as caught:
        await hello(bad)
    assert SECRET_ACCESS_KEY not in caught.value.response.text
    assert SECRET_ACCESS_KEY not in caplog.text
    assert json.dumps(SECRET_ACCESS_KEY)[1:-1] not in caplog.text


async def test_no_credentials_warns_and_the_line_is_refused(
    prism_fake, prism_gateway, catalog, aws_env, caplog
):
    import openai

    aws_env.delenv("AWS_ACCESS_KEY_ID")
    aws_env.delenv("AWS_SECRET_ACCESS_KEY")
    gw = await prism_gateway(catalog(("ok", "amazon.nova-lite-v1:0")), load_plugins=PLUGINS)
    assert "no AWS credentials found" in caplog.text
    with pytest.raises(openai.APIStatusError) as caught:
        await hello(gw)
    log = caught.value.response.headers["x-prism-attempt-log"]
    assert log.startswith("ok/amazon.nova-lite-v1:0 permanent 403")
    [sent] = prism_fake.requests("ok")
    assert "Authorization" not in sent.headers
