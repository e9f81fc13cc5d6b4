"""Finding the configuration, and every mistake stopping start-up with file, key and problem."""

from __future__ import annotations

import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from prism_proxy import ConfigError, create_app, load_config

CATALOG = """
[providers.alpha]
kind = "openai"
base_url = "http://127.0.0.1:18900/s/ok/v1"

[models.chat-a]
chain = [ { provider = "alpha", model = "up-alpha" } ]
"""


def write(directory: Path, name: str, text: str) -> Path:
    path = directory / name
    path.write_text(textwrap.dedent(text))
    return path


def test_prism_ini_found_from_a_subdirectory(tmp_path):
    write(tmp_path, "prism.ini", "[prism]\nlisten = 127.0.0.1:9999\ncatalog = catalog.toml\n")
    write(tmp_path, "catalog.toml", CATALOG)
    sub = tmp_path / "a" / "b"
    sub.mkdir(parents=True)
    config = load_config(start=sub)
    assert config.source == str(tmp_path / "prism.ini")
    assert (config.listen.host, config.listen.port) == ("127.0.0.1", 9999)
    assert config.catalog_path == tmp_path / "catalog.toml"


def test_setup_cfg_section(tmp_path):
    write(
        tmp_path, "setup.cfg", "[metadata]\nname = x\n[prism]\ncatalog = c.toml\ndisable = a, b\n"
    )
    config = load_config(start=tmp_path)
    assert config.source.endswith("setup.cfg")
    assert config.disable == ("a", "b")


def test_setup_cfg_without_prism_section_is_skipped_for_pyproject(tmp_path):
    write(tmp_path, "setup.cfg", "[metadata]\nname = x\n")
    write(
        tmp_path,
        "pyproject.toml",
        """
        [tool.prism]
        catalog = "c.toml"
        required_plugins = ["openai"]

        [tool.prism.timeout-header]
        timeout_max_ms = 5000
        """,
    )
    config = load_config(start=tmp_path)
    assert config.source.endswith("pyproject.toml")
    assert config.required_plugins == ("openai",)
    assert config.section("timeout-header").get_int("timeout_max_ms", 1) == 5000


def test_prism_ini_wins_over_setup_cfg(tmp_path):
    write(tmp_path, "setup.cfg", "[prism]\ncatalog = other.toml\n")
    write(tmp_path, "prism.ini", "[prism]\ncatalog = c.toml\n")
    assert load_config(start=tmp_path).source.endswith("prism.ini")


def test_plugin_section_from_ini(tmp_path):
    write(tmp_path, "prism.ini", "[prism]\ncatalog = c.toml\n[prism:breaker]\nconsecutive = 4\n")
    config = load_config(start=tmp_path)
    assert config.section("breaker").get_int("consecutive", 3) == 4
    with pytest.raises(
        ConfigError, match=r"prism\.ini: \[prism:breaker\] consecutive: must be at most 3"
    ):
        config.section("breaker").get_int("consecutive", 3, max=3)


def test_a_plugin_url_is_checked_against_the_schemes_it_names(tmp_path):
    write(
        tmp_path,
        "prism.ini",
        "[prism]\ncatalog = c.toml\n[prism:queue]\nurl = amqp://u:s3cret@h/v\nblank =\n",
    )
    section = load_config(start=tmp_path).section("queue")
    assert section.get_url("url", schemes=("amqp", "amqps")) == "amqp://u:s3cret@h/v"
    assert section.get_url("blank", schemes=("amqp",)) is None
    assert section.get_url("absent", schemes=("amqp",)) is None
    with pytest.raises(ConfigError) as info:
        section.get_url("url", schemes=("postgresql", "postgres"))
    message = str(info.value)
    assert "[prism:queue] url: expected a postgresql:// or postgres:// URL" in message
    assert "s3cret" not in message
    # The engine-named check stays one release, warning its callers.
    with pytest.warns(DeprecationWarning, match="get_url"):
        assert section.check_postgres_url("pg", "postgres://h/db") == "postgres://h/db"


