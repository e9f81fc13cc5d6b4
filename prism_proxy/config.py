"""Finding and reading the configuration, the way pytest finds its own.

Search order in a directory: ``prism.ini`` (section ``[prism]``), then
``setup.cfg`` with a ``[prism]`` section, then ``pyproject.toml`` with a
``[tool.prism]`` table; the first directory from the current one upwards
that has one wins.  ``--config PATH`` skips the search, and so does the
environment variable ``PRISM_CONFIG`` when no ``--config`` is given.

Each plugin reads its own section: ``[prism:<name>]`` in ini files,
``[tool.prism.<name>]`` in ``pyproject.toml``.
"""

from __future__ import annotations

import configparser
import os
import re
import tomllib
import urllib.parse
import warnings
from collections.abc import Iterable, Mapping, Sequence
from pathlib import Path
from typing import Any, Literal

import attrs

from .errors import ConfigError

__all__ = [
    "Config",
    "Listen",
    "Section",
    "admin_token_unset",
    "config_from_mapping",
    "find_config",
    "listen_address",
    "load_config",
]

#: Connections the kernel queues before they are accepted, unless ``[prism] backlog`` says.
DEFAULT_BACKLOG = 1024

#: A section or table name that looks meant for Prism: ``prism`` in any case, then an
#: optional separator and a plugin name (``Prism``, ``prism-billing``, ``prism.keys``).
_LOOKS_LIKE_PRISM = re.compile(r"\s*prism\s*(?:[-_.:/ ]\s*(?P<plugin>\S.*?))?\s*", re.IGNORECASE)

CORE_KEYS = frozenset(
    {
        "listen",
        "catalog",
        "disable",
        "required_plugins",
        "max_body_bytes",
        "shutdown_grace_s",
        "attempt_timeout_ms",
        "log_level",
        "log_format",
        "permanent_markers",
        "retries",
        "backoff_base_ms",
        "backoff_cap_ms",
        "call_budget_ms",
        "cross_tier_fallback",
        "admin_token_env",
        "workers",
        "header_timeout_s",
        "keepalive_timeout_s",
        "max_connections",
        "backlog",
    }
)


def redact_url(url: str) -> str:
    """``url`` with its password (if any) replaced by ``***``: safe to log or show."""
    try:
        parts = urllib.parse.urlsplit(url)
        if parts.password is None:
            return url
        userinfo, _, host = parts.netloc.rpartition("@")
        user = userinfo.partition(":")[0]
        return urllib.parse.urlunsplit(parts._replace(netloc=f"{user}:***@{host}"))
    except ValueError:
        # Unparsable (a bad port, say): show no more than the scheme.
        return url.partition("://")[0] + "://***"


