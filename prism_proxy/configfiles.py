"""Finding a configuration file and reading its sections, the way pytest finds its own.

Search order in a directory: ``prism.ini`` (section ``[prism]``), then
``setup.cfg`` with a ``[prism]`` section, then ``pyproject.toml`` with a
``[tool.prism]`` table; the first directory from the current one upwards
that has one wins.
"""

from __future__ import annotations

import configparser
import re
import tomllib
from pathlib import Path
from typing import Any

from .errors import ConfigError

__all__ = ["CONFIG_ENV", "find_config", "read_sections"]

#: The configuration file to use when no ``--config`` is given, before any search.
CONFIG_ENV = "PRISM_CONFIG"

#: A section or table name that looks meant for Prism: ``prism`` in any case, then an
#: optional separator and a plugin name (``Prism``, ``prism-billing``, ``prism.keys``).
_LOOKS_LIKE_PRISM = re.compile(r"\s*prism\s*(?:[-_.:/ ]\s*(?P<plugin>\S.*?))?\s*", re.IGNORECASE)


def read_sections(path: Path) -> tuple[dict[str, Any], dict[str, dict[str, Any]]]:
    """``[prism]``'s values and every plugin section's, from an ini or TOML file."""
    if path.suffix == ".toml":
        return _read_pyproject(path)
    return _read_ini(path)


def find_config(start: Path | None = None) -> Path | None:
    """The first config file from ``start`` upwards, or None."""
    here = (start or Path.cwd()).resolve()
    for directory in (here, *here.parents):
        ini = directory / "prism.ini"
        if ini.is_file():
            return ini
        cfg = directory / "setup.cfg"
        if cfg.is_file() and _ini_has_prism(cfg):
            return cfg
        pyproject = directory / "pyproject.toml"
        if pyproject.is_file() and _pyproject_has_prism(pyproject):
            return pyproject
    return None


def _ini_has_prism(path: Path) -> bool:
    parser = configparser.ConfigParser(interpolation=None)
    try:
        parser.read(path, encoding="utf-8")
    except (configparser.Error, UnicodeDecodeError):
        return False
    return parser.has_section("prism")


def _pyproject_has_prism(path: Path) -> bool:
    try:
        data = tomllib.loads(path.read_text(encoding="utf-8"))
    except (OSError, tomllib.TOMLDecodeError):
        return False
    return "prism" in data.get("tool", {})


def _read_ini(path: Path) -> tuple[dict[str, Any], dict[str, dict[str, Any]]]:
    parser = configparser.ConfigParser(interpolation=None)
    try:
        parser.read(path, encoding="utf-8")
    except configparser.Error as exc:
        where, problem = _ini_mistake(exc)
        raise ConfigError(str(path), where, f"not a valid ini file ({problem})") from None
    except UnicodeDecodeError as exc:
        raise ConfigError(
            str(path), "(file)", f"not a valid ini file (not UTF-8 text at byte {exc.start})"
        ) from None
    for name in parser.sections():
        _check_spelling(str(path), name, "[{}]", ":")
    if not parser.has_section("prism"):
        raise ConfigError(str(path), "[prism]", "section missing")
    core = dict(parser.items("prism"))
    plugins = {
        name.split(":", 1)[1]: dict(parser.items(name))
        for name in parser.sections()
        if name.startswith("prism:")
    }
    return core, plugins


def _ini_mistake(exc: configparser.Error) -> tuple[str, str]:
    """Where an ini file is broken (``line N``) and what is wrong, in words, without reprs."""
    if isinstance(exc, configparser.MissingSectionHeaderError):
        return f"line {exc.lineno}", "a key outside any section"
    if isinstance(exc, configparser.DuplicateOptionError):
        return f"line {exc.lineno}", f"[{exc.section}] {exc.option} is set twice"
    if isinstance(exc, configparser.DuplicateSectionError):
        return f"line {exc.lineno}", f"section [{exc.section}] appears twice"
    if isinstance(exc, configparser.ParsingError) and exc.errors:
        lines = [lineno for lineno, _ in exc.errors]
        more = f" (and {len(lines) - 1} more)" if len(lines) > 1 else ""
        return f"line {lines[0]}", f"not a [section], a key = value or a comment{more}"
    return "(file)", type(exc).__name__


def _read_pyproject(path: Path) -> tuple[dict[str, Any], dict[str, dict[str, Any]]]:
    try:
        data = tomllib.loads(path.read_text(encoding="utf-8"))
    except tomllib.TOMLDecodeError as exc:
        raise ConfigError(str(path), "(file)", f"not valid TOML: {exc}") from None
    tool = data.get("tool", {})
    for name in tool if isinstance(tool, dict) else ():
        _check_spelling(str(path), name, "[tool.{}]", ".")
    table = tool.get("prism")
    if not isinstance(table, dict):
        raise ConfigError(str(path), "[tool.prism]", "table missing")
    core = {k: v for k, v in table.items() if not isinstance(v, dict)}
    plugins = {k: v for k, v in table.items() if isinstance(v, dict)}
    return core, plugins


def _check_spelling(source: str, name: str, shape: str, plugin_separator: str) -> None:
    """Refuse a section (``shape`` spells it: ``[{}]``, ``[tool.{}]``) that looks meant for
    Prism but is spelt otherwise, naming the right spelling: it would never be read."""
    found = _LOOKS_LIKE_PRISM.fullmatch(name)
    if found is None:
        return
    plugin = found.group("plugin")
    right = "prism" if plugin is None else f"prism{plugin_separator}{plugin.lower()}"
    if name == right:
        return
    what = "the core's section" if plugin is None else "a plugin's section"
    raise ConfigError(
        source, shape.format(name), f"never read: {what} is spelt {shape.format(right)}"
    )