@pytest.mark.parametrize(
    ("ini", "catalog", "key", "problem"),
    [
        ("catalog = missing.toml", None, "catalog", "file not found"),
        ("catalog = c.toml\nlisten = nowhere", CATALOG, "[prism] listen", "expected HOST:PORT"),
        (
            "catalog = c.toml\nlisten = 127.0.0.1:http",
            CATALOG,
            "[prism] listen",
            "port must be a number",
        ),
        ("catalog = c.toml\nlisen = 127.0.0.1:1", CATALOG, "[prism] lisen", "unknown key"),
        (
            "catalog = c.toml\nmax_body_bytes = lots",
            CATALOG,
            "[prism] max_body_bytes",
            "whole number",
        ),
        (
            "catalog = c.toml\nattempt_timeout_ms = 10",
            CATALOG,
            "[prism] attempt_timeout_ms",
            "at least 1000",
        ),
        ("catalog = c.toml\nbacklog = 0", CATALOG, "[prism] backlog", "at least 1"),
        (
            "catalog = c.toml\npermanent_markers = quota",
            CATALOG,
            "[prism] permanent_markers",
            "bare word 'quota'",
        ),
        ("listen = 127.0.0.1:1", None, "[prism] catalog", "missing"),
        ("catalog = c.toml", "[models.x\n", "(file)", "not valid TOML"),
        (
            "catalog = c.toml",
            CATALOG.replace('provider = "alpha"', 'provider = "gamma"'),
            "models.chat-a.chain[0].provider",
            "unknown provider 'gamma'",
        ),
        (
            "catalog = c.toml",
            CATALOG.replace('kind = "openai"', 'kind = "carrier-pigeon"'),
            "providers.alpha.kind",
            "unknown provider kind 'carrier-pigeon'",
        ),
        (
            "catalog = c.toml",
            CATALOG + "temperature = 3\n",
            "models.chat-a.temperature",
            "unknown key",
        ),
        (
            "catalog = c.toml",
            CATALOG.replace("[models.chat-a]", "[model.chat-a]"),
            "model",
            "unknown table",
        ),
        (
            "catalog = c.toml",
            CATALOG.replace('base_url = "http', 'base_url = "ftp'),
            "providers.alpha.base_url",
            "http(s) URL",
        ),
        (
            "catalog = c.toml",
            CATALOG.replace("kind =", "colour = 1\nkind ="),
            "providers.alpha.colour",
            "unknown option",
        ),
        (
            "catalog = c.toml",
            CATALOG.replace('chain = [ { provider = "alpha", model = "up-alpha" } ]', "chain = []"),
            "models.chat-a.chain",
            "missing or empty",
        ),
    ],
)
def test_config_errors_name_file_key_and_problem(tmp_path, ini, catalog, key, problem):
    config_path = write(tmp_path, "prism.ini", f"[prism]\n{ini}\n")
    if catalog is not None:
        write(tmp_path, "c.toml", catalog)
    with pytest.raises(ConfigError) as info:
        create_app(load_config(config_path))
    message = str(info.value)
    assert key in message
    assert problem in message
    assert str(tmp_path) in message


def test_missing_config_file():
    with pytest.raises(ConfigError, match="file not found"):
        load_config("/nonexistent/prism.ini")


def _prism(*args: str, cwd: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "prism_proxy.cli", *args],
        cwd=cwd,
        capture_output=True,
        text=True,
        timeout=60,
    )


def test_prism_check_passes_and_fails(tmp_path):
    write(tmp_path, "prism.ini", "[prism]\ncatalog = c.toml\n")
    write(tmp_path, "c.toml", CATALOG)
    ok = _prism("check", cwd=tmp_path)
    assert ok.returncode == 0, ok.stderr
    assert "1 providers, 1 models" in ok.stdout
    write(tmp_path, "c.toml", CATALOG.replace('"alpha", model', '"nobody", model'))
    bad = _prism("check", "--config", str(tmp_path / "prism.ini"), cwd=tmp_path)
    assert bad.returncode == 2
    assert "c.toml: models.chat-a.chain[0].provider: unknown provider 'nobody'" in bad.stderr
