"""`prism new-plugin`: the distributions it writes are lint-clean and their own tests pass."""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import tomllib
from pathlib import Path

import pytest

from prism_proxy.cli import main
from prism_proxy.commands import Commands
from prism_proxy.config import config_from_mapping
from prism_proxy.scaffold import add_scaffold_command, name_problem

REPO = Path(__file__).resolve().parents[1]


def new_plugin(*argv: str) -> int:
    """``prism new-plugin ...`` through a parser built the way cli.py builds its own.

    cli.py does not register the command yet; test_prism_main_runs_new_plugin
    covers the real ``prism`` entry once it does.
    """
    parser = argparse.ArgumentParser(prog="prism")
    commands = Commands(parser.add_subparsers(dest="command", required=True))
    add_scaffold_command(commands)
    args = parser.parse_args(["new-plugin", *argv])
    config = config_from_mapping({}, catalog_data={}, source="(no configuration found)")
    status: int = args.run(args, config)
    return status


def files_in(directory: Path) -> set[str]:
    return {p.relative_to(directory).as_posix() for p in directory.rglob("*") if p.is_file()}


def run_generated_tests(directories: list[Path], *, site: Path | None = None) -> dict[str, str]:
    """Run the generated distributions' tests in one fresh interpreter.

    Returns each test's outcome by node id (``DIR/tests/test_x.py::test_y``).
    One interpreter for all of them, because its start dominates the cost.
    The first distribution's pyproject.toml is the pytest configuration
    (``-c``; every template declares the same pytest settings), so this
    repository's setup.cfg (importlib mode, testpaths) does not leak in; each
    directory is on ``PYTHONPATH`` as its own ``pythonpath = ["."]`` would
    put it.  ``prism_proxy.testing`` arrives through prism-llm-gateway's
    ``pytest11`` entry point, as for any author who installed
    prism-llm-gateway (``-p prism_proxy.testing`` on top would register it
    twice and stop pytest).
    """
    env = {
        key: value
        for key, value in os.environ.items()
        if key not in {"PYTEST_ADDOPTS", "PYTEST_DISABLE_PLUGIN_AUTOLOAD", "PYTEST_PLUGINS"}
    }
    root = directories[0].parent
    paths = [*map(str, directories), *([str(site)] if site else []), env.get("PYTHONPATH", "")]
    env["PYTHONPATH"] = os.pathsep.join(p for p in paths if p)
    result = subprocess.run(
        [
            sys.executable,
            "-m",
            "pytest",
            *(str(d / "tests") for d in directories),
            "-q",
            "-rA",
            "--rootdir",
            str(root),
            "-c",
            str(directories[0] / "pyproject.toml"),
            "-p",
            "no:cacheprovider",
        ],
        cwd=root,
        env=env,
        capture_output=True,
        text=True,
        timeout=180,
    )
    assert result.returncode == 0, result.stdout + result.stderr
    outcomes = {}
    for line in result.stdout.splitlines():
        outcome, _, node = line.partition(" ")
        if outcome in {"PASSED", "FAILED", "ERROR", "SKIPPED"} and "::" in node:
            outcomes[node.split(" ")[0]] = outcome
    return outcomes


def passed_in(outcomes: dict[str, str], directory: Path) -> int:
    prefix = f"{directory.name}/"
    mine = {node: o for node, o in outcomes.items() if node.startswith(prefix)}
    assert set(mine.values()) == {"PASSED"}, mine
    return len(mine)


def assert_lint_clean(*directories: Path) -> None:
    """ruff, each file under its generated pyproject's own settings (Prism's rule set)."""
    for command in (["check"], ["format", "--check"]):
        result = subprocess.run(
            [sys.executable, "-m", "ruff", *command, "--no-cache", *map(str, directories)],
            cwd=directories[0].parent,
            capture_output=True,
            text=True,
            timeout=60,
        )
        assert result.returncode == 0, result.stdout + result.stderr


