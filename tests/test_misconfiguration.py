"""No silent misconfiguration: misspelt sections, loose booleans, and `prism check`'s own
lines from the plugins (hook ``prism_check``), as an operator meets them."""

from __future__ import annotations

import asyncio
import logging
from pathlib import Path

import pytest

from prism_proxy import CheckLine, hookimpl
from prism_proxy.cli import main

CATALOG = (
    '[providers.p]\nkind = "openai"\nbase_url = "http://127.0.0.1:9/v1"\n'
    '[models.m]\nchain = [ { provider = "p", model = "x" } ]\n'
)


def write_ini(directory: Path, text: str) -> str:
    (directory / "catalog.toml").write_text(CATALOG)
    ini = directory / "prism.ini"
    ini.write_text(text)
    return str(ini)


def check(capsys: pytest.CaptureFixture[str], config: str, *args: str) -> tuple[int, str, str]:
    status = main(["check", "--config", config, *args])
    captured = capsys.readouterr()
    return status, captured.out, captured.err


# -- a section meant for Prism but spelt otherwise ----------------------------------------


@pytest.mark.parametrize(
    ("section", "right"),
    [
        ("[prism-billing]", "[prism:billing]"),
        ("[prism_keys]", "[prism:keys]"),
        ("[prism.redis]", "[prism:redis]"),
        ("[prism: breaker]", "[prism:breaker]"),
        ("[Prism:metrics]", "[prism:metrics]"),
    ],
)
def test_a_misspelt_plugin_section_names_the_right_spelling(tmp_path, capsys, section, right):
    ini = write_ini(tmp_path, f"[prism]\ncatalog = catalog.toml\n{section}\nsome_key = 1\n")
    status, _, err = check(capsys, ini)
    assert status == 2
    assert err == (
        f"prism: configuration error: {ini}: {section}: never read: "
        f"a plugin's section is spelt {right}\n"
    )


def test_a_misspelt_core_section_is_named_before_the_missing_one(tmp_path, capsys):
    ini = write_ini(tmp_path, "[Prism]\ncatalog = catalog.toml\n")
    status, _, err = check(capsys, ini)
    assert status == 2
    assert f"{ini}: [Prism]: never read: the core's section is spelt [prism]" in err


def test_a_misspelt_table_in_pyproject_names_the_right_spelling(tmp_path, capsys):
    (tmp_path / "catalog.toml").write_text(CATALOG)
    pyproject = tmp_path / "pyproject.toml"
    pyproject.write_text(
        '[tool.prism]\ncatalog = "catalog.toml"\n[tool.prism-billing]\nledger_path = "l.db"\n'
    )
    status, _, err = check(capsys, str(pyproject))
    assert status == 2
    assert (
        f"{pyproject}: [tool.prism-billing]: never read: "
        "a plugin's section is spelt [tool.prism.billing]" in err
    )


def test_other_tools_sections_are_left_alone(tmp_path, capsys):
    ini = write_ini(
        tmp_path,
        "[metadata]\nname = prismatic\n[prismatic]\nx = 1\n[prism]\ncatalog = catalog.toml\n",
    )
    status, out, err = check(capsys, ini, "--offline")
    assert status == 0, err
    assert f"{ini}: ok" in out


def test_a_plugin_name_with_a_typo_suggests_the_installed_one(tmp_path, capsys):
    ini = write_ini(tmp_path, "[prism]\ncatalog = catalog.toml\n[prism:breakr]\n")
    status, _, err = check(capsys, ini)
    assert status == 2
    assert f"{ini}: [prism:breakr]: no installed plugin is named 'breakr' (did you mean " in err
    assert "[prism:breaker]?" in err
    ini = write_ini(tmp_path, "[prism]\ncatalog = catalog.toml\ndisable = breakr\n")
    status, _, err = check(capsys, ini)
    assert status == 2
    assert f"{ini}: [prism] disable: no installed plugin is named 'breakr' (did you mean " in err
    assert "'breaker'?" in err


# -- booleans are true or false --------------------------------------------------------------


@pytest.mark.parametrize("value", ["yes", "on", "1", "no", "off", "0"])
def test_a_boolean_is_exactly_true_or_false(tmp_path, capsys, value):
    ini = write_ini(
        tmp_path,
        f"[prism]\ncatalog = catalog.toml\n[prism:breaker]\nlatency_whole_body = {value}\n",
    )
    status, _, err = check(capsys, ini)
    assert status == 2
    assert err == (
        f"prism: configuration error: {ini}: [prism:breaker] latency_whole_body: "
        f"expected true or false, got {value!r}\n"
    )


def test_true_and_false_in_any_case_are_booleans(tmp_path, capsys):
    ini = write_ini(
        tmp_path,
        "[prism]\ncatalog = catalog.toml\ncross_tier_fallback = TRUE\n"
        "[prism:breaker]\nlatency_whole_body = False\n",
    )
    status, _, err = check(capsys, ini, "--offline")
    assert status == 0, err


@pytest.mark.parametrize("value", ["maybe", "yes"])
def test_cross_tier_fallback_names_all_it_accepts(tmp_path, capsys, value):
    ini = write_ini(tmp_path, f"[prism]\ncatalog = catalog.toml\ncross_tier_fallback = {value}\n")
    status, _, err = check(capsys, ini)
    assert status == 2
    assert err == (
        f"prism: configuration error: {ini}: [prism] cross_tier_fallback: "
        f"expected true, false or caller, got {value!r}\n"
    )


# -- a plugin section that leaves its plugin off ------------------------------------------------


