"""Where `prism` finds its configuration: ``--config``, then ``PRISM_CONFIG``, then the search.

``PRISM_CONFIG`` is for the places where no ``--config`` can be added to a
command: the deploy image sets it, so ``docker compose exec gateway1 prism
keys create ...`` works as written (contrib/deploy/tests checks that command
against a running gateway).
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

CATALOG = """\
[providers.fake]
kind = "openai"
base_url = "http://127.0.0.1:9/v1"

[models.chat]
chain = [ { provider = "fake", model = "m" } ]
"""


def write_config(directory: Path) -> Path:
    directory.mkdir(parents=True, exist_ok=True)
    (directory / "catalog.toml").write_text(CATALOG)
    config = directory / "prism.ini"
    config.write_text("[prism]\ncatalog = catalog.toml\n")
    return config


def prism(*argv: str, cwd: Path, prism_config: str | None) -> subprocess.CompletedProcess[str]:
    env = {key: value for key, value in os.environ.items() if key != "PRISM_CONFIG"}
    if prism_config is not None:
        env["PRISM_CONFIG"] = prism_config
    return subprocess.run(
        [sys.executable, "-m", "prism_proxy.cli", *argv],
        cwd=cwd,
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
    )


def test_prism_config_names_the_file_when_no_config_flag_is_given(tmp_path):
    config = write_config(tmp_path / "etc" / "prism")
    elsewhere = tmp_path / "var" / "lib" / "prism"
    elsewhere.mkdir(parents=True)
    result = prism("check", cwd=elsewhere, prism_config=str(config))
    assert result.returncode == 0, result.stderr
    assert result.stdout.splitlines()[0] == f"{config}: ok"


def test_the_config_flag_wins_over_prism_config(tmp_path):
    named = write_config(tmp_path / "named")
    flagged = write_config(tmp_path / "flagged")
    result = prism("check", "--config", str(flagged), cwd=tmp_path, prism_config=str(named))
    assert result.returncode == 0, result.stderr
    assert result.stdout.splitlines()[0] == f"{flagged}: ok"


def test_prism_config_wins_over_the_search_and_a_missing_file_is_refused_by_name(tmp_path):
    # A prism.ini in the working directory would be found by the search: a
    # PRISM_CONFIG that names no file must not fall back to it silently.
    write_config(tmp_path)
    missing = tmp_path / "etc" / "prism.ini"
    result = prism("check", cwd=tmp_path, prism_config=str(missing))
    assert result.returncode == 2
    assert result.stderr.strip() == (
        f"prism: configuration error: {missing}: PRISM_CONFIG: file not found"
    )
    assert result.stdout == ""


def test_without_any_configuration_the_error_says_both_ways_to_name_one(tmp_path):
    result = prism("check", cwd=tmp_path, prism_config=None)
    assert result.returncode == 2
    assert "pass --config PATH or set PRISM_CONFIG" in result.stderr