@attrs.define
class Section:
    """One configuration section with typed getters that fail with a clear message.

    Values come as strings from ini files and as native values from TOML;
    every getter accepts both.
    """

    source: str
    name: str
    values: dict[str, Any] = attrs.field(factory=dict)
    #: The operator wrote this section (even empty), as opposed to one made up for a
    #: plugin that has none: a section written for a plugin it leaves off is a mistake.
    written: bool = False

    def _where(self, key: str) -> str:
        return f"[{self.name}] {key}"

    def error(self, key: str, problem: str) -> ConfigError:
        return ConfigError(self.source, self._where(key), problem)

    def warning(self, key: str, problem: str) -> str:
        """A WARNING line worded like :meth:`error`'s message (file, key, problem)."""
        return str(self.error(key, problem))

    def check_keys(self, known: Iterable[str]) -> None:
        """Reject keys this section's owner does not know (typos stop start-up)."""
        allowed = set(known)
        for key in self.values:
            if key not in allowed:
                hint = ", ".join(sorted(allowed)) or "none"
                raise self.error(key, f"unknown key (known keys: {hint})")

    def __contains__(self, key: str) -> bool:
        return key in self.values

    def get_str(self, key: str, default: str | None = None) -> str | None:
        value = self.values.get(key, default)
        if value is None:
            return None
        if not isinstance(value, str):
            raise self.error(key, f"expected a string, got {value!r}")
        return value.strip()

    def get_int(
        self, key: str, default: int, *, min: int | None = None, max: int | None = None
    ) -> int:
        value = self.values.get(key, default)
        if isinstance(value, bool):
            raise self.error(key, f"expected a whole number, got {value!r}")
        if isinstance(value, str):
            try:
                value = int(value.strip().replace("_", ""))
            except ValueError:
                raise self.error(key, f"expected a whole number, got {value!r}") from None
        if not isinstance(value, int):
            raise self.error(key, f"expected a whole number, got {value!r}")
        self._bounds(key, value, min, max)
        return value

    def get_float(
        self, key: str, default: float, *, min: float | None = None, max: float | None = None
    ) -> float:
        value = self.values.get(key, default)
        if isinstance(value, bool):
            raise self.error(key, f"expected a number, got {value!r}")
        if isinstance(value, str):
            try:
                value = float(value.strip())
            except ValueError:
                raise self.error(key, f"expected a number, got {value!r}") from None
        if not isinstance(value, (int, float)):
            raise self.error(key, f"expected a number, got {value!r}")
        self._bounds(key, value, min, max)
        return float(value)

    def get_bool(self, key: str, default: bool) -> bool:
        """``true`` or ``false`` (any case), or a TOML boolean; nothing else.

        ``yes``/``on``/``1`` are refused rather than guessed at: ``enabled = 0``
        read as true, or ``on`` read as false, would be a silent misconfiguration.
        """
        value = self.values.get(key, default)
        if isinstance(value, bool):
            return value
        if isinstance(value, str):
            lowered = value.strip().lower()
            if lowered == "true":
                return True
            if lowered == "false":
                return False
        raise self.error(key, f"expected true or false, got {value!r}")

    def get_list(self, key: str, default: Iterable[str] = ()) -> tuple[str, ...]:
        """A list: comma- or newline-separated in ini files, an array in TOML."""
        value = self.values.get(key)
        if value is None:
            return tuple(default)
        if isinstance(value, str):
            items = [item.strip() for line in value.splitlines() for item in line.split(",")]
            return tuple(item for item in items if item)
        if isinstance(value, list) and all(isinstance(item, str) for item in value):
            return tuple(item.strip() for item in value)
        raise self.error(key, f"expected a list of names, got {value!r}")

    def get_url(self, key: str, *, schemes: Sequence[str]) -> str | None:
        """The URL at ``key`` (None when unset or blank), checked to have one of ``schemes``.

        A plugin names the schemes its client speaks (``("postgresql",
        "postgres")``); a URL with another scheme, or a port that is no
        number, is an error naming ``key`` that shows the URL without its
        password.
        """
        url = self.get_str(key)
        return self._check_url(key, url, schemes) if url else None

    def check_postgres_url(self, key: str, url: str) -> str:
        """Deprecated: ``get_url(key, schemes=("postgresql", "postgres"))``.

        Kept for one release for plugins outside this repository.
        """
        warnings.warn(
            "Section.check_postgres_url is deprecated; use "
            'Section.get_url(key, schemes=("postgresql", "postgres"))',
            DeprecationWarning,
            stacklevel=2,
        )
        return self._check_url(key, url, ("postgresql", "postgres"))

    def _check_url(self, key: str, url: str, schemes: Sequence[str]) -> str:
        scheme = url.partition("://")[0].lower() if "://" in url else ""
        if scheme not in schemes:
            wanted = " or ".join(f"{name}://" for name in schemes)
            raise self.error(key, f"expected a {wanted} URL, got {redact_url(url)!r}")
        try:
            urllib.parse.urlsplit(url).port  # noqa: B018 - a bad port raises here, not later
        except ValueError as exc:
            raise self.error(key, f"{redact_url(url)}: {exc}") from None
        return url

    def _bounds(self, key: str, value: float, lo: float | None, hi: float | None) -> None:
        if lo is not None and value < lo:
            raise self.error(key, f"must be at least {lo}, got {value}")
        if hi is not None and value > hi:
            raise self.error(key, f"must be at most {hi}, got {value}")


@attrs.frozen
class Listen:
    host: str
    port: int


