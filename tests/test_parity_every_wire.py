"""`prism preflight --suite` unchanged against one chain that mixes every provider kind.

OpenAI, Anthropic, Gemini, Bedrock and Azure OpenAI lines side by side, each
against the fake upstream speaking its own wire (Bedrock's checks the SigV4
signature of every request): the same suite, the same verdicts, and a
fallback that fails a case is named whatever its wire.
"""

from __future__ import annotations

import asyncio
import os
import sys
from pathlib import Path
from typing import Any

import pytest
from prism_fake_upstream import Fault

from prism_proxy.testing import installed_plugins

#: (provider name, kind, options beyond base_url), in chain order.
LINES = (
    ("oa", "openai", ""),
    ("an", "anthropic", ""),
    ("ge", "gemini", 'api_key_env = "PARITY_GEMINI_KEY"\n'),
    ("br", "bedrock", 'region = "us-east-1"\n'),
    ("az", "azure-openai", 'api_key_env = "PARITY_AZURE_KEY"\n'),
)
PLUGINS = {"openai", "anthropic", "gemini", "bedrock", "azure", "probes"}
#: Tools are sent with every case of a suite (and the fake calls them): the tool
#: round trip on every wire is the preflight verdicts' test below.
SUITE = """\
system = "You are a support agent for ACME."

[[cases]]
name = "greets"
prompt = "Say hello."
[cases.expect]
regex = "^Hello from"
max_ms = 10000

[[cases]]
name = "names its model"
prompt = "Which model are you?"
[cases.expect]
regex = "Hello from up-[a-z]{2}[.]"
"""


def write_config(tmp_path: Path, fake: Any) -> Path:
    providers = "".join(
        f'[providers.{name}]\nkind = "{kind}"\nbase_url = "{fake.base_url(name)}"\n{options}'
        for name, kind, options in LINES
    )
    chain = ", ".join(
        f'{{ provider = "{name}", model = "up-{name}", capabilities = ["tools"] }}'
        for name, _, _ in LINES
    )
    (tmp_path / "catalog.toml").write_text(f"{providers}[models.m]\nchain = [ {chain} ]\n")
    disable = ", ".join(sorted(set(installed_plugins()) - PLUGINS))
    ini = tmp_path / "prism.ini"
    ini.write_text(f"[prism]\ncatalog = catalog.toml\nlog_level = WARNING\ndisable = {disable}\n")
    (tmp_path / "suite.toml").write_text(SUITE)
    return ini


async def preflight(ini: Path, *args: str) -> tuple[int, str, str]:
    from prism_fake_upstream.bedrock_wire import ACCESS_KEY_ID, SECRET_ACCESS_KEY

    env = {
        **os.environ,
        "PARITY_GEMINI_KEY": "gemini-test-key",
        "PARITY_AZURE_KEY": "azure-test-key",
        # The fake's AWS credentials, and nothing of the machine's own configuration.
        "AWS_ACCESS_KEY_ID": ACCESS_KEY_ID,
        "AWS_SECRET_ACCESS_KEY": SECRET_ACCESS_KEY,
        "AWS_CONFIG_FILE": os.devnull,
        "AWS_SHARED_CREDENTIALS_FILE": os.devnull,
        "AWS_EC2_METADATA_DISABLED": "true",
    }
    env.pop("AWS_SESSION_TOKEN", None)
    env.pop("AWS_PROFILE", None)
    process = await asyncio.create_subprocess_exec(
        sys.executable, "-m", "prism_proxy.cli", "preflight", "--config", str(ini), *args,
        stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE, env=env,
    )  # fmt: skip
    out, err = await asyncio.wait_for(process.communicate(), 90)
    assert process.returncode is not None
    return process.returncode, out.decode(), err.decode()


@pytest.fixture
def every_kind() -> None:
    missing = {"gemini", "bedrock", "azure"} - set(installed_plugins())
    if missing:
        pytest.skip(f"provider plugins not installed: {', '.join(sorted(missing))}")


async def test_the_suite_passes_on_a_chain_of_every_wire(every_kind, prism_fake, tmp_path):
    ini = write_config(tmp_path, prism_fake)
    status, out, err = await preflight(ini, "--model", "m", "--suite", str(tmp_path / "suite.toml"))
    assert status == 0, out + err
    header, *rows = [line for line in out.splitlines() if line.strip()]
    for name, _, _ in LINES:
        assert f"{name}/up-{name}" in header
    greets = next(row for row in rows if row.startswith("greets"))
    names = next(row for row in rows if row.startswith("names its model"))
    # Every line passes both cases: the same verdict on every wire.
    assert greets.split().count("ok") == len(LINES), out
    assert names.split().count("ok") == len(LINES), out
    assert "parity:" not in out
    # Each upstream was called on its own wire's path.
    assert prism_fake.requests("ge")[0].path.endswith("models/up-ge:generateContent")
    assert "model/up-br/converse" in prism_fake.requests("br")[0].path
    assert "openai/deployments/up-az/chat/completions" in prism_fake.requests("az")[0].path


async def test_a_fallback_on_another_wire_failing_a_case_is_named(every_kind, prism_fake, tmp_path):
    ini = write_config(tmp_path, prism_fake)
    # Bedrock's line answers the greeting with something else.
    prism_fake.script("br", [Fault(text="Goodbye.")])
    status, out, _ = await preflight(ini, "--model", "m", "--suite", str(tmp_path / "suite.toml"))
    assert status == 1
    assert (
        "parity: br/up-br fails 'greets', which oa/up-oa passes "
        "(answer does not match /^Hello from/)" in out
    ), out


async def test_preflight_verdicts_on_every_wire(every_kind, prism_fake, tmp_path):
    # Reachable, capable (a tool call whose arguments parse), fast: on every wire.
    ini = write_config(tmp_path, prism_fake)
    status, out, err = await preflight(ini, "--model", "m")
    assert status == 0, out + err
    for name, _, _ in LINES:
        [row] = [line for line in out.splitlines() if line.startswith(f"{name}/up-{name}")]
        assert "FAIL" not in row, out