def test_policy_plugin_is_written(tmp_path, capsys):
    target = tmp_path / "prism-team-header"
    assert new_plugin("team-header", "--kind", "policy", str(target)) == 0
    out = capsys.readouterr().out
    assert files_in(target) == {
        "pyproject.toml",
        "README.md",
        "prism_team_header/__init__.py",
        "prism_team_header/py.typed",
        "prism_team_header/plugin.py",
        "tests/test_team_header.py",
    }
    assert f"pip install -e {target}" in out
    assert f"pytest {target}" in out
    project = tomllib.loads((target / "pyproject.toml").read_text())["project"]
    assert project["name"] == "prism-team-header"
    assert "prism-llm-gateway>=0.1" in project["dependencies"]
    assert project["entry-points"]["prism_proxy"] == {"team-header": "prism_team_header.plugin"}
    plugin = (target / "prism_team_header" / "plugin.py").read_text()
    assert 'HEADER = "x-team-header"' in plugin
    assert "[prism:team-header]" in (target / "README.md").read_text()
    for path in target.rglob("*"):
        assert not path.is_file() or "{{" not in path.read_text(), path


def test_provider_plugin_is_written(tmp_path):
    target = tmp_path / "acme"
    assert new_plugin("acme-llm", "--kind", "provider", str(target)) == 0
    assert files_in(target) == {
        "pyproject.toml",
        "README.md",
        "prism_acme_llm/__init__.py",
        "prism_acme_llm/py.typed",
        "prism_acme_llm/plugin.py",
        "tests/test_acme_llm.py",
    }
    project = tomllib.loads((target / "pyproject.toml").read_text())["project"]
    assert project["entry-points"]["prism_proxy"] == {"acme-llm": "prism_acme_llm.plugin"}
    plugin = (target / "prism_acme_llm" / "plugin.py").read_text()
    assert "class AcmeLlmProvider(HttpProvider):" in plugin
    assert 'wire = "openai"' in plugin
    for path in target.rglob("*"):
        assert not path.is_file() or "{{" not in path.read_text(), path


def test_provider_of_its_own_wire_is_written(tmp_path, capsys):
    target = tmp_path / "acme"
    assert new_plugin("acme-wire", "--kind", "provider", "--wire", "custom", str(target)) == 0
    assert "a provider plugin of its own wire named 'acme-wire'" in capsys.readouterr().out
    assert files_in(target) == {
        "pyproject.toml",
        "README.md",
        "prism_acme_wire/__init__.py",
        "prism_acme_wire/py.typed",
        "prism_acme_wire/plugin.py",
        "prism_acme_wire/wire.py",
        "tests/test_acme_wire.py",
    }
    plugin = (target / "prism_acme_wire" / "plugin.py").read_text()
    assert "def prism_wires()" in plugin and "def prism_classify(" in plugin
    assert 'WIRE = "acme-wire"' in (target / "prism_acme_wire" / "wire.py").read_text()
    for path in target.rglob("*"):
        assert not path.is_file() or "{{" not in path.read_text(), path


def test_wire_is_for_providers_only(tmp_path, capsys):
    target = tmp_path / "x"
    assert new_plugin("team-x", "--kind", "policy", "--wire", "custom", str(target)) == 2
    assert "--wire is for provider plugins" in capsys.readouterr().err
    assert not target.exists()


def test_generated_plugins_are_lint_clean_and_their_tests_pass(tmp_path):
    policy = tmp_path / "prism-team-header"
    provider = tmp_path / "prism-acme-llm"
    custom = tmp_path / "prism-acme-wire"
    assert new_plugin("team-header", "--kind", "policy", str(policy)) == 0
    assert new_plugin("acme-llm", "--kind", "provider", str(provider)) == 0
    assert new_plugin("acme-wire", "--kind", "provider", "--wire", "custom", str(custom)) == 0
    assert_lint_clean(policy, provider, custom)
    # `pip install -e DIR` adds an entry point; the generated tests must then
    # load the plugin through it instead of registering it a second time.  A
    # dist-info directory on the path is what an installation amounts to
    # here: the policy plugin is "installed", the two providers are not, so
    # both ways the templates share are taken in the one run.
    info = tmp_path / "site" / "prism_team_header-0.1.0.dist-info"
    info.mkdir(parents=True)
    (info / "METADATA").write_text(
        "Metadata-Version: 2.1\nName: prism-team-header\nVersion: 0.1.0\n"
    )
    (info / "entry_points.txt").write_text(
        "[prism_proxy]\nteam-header = prism_team_header.plugin\n"
    )
    outcomes = run_generated_tests([policy, provider, custom], site=tmp_path / "site")
    assert passed_in(outcomes, policy) == 4
    assert passed_in(outcomes, provider) == 5
    # Chat both ways, a stream, an Anthropic caller through chat, a retry, a refusal, the key.
    assert passed_in(outcomes, custom) == 6