@attrs.define
class Config:
    """The loaded configuration: core settings plus every plugin's raw section.

    ``source`` is the file it came from (or a description of where);
    ``base_dir`` resolves relative paths such as ``catalog``.
    """

    source: str
    base_dir: Path
    core: Section
    sections: dict[str, Section] = attrs.field(factory=dict)
    catalog_path: Path | None = None
    listen: Listen = Listen("127.0.0.1", 8400)
    disable: tuple[str, ...] = ()
    required_plugins: tuple[str, ...] = ()
    max_body_bytes: int = 16 * 1024 * 1024
    shutdown_grace_s: float = 30.0
    attempt_timeout_ms: int = 60_000
    log_level: str = "INFO"
    #: ``text`` (default) or ``json`` (one object per line).
    log_format: str = "text"
    #: Extra billing/credential markers (lower-cased), added to the built-in narrow list.
    permanent_markers: tuple[str, ...] = ()
    #: Retries of one binding after its first try (models may override).
    retries: int = 2
    backoff_base_ms: int = 250
    backoff_cap_ms: int = 8000
    #: One time budget for every try of every binding of a call (models may override).
    call_budget_ms: int = 120_000
    #: True, False or ``"caller"``: only for calls that send ``x-prism-fallback: allow``.
    cross_tier_fallback: bool | Literal["caller"] = False
    #: The admin API's bearer token, read from the variable ``admin_token_env`` names.
    admin_token: str | None = attrs.field(default=None, repr=False)
    #: The variable ``[prism] admin_token_env`` names (None: not configured).
    admin_token_env: str | None = None
    #: A request's line and headers must arrive within this; a body may pause no longer.
    header_timeout_s: float = 10.0
    #: An idle keep-alive connection is closed after this.
    keepalive_timeout_s: float = 75.0
    #: Connections accepted at once; None: 45% of the open-file soft limit.
    max_connections: int | None = None
    #: Connections the kernel queues before the server accepts them (the kernel caps
    #: it at ``net.core.somaxconn``).
    backlog: int = DEFAULT_BACKLOG
    #: ``prism serve`` processes on the port (``auto``: one per CPU).
    workers: int = 1
    #: The catalog document, when the caller supplies it instead of a file.
    catalog_data: dict[str, Any] | None = None

    @property
    def state_dir(self) -> Path:
        """Where a plugin keeps a state file whose place the operator left to it.

        ``$STATE_DIRECTORY`` (its first entry) when set: systemd hands a unit's
        ``StateDirectory=`` over in it while the unit's sandbox leaves the
        configuration's directory read-only (contrib/deploy).  Otherwise the
        configuration file's directory.
        """
        named = os.environ.get("STATE_DIRECTORY", "").split(":")[0]
        return Path(named) if named else self.base_dir

    def section(self, plugin_name: str) -> Section:
        """The plugin's own section (empty, and not ``written``, if the operator wrote none)."""
        found = self.sections.get(plugin_name)
        if found is None:
            found = Section(self.source, f"prism:{plugin_name}")
            self.sections[plugin_name] = found
        return found


#: The configuration file to use when no ``--config`` is given, before any search.
CONFIG_ENV = "PRISM_CONFIG"


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


def load_config(path: Path | str | None = None, *, start: Path | None = None) -> Config:
    """Read the configuration from ``path``, or find it from ``start`` upwards."""
    if path is None and os.environ.get(CONFIG_ENV):
        # Where no --config can be added (`docker compose exec gateway1 prism keys
        # create`, the image's commands), the environment names the file.
        path = os.environ[CONFIG_ENV]
        if not Path(path).is_file():
            raise ConfigError(path, CONFIG_ENV, "file not found")
    if path is None:
        found = find_config(start)
        if found is None:
            raise ConfigError(
                str(start or Path.cwd()),
                "[prism]",
                "no configuration found (looked for prism.ini, [prism] in setup.cfg, "
                f"[tool.prism] in pyproject.toml); pass --config PATH or set {CONFIG_ENV}",
            )
        path = found
    path = Path(path)
    source = str(path)
    if not path.is_file():
        raise ConfigError(source, "--config", "file not found")
    if path.suffix == ".toml":
        core, plugin_sections = _read_pyproject(path)
    else:
        core, plugin_sections = _read_ini(path)
    return config_from_mapping(core, plugin_sections, source=source, base_dir=path.parent)


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


