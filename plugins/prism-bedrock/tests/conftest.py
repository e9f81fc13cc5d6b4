"""Every test runs with the fake's AWS credentials in the environment and nothing else.

The machine's own AWS config never leaks in (the config and credentials files
are empty temporary ones, no profile is named) and botocore never asks an
instance metadata service.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from prism_fake_upstream.bedrock_wire import ACCESS_KEY_ID, SECRET_ACCESS_KEY

_AWS_VARIABLES = (
    "AWS_PROFILE",
    "AWS_DEFAULT_PROFILE",
    "AWS_SESSION_TOKEN",
    "AWS_SECURITY_TOKEN",
    "AWS_ROLE_ARN",
    "AWS_WEB_IDENTITY_TOKEN_FILE",
    "AWS_CONTAINER_CREDENTIALS_RELATIVE_URI",
    "AWS_CONTAINER_CREDENTIALS_FULL_URI",
    "AWS_CONTAINER_AUTHORIZATION_TOKEN",
    "AWS_REGION",
    "AWS_DEFAULT_REGION",
)


@pytest.fixture(autouse=True)
def aws_env(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> pytest.MonkeyPatch:
    for name in _AWS_VARIABLES:
        monkeypatch.delenv(name, raising=False)
    config, credentials = tmp_path / "aws-config", tmp_path / "aws-credentials"
    config.write_text("")
    credentials.write_text("")
    monkeypatch.setenv("AWS_CONFIG_FILE", str(config))
    monkeypatch.setenv("AWS_SHARED_CREDENTIALS_FILE", str(credentials))
    monkeypatch.setenv("AWS_EC2_METADATA_DISABLED", "true")
    monkeypatch.setenv("AWS_ACCESS_KEY_ID", ACCESS_KEY_ID)
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", SECRET_ACCESS_KEY)
    return monkeypatch


def bedrock_catalog(fake: Any, *lines: tuple[str, str], **model: Any) -> dict[str, Any]:
    """Model ``m`` over bedrock lines (scenario, model id), providers named as the scenarios."""
    providers = {
        scenario: {"kind": "bedrock", "region": "us-east-1", "base_url": fake.base_url(scenario)}
        for scenario, _ in lines
    }
    chain = [{"provider": scenario, "model": model_id} for scenario, model_id in lines]
    return {"providers": providers, "models": {"m": {"chain": chain, **model}}}


@pytest.fixture
def catalog(prism_fake: Any) -> Callable[..., dict[str, Any]]:
    def make(*lines: tuple[str, str], **model: Any) -> dict[str, Any]:
        return bedrock_catalog(prism_fake, *lines, **model)

    return make