@pytest.mark.parametrize(
    "name",
    ["Team", "team_header", "team-", "team--header", "1team", "team header", "tëam", ""],
)
def test_a_bad_name_is_refused_and_nothing_written(tmp_path, capsys, name):
    target = tmp_path / "out"
    assert new_plugin(name, "--kind", "policy", str(target)) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1
    assert err[0].startswith(f"prism new-plugin: invalid plugin name {name!r}")
    assert not target.exists()


def test_a_leading_dash_is_refused():
    # On the command line argparse takes "-team" for an option before we see it.
    assert name_problem("-team") is not None


def test_the_prism_prefix_is_refused_with_the_name_to_use(tmp_path, capsys):
    assert new_plugin("prism-team", "--kind", "policy", str(tmp_path / "out")) == 2
    assert "without 'prism-'" in capsys.readouterr().err


def test_an_unknown_kind_is_an_argparse_error(tmp_path):
    with pytest.raises(SystemExit) as info:
        new_plugin("team", "--kind", "router", str(tmp_path / "out"))
    assert info.value.code == 2


def test_a_non_empty_directory_is_never_overwritten(tmp_path, capsys):
    target = tmp_path / "prism-team"
    target.mkdir()
    (target / "pyproject.toml").write_text("mine\n")
    assert new_plugin("team", "--kind", "provider", str(target)) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert err == [f"prism new-plugin: {target} exists and is not empty; choose another DIR"]
    assert files_in(target) == {"pyproject.toml"}
    assert (target / "pyproject.toml").read_text() == "mine\n"


def test_a_file_in_the_way_is_refused(tmp_path, capsys):
    target = tmp_path / "prism-team"
    target.write_text("mine\n")
    assert new_plugin("team", "--kind", "policy", str(target)) == 2
    assert "exists and is not a directory" in capsys.readouterr().err
    assert target.read_text() == "mine\n"


def test_an_empty_directory_is_used(tmp_path):
    target = tmp_path / "here"
    target.mkdir()
    assert new_plugin("team", "--kind", "policy", str(target)) == 0
    assert (target / "prism_team" / "plugin.py").is_file()


def test_dir_defaults_to_prism_name_and_may_follow_kind(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    assert new_plugin("team", "--kind", "policy") == 0
    assert (tmp_path / "prism-team" / "prism_team" / "plugin.py").is_file()
    # DIR after --kind, as the usage line reads: Python 3.11's argparse alone
    # would call it an unrecognised argument.
    assert new_plugin("other", "--kind", "provider", "elsewhere") == 0
    assert (tmp_path / "elsewhere" / "prism_other" / "plugin.py").is_file()
    with pytest.raises(SystemExit):
        new_plugin("third", "--kind", "provider", "a", "b")


def test_a_name_taken_by_an_installed_plugin_is_written_with_a_warning(tmp_path, capsys):
    # prism-openai is installed here: its tests would load that plugin, not the new one.
    assert new_plugin("openai", "--kind", "provider", str(tmp_path / "out")) == 0
    captured = capsys.readouterr()
    assert "warning: an installed plugin is already named 'openai'" in captured.err
    assert "pip install -e" in captured.out


def test_every_template_is_package_data():
    # A template the pyproject globs miss would be absent from an installed wheel.
    package_data = tomllib.loads((REPO / "pyproject.toml").read_text())["tool"]["setuptools"][
        "package-data"
    ]["prism_proxy"]
    root = REPO / "prism_proxy"
    shipped = {path for pattern in package_data for path in root.glob(pattern)}
    templates = set((root / "scaffold_templates").rglob("*.tmpl"))
    assert templates
    assert templates <= shipped


def test_prism_main_runs_new_plugin(tmp_path, monkeypatch, capsys):
    monkeypatch.chdir(tmp_path)  # no prism.ini above: the command needs none
    assert main(["new-plugin", "team", "--kind", "policy", "out"]) == 0
    assert (tmp_path / "out" / "prism_team" / "plugin.py").is_file()
    assert "pip install -e out" in capsys.readouterr().out