def config_from_mapping(
    core_values: Mapping[str, Any],
    plugin_values: Mapping[str, Mapping[str, Any]] | None = None,
    *,
    source: str = "<config>",
    base_dir: Path | None = None,
    catalog_data: dict[str, Any] | None = None,
) -> Config:
    """Build a Config from plain mappings (what files hold, or what tests write)."""
    core = Section(source, "prism", dict(core_values))
    core.check_keys(CORE_KEYS)
    base = base_dir or Path.cwd()
    config = Config(
        source=source,
        base_dir=base,
        core=core,
        sections={
            name: Section(source, f"prism:{name}", dict(values), written=True)
            for name, values in (plugin_values or {}).items()
        },
        catalog_data=catalog_data,
    )
    catalog = core.get_str("catalog")
    if catalog is None and catalog_data is None:
        raise core.error("catalog", "missing: name the model catalog TOML file")
    if catalog is not None:
        config.catalog_path = (base / catalog).resolve()
    config.listen = parse_listen(core, core.get_str("listen", "127.0.0.1:8400") or "")
    config.disable = core.get_list("disable")
    config.required_plugins = core.get_list("required_plugins")
    config.max_body_bytes = core.get_int("max_body_bytes", config.max_body_bytes, min=1024)
    config.shutdown_grace_s = core.get_float("shutdown_grace_s", config.shutdown_grace_s, min=0)
    config.attempt_timeout_ms = core.get_int(
        "attempt_timeout_ms", config.attempt_timeout_ms, min=1000
    )
    level = (core.get_str("log_level", "INFO") or "INFO").upper()
    if level not in {"DEBUG", "INFO", "WARNING", "ERROR"}:
        raise core.error("log_level", f"expected DEBUG, INFO, WARNING or ERROR, got {level!r}")
    config.log_level = level
    log_format = (core.get_str("log_format", "text") or "text").lower()
    if log_format not in ("text", "json"):
        raise core.error("log_format", f"expected text or json, got {log_format!r}")
    config.log_format = log_format
    markers = core.get_list("permanent_markers")
    for marker in markers:
        if marker.lower() == "quota":
            raise core.error(
                "permanent_markers",
                "the bare word 'quota' would make per-minute rate limits permanent; "
                "use a phrase that means money, e.g. 'exceeded your current quota'",
            )
    config.permanent_markers = tuple(marker.lower() for marker in markers)
    config.retries = core.get_int("retries", config.retries, min=0, max=10)
    config.backoff_base_ms = core.get_int("backoff_base_ms", config.backoff_base_ms, min=1)
    config.backoff_cap_ms = core.get_int(
        "backoff_cap_ms", config.backoff_cap_ms, min=config.backoff_base_ms
    )
    config.call_budget_ms = core.get_int("call_budget_ms", config.call_budget_ms, min=1000)
    config.cross_tier_fallback = _cross_tier_fallback(core)
    config.header_timeout_s = core.get_float(
        "header_timeout_s", config.header_timeout_s, min=0.1, max=3600
    )
    config.keepalive_timeout_s = core.get_float(
        "keepalive_timeout_s", config.keepalive_timeout_s, min=0.1, max=86400
    )
    if "max_connections" in core:
        config.max_connections = core.get_int("max_connections", 0, min=1)
    config.backlog = core.get_int("backlog", config.backlog, min=1, max=65535)
    if "workers" in core:
        try:
            config.workers = worker_count(core.values["workers"])
        except ValueError as exc:
            raise core.error("workers", str(exc)) from None
    token_env = core.get_str("admin_token_env")
    if token_env:
        # An unset variable is no error here: `prism serve` warns that the
        # admin API stays off (see admin_token_unset), other commands stay quiet.
        config.admin_token_env = token_env
        config.admin_token = os.environ.get(token_env) or None
    return config


def _cross_tier_fallback(core: Section) -> bool | Literal["caller"]:
    value = core.values.get("cross_tier_fallback", False)
    if isinstance(value, bool):
        return value
    text = value.strip().lower() if isinstance(value, str) else None
    if text == "caller":
        return "caller"
    if text in ("true", "false"):
        return text == "true"
    raise core.error("cross_tier_fallback", f"expected true, false or caller, got {value!r}")


def admin_token_unset(config: Config) -> str | None:
    """The warning for an ``admin_token_env`` that names an unset variable, or None."""
    if config.admin_token_env is None or config.admin_token is not None:
        return None
    return (
        f"{config.source}: [prism] admin_token_env: {config.admin_token_env} is not set; "
        "the admin API stays off"
    )


def worker_count(value: Any) -> int:
    """``N``, or ``auto`` for the number of CPUs; raises ValueError for anything else."""
    if isinstance(value, int) and not isinstance(value, bool):
        count = value
    else:
        text = str(value).strip().lower()
        if text == "auto":
            return os.cpu_count() or 1
        try:
            count = int(text)
        except ValueError:
            raise ValueError(f"expected a number of workers or auto, got {value!r}") from None
    if count < 1:
        raise ValueError(f"expected at least 1 worker, got {count}")
    return count


def parse_listen(section: Section, value: str) -> Listen:
    try:
        return listen_address(value)
    except ValueError as exc:
        raise section.error("listen", str(exc)) from None


def listen_address(value: str) -> Listen:
    """``HOST:PORT`` (``[::1]:PORT`` for IPv6), or ValueError saying what is wrong."""
    host, sep, port_text = value.rpartition(":")
    if not sep or not host:
        raise ValueError(f"expected HOST:PORT, got {value!r}")
    host = host.strip("[]")
    try:
        port = int(port_text)
    except ValueError:
        raise ValueError(f"port must be a number, got {port_text!r}") from None
    if not 0 <= port <= 65535:
        raise ValueError(f"port out of range: {port}")
    return Listen(host, port)
