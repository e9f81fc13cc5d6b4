"""Declarative settings: one description per section gives the known keys, the defaults,
the messages and the README's table; a README whose table disagrees fails here."""

from __future__ import annotations

import importlib.metadata
import importlib.util
from pathlib import Path
from typing import Literal

import attrs
import pytest

from prism_proxy import ConfigError, Section, read_settings, setting, settings_table
from prism_proxy.config import Config, config_from_mapping
from prism_proxy.settings import documented_table

REPO = Path(__file__).resolve().parents[1]


@attrs.frozen
class Knobs:
    threshold: int = setting(3, min=1, max=10, help="how many")
    ratio: float = setting(0.5, min=0.0, help="a share")
    loud: bool = setting(False, help="say more")
    mode: Literal["fast", "safe"] = setting("safe", help="how")
    names: tuple[str, ...] = setting((), help="who")
    where: str | None = setting(None, help="a place")
    source: str = "<config>"

    def check(self, section: Section) -> None:
        if self.loud and self.mode == "fast":
            raise section.error("loud", "a fast mode cannot be loud")


def knobs(**values: object) -> Knobs:
    return read_settings(Knobs, Section("prism.ini", "prism:knobs", dict(values)), source="x")


def test_defaults_and_values_from_ini_strings_and_toml_natives():
    assert knobs() == Knobs(source="x")
    got = knobs(threshold="7", ratio=0.25, loud="TRUE", mode="Safe", names="a, b", where="here")
    assert (got.threshold, got.ratio, got.loud, got.mode, got.names, got.where) == (
        7,
        0.25,
        True,
        "safe",
        ("a", "b"),
        "here",
    )


@pytest.mark.parametrize(
    ("values", "message"),
    [
        ({"treshold": 3}, "[prism:knobs] treshold: unknown key (known keys: "),
        ({"threshold": 0}, "[prism:knobs] threshold: must be at least 1, got 0"),
        ({"threshold": "11"}, "[prism:knobs] threshold: must be at most 10, got 11"),
        ({"threshold": "three"}, "[prism:knobs] threshold: expected a whole number"),
        ({"loud": "yes"}, "[prism:knobs] loud: expected true or false, got 'yes'"),
        ({"ratio": "nan"}, "[prism:knobs] ratio: expected a finite number, got nan"),
        ({"mode": "turbo"}, "[prism:knobs] mode: expected fast or safe, got 'turbo'"),
        ({"loud": True, "mode": "fast"}, "[prism:knobs] loud: a fast mode cannot be loud"),
    ],
)
def test_every_mistake_names_the_section_and_key(values, message):
    with pytest.raises(ConfigError) as caught:
        knobs(**values)
    assert message in str(caught.value)
    assert str(caught.value).startswith("prism.ini: ")


def test_the_table_shows_types_bounds_defaults_and_help():
    table = settings_table(Knobs).splitlines()
    assert table[0] == "| key | type | default | what it does |"
    assert "| `threshold` | whole number, 1 to 10 | `3` | how many |" in table
    assert "| `mode` | `fast` or `safe` | `safe` | how |" in table
    assert "| `where` | text | unset | a place |" in table
    assert not any("source" in row for row in table), "a field that is no setting is no key"


def test_the_core_section_is_read_from_its_description():
    config = config_from_mapping({"catalog": "c.toml", "retries": "4", "log_format": "JSON"})
    assert (config.retries, config.log_format, config.backoff_cap_ms) == (4, "json", 8000)
    with pytest.raises(ConfigError, match=r"\[prism\] backoff_cap_ms: must be at least 500"):
        config_from_mapping({"catalog": "c", "backoff_base_ms": 500, "backoff_cap_ms": 100})
    with pytest.raises(ConfigError, match=r"\[prism\] catlog: unknown key"):
        config_from_mapping({"catalog": "c", "catlog": "d"})


def described() -> list[tuple[str, Path, type]]:
    """Every section the repository's plugins describe, with the README that documents it."""
    found: list[tuple[str, Path, type]] = [("prism", REPO / "README.md", Config)]
    for entry_point in importlib.metadata.entry_points(group="prism_proxy"):
        if entry_point.dist is None:
            continue
        readme = REPO / "plugins" / entry_point.dist.name / "README.md"
        if not readme.is_file():
            continue  # a plugin from outside this repository
        module = entry_point.load()
        hook = getattr(module, "prism_settings", None)
        for name, schema in (hook() if hook else {}).items():
            found.append((f"prism:{name}", readme, schema))
    return found


def test_every_plugin_with_settings_describes_them():
    """A bundled plugin that reads a section of its own declares it (``prism_settings``)."""
    undescribed = []
    for entry_point in importlib.metadata.entry_points(group="prism_proxy"):
        spec = importlib.util.find_spec(entry_point.module.split(".")[0] + ".settings")
        if spec is not None and not hasattr(entry_point.load(), "prism_settings"):
            undescribed.append(entry_point.name)
    assert not undescribed, f"plugins with a settings module but no prism_settings: {undescribed}"


@pytest.mark.parametrize(("section", "readme", "schema"), described(), ids=lambda v: str(v))
def test_each_readme_shows_the_table_its_schema_gives(section, readme, schema):
    shown = documented_table(readme.read_text(), section)
    assert shown is not None, (
        f"{readme.relative_to(REPO)} has no <!-- settings: {section} --> table; "
        f"paste `prism settings {section}` there"
    )
    assert shown == settings_table(schema), (
        f"{readme.relative_to(REPO)}: the [{section}] table differs from the schema; "
        f"paste `prism settings {section}`"
    )


def test_prism_settings_prints_what_the_readmes_show(capsys, tmp_path, monkeypatch):
    from prism_proxy.cli import main

    monkeypatch.chdir(tmp_path)  # no configuration found: every installed plugin describes
    assert main(["settings", "prism:breaker"]) == 0
    out = capsys.readouterr().out
    assert out.startswith("## [prism:breaker]\n\n| key | type | default | what it does |")
    assert "| `isolation_s` |" in out and "[prism:keys]" not in out
    assert main(["settings", "prism:breakr"]) == 2
    assert "no loaded plugin describes [prism:breakr]" in capsys.readouterr().err