@pytest.mark.parametrize(
    ("section", "message"),
    [
        (
            "[prism:billing]\ncurrency = EUR\n",
            "[prism:billing] ledger_path: not set (nor ledger_url): name the ledger",
        ),
        ("[prism:billing]\n", "without it prism-billing is off, records nothing"),
        ("[prism:keys]\n", "[prism:keys] db_path: missing: name the key database"),
        (
            "[prism:redis]\nkey_prefix = fleet\n",
            "[prism:redis] url: missing: name the Redis to share state through",
        ),
        ("[prism:redis]\n", "without it prism-redis is off and every gateway keeps its own"),
        ("[prism:openai]\napi_key = sk-s3cret\n", "[prism:openai] api_key: unknown key"),
        ("[prism:anthropic]\nbase_url = x\n", "[prism:anthropic] base_url: unknown key"),
    ],
)
def test_a_section_that_leaves_its_plugin_off_is_an_error(tmp_path, capsys, section, message):
    ini = write_ini(tmp_path, f"[prism]\ncatalog = catalog.toml\n{section}")
    status, out, err = check(capsys, ini)
    assert status == 2
    assert err.startswith(f"prism: configuration error: {ini}: ")
    assert message in err
    assert "s3cret" not in out + err


@pytest.mark.parametrize(
    ("section", "warning"),
    [
        (
            "[prism:otel]\nservice_name = gw\n",
            "[prism:otel] endpoint: not set, and enabled is not true: prism-otel is off",
        ),
        (
            "[prism:probes]\ninterval_s = 10\n",
            "[prism:probes] enabled: not set: live probes are off",
        ),
    ],
)
def test_a_section_that_leaves_a_plugin_off_the_gateway_can_do_without_is_a_warning(
    tmp_path, capsys, caplog, section, warning
):
    ini = write_ini(tmp_path, f"[prism]\ncatalog = catalog.toml\n{section}")
    caplog.set_level(logging.WARNING)
    status, _, err = check(capsys, ini, "--offline")
    assert status == 0, err
    said = [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING]
    assert [m for m in said if warning in m] == [
        next(m for m in said if m.startswith(f"{ini}: {warning}"))
    ]

    # Saying that off is meant quiets it.
    plugin = section.split(":")[1].split("]")[0]
    write_ini(tmp_path, f"[prism]\ncatalog = catalog.toml\n[prism:{plugin}]\nenabled = false\n")
    caplog.clear()
    status, _, err = check(capsys, ini, "--offline")
    assert status == 0, err
    assert not [r for r in caplog.records if f"[prism:{plugin}]" in r.getMessage()]


# -- the prism_check hook ---------------------------------------------------------------------


class Reporter:
    """A plugin with three checks: one fine, one that fails, one that hangs."""

    def __init__(self) -> None:
        self.offline: list[bool] = []

    @hookimpl
    def prism_check(self, offline):
        self.offline.append(offline)

        async def reach():
            return [
                CheckLine("widgets", "on, reachable"),
                CheckLine("gadgets", "on: NOT REACHABLE (refused)", ok=False),
            ]

        return reach()


class Broken:
    @hookimpl
    def prism_check(self, generation):
        raise RuntimeError("postgresql://admin:hunter2@db/x exploded")


class Hanging:
    @hookimpl
    def prism_check(self):
        return asyncio.sleep(60)


@pytest.fixture
def with_plugins(monkeypatch):
    from prism_proxy import plugins

    def install(*named):
        def make(config, **kwargs):
            return plugins.make_plugin_manager(config, extra_plugins=named)

        monkeypatch.setattr("prism_proxy.generation.make_plugin_manager", make)

    return install


def test_check_prints_every_plugins_lines_and_fails_on_a_failed_one(
    tmp_path, capsys, with_plugins
):
    reporter = Reporter()
    with_plugins((reporter, "reporter"))
    ini = write_ini(tmp_path, "[prism]\ncatalog = catalog.toml\n")
    status, out, err = check(capsys, ini)
    assert status == 1
    assert reporter.offline == [False]
    assert "widgets: on, reachable\n" in out
    assert "gadgets: on: NOT REACHABLE (refused)\n" in out
    assert err == "prism check: the configuration is valid, but not ready: gadgets\n"
    # The bundled plugins say whether they are on, even when they are not.
    assert "billing: off: no [prism:billing] section names a ledger" in out
    assert "keys: off: no [prism:keys] section; the gateway answers anyone" in out
    assert "shared state: off: no [prism:redis] section" in out


def test_offline_is_handed_to_the_plugins(tmp_path, capsys, with_plugins):
    reporter = Reporter()
    with_plugins((reporter, "reporter"))
    ini = write_ini(tmp_path, "[prism]\ncatalog = catalog.toml\n")
    check(capsys, ini, "--offline")
    assert reporter.offline == [True]


def test_a_check_that_raises_or_hangs_is_a_failed_line_naming_its_plugin(
    tmp_path, capsys, with_plugins, monkeypatch
):
    monkeypatch.setattr("prism_proxy.commands.CHECK_TIMEOUT_S", 0.2)
    with_plugins((Broken(), "broken"), (Hanging(), "hanging"))
    ini = write_ini(tmp_path, "[prism]\ncatalog = catalog.toml\n")
    status, out, err = check(capsys, ini)
    assert status == 1
    assert "broken: its check failed (RuntimeError)\n" in out
    assert "hanging: its check did not finish within 0.2 s\n" in out
    assert "hunter2" not in out + err
    assert err == "prism check: the configuration is valid, but not ready: broken, hanging\n"
