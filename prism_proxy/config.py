"""The configuration: ``[prism]``'s settings, declared once on :class:`Config`, and
every plugin's section with typed getters.

:func:`load_config` reads a file found the way pytest finds its own
(:mod:`.configfiles`); ``--config PATH`` skips the search, and so does the
environment variable ``PRISM_CONFIG`` when no ``--config`` is given.

Each plugin reads its own section: ``[prism:<name>]`` in ini files,
``[tool.prism.<name>]`` in ``pyproject.toml``.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from pathlib import Path
from typing import Any, Literal

import attrs

from .configfiles import CONFIG_ENV, find_config, read_sections
from .errors import ConfigError
from .settings import Section, read_settings, setting

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


@attrs.frozen
class Listen:
    host: str
    port: int


def _listen(section: Section, key: str, default: Listen) -> Listen:
    if key not in section:
        return default
    return parse_listen(section, section.get_str(key) or "")


def _log_level(section: Section, key: str, default: str) -> str:
    level = (section.get_str(key, default) or default).upper()
    if level not in {"DEBUG", "INFO", "WARNING", "ERROR"}:
        raise section.error(key, f"expected DEBUG, INFO, WARNING or ERROR, got {level!r}")
    return level


def _markers(section: Section, key: str, default: tuple[str, ...]) -> tuple[str, ...]:
    markers = section.get_list(key, default)
    for marker in markers:
        if marker.lower() == "quota":
            raise section.error(
                key,
                "the bare word 'quota' would make per-minute rate limits permanent; "
                "use a phrase that means money, e.g. 'exceeded your current quota'",
            )
    return tuple(marker.lower() for marker in markers)


def _cross_tier_fallback(
    section: Section, key: str, default: bool | Literal["caller"]
) -> bool | Literal["caller"]:
    value = section.values.get(key, default)
    if isinstance(value, bool):
        return value
    text = value.strip().lower() if isinstance(value, str) else None
    if text == "caller":
        return "caller"
    if text in ("true", "false"):
        return section.get_bool(key, default=False)
    raise section.error(key, f"expected true, false or caller, got {value!r}")


def _workers(section: Section, key: str, default: int) -> int:
    if key not in section:
        return default
    try:
        return worker_count(section.values[key])
    except ValueError as exc:
        raise section.error(key, str(exc)) from None


@attrs.define
class Config:
    """The loaded configuration: core settings plus every plugin's raw section.

    ``source`` is the file it came from (or a description of where);
    ``base_dir`` resolves relative paths such as ``catalog``.  The fields
    made with :func:`~prism_proxy.settings.setting` are the ``[prism]`` keys.
    """

    source: str
    base_dir: Path
    core: Section
    sections: dict[str, Section] = attrs.field(factory=dict)
    #: The catalog document, when the caller supplies it instead of a file.
    catalog_data: dict[str, Any] | None = None
    #: The variable ``admin_token_env`` names, read when the configuration is loaded.
    admin_token: str | None = attrs.field(default=None, repr=False)
    listen: Listen = setting(
        Listen("127.0.0.1", 8400),
        help="`HOST:PORT` to listen on (`[::1]:8400` for IPv6)",
        parse=_listen,
        type_text="`HOST:PORT`",
        default_text="`127.0.0.1:8400`",
    )
    catalog_path: Path | None = setting(
        None,
        key="catalog",
        help="the model catalog TOML file, relative to the config file",
        default_text="required",
    )
    disable: tuple[str, ...] = setting(
        (), help="plugin names to block before they load (comma or newline separated)"
    )
    required_plugins: tuple[str, ...] = setting(
        (), help="plugin names whose absence stops start-up"
    )
    max_body_bytes: int = setting(
        16 * 1024 * 1024,
        min=1024,
        help="largest request body; larger gets 413 `body_too_large`",
    )
    attempt_timeout_ms: int = setting(
        60_000,
        min=1000,
        help="per attempt: time to the first content (streams) or the whole body, kept to "
        "within a tenth of a second (attempts due in the same tenth share one timer); callers "
        "may change it per request with `x-prism-timeout-ms` "
        "([prism-timeout-header](plugins/prism-timeout-header/README.md))",
    )
    retries: int = setting(
        2,
        min=0,
        max=10,
        help="retries of one binding after its first try, for transient failures, rate limits "
        "and broken streams (a timeout is retried at most once)",
    )
    backoff_base_ms: int = setting(
        250,
        min=1,
        help="retry n waits a uniformly random time in `[0, min(cap, base·2ⁿ))` (full "
        "jitter), unless the upstream said `Retry-After` / `retry-after-ms`",
    )
    backoff_cap_ms: int = setting(
        8000, min=1, help="the cap of that wait; at least `backoff_base_ms`"
    )
    call_budget_ms: int = setting(
        120_000,
        min=1000,
        help="one budget for every try of every binding of a call; spent → 504 "
        "`chain_deadline_exceeded`",
    )
    cross_tier_fallback: bool | Literal["caller"] = setting(
        False,
        help="allow models to fall back to their `fallback_models` (another tier): `true`, "
        "`false`, or `caller` (only for calls that send `x-prism-fallback: allow`); anything "
        "else stops start-up naming all three",
        parse=_cross_tier_fallback,
        type_text="`true`, `false` or `caller`",
    )
    shutdown_grace_s: float = setting(
        30.0,
        min=0,
        help="on SIGTERM, how long in-flight calls (streams included) may finish; then their "
        "connections are closed and they settle as aborted, so a drain never outlasts it. "
        "From the signal on, `/readyz` says 503 and the gateway calls itself no more "
        "(prism-probes sends no probes)",
    )
    permanent_markers: tuple[str, ...] = setting(
        (),
        help='extra body phrases that mean "out of money / bad credentials" (not the bare '
        "word `quota`, which would make per-minute rate limits permanent)",
        parse=_markers,
        type_text="list",
    )
    log_level: str = setting(
        "INFO",
        help="how much the gateway logs",
        parse=_log_level,
        type_text="`DEBUG`, `INFO`, `WARNING` or `ERROR`",
    )
    log_format: Literal["text", "json"] = setting(
        "text",
        help="`json`: one JSON object per line (`ts`, `level`, `logger`, `message`); the "
        "access line (logger `prism.calls`) carries `request_id`, `endpoint`, `model`, "
        "`route`, `provider`, `upstream_model`, `region`, `org`, `key_id`, `status`, "
        "`outcome`, `code`, `attempts`, `ttft_ms`, `finish_reason`, `duration_ms`, "
        "`input_tokens`, `output_tokens` and what plugins add (`cost`); never prompt text, "
        "keys or upstream bodies, and JSON escaping keeps every value on its line",
    )
    admin_token_env: str | None = setting(
        None,
        help="the environment variable holding the admin API's bearer token (plugins' admin "
        "routes: `/prism/usage`, `/prism/breaker/...`); without it those routes answer 403 "
        "`admin_disabled` (`prism serve` warns when the variable is not set)",
    )
    header_timeout_s: float = setting(
        10.0,
        min=0.1,
        max=3600,
        help="a connection must deliver each request's line and headers within this (from "
        "its start, or from the first byte of a later request); a request body may pause no "
        "longer between reads (then 408 `request_timeout` and the connection closes)",
    )
    keepalive_timeout_s: float = setting(
        75.0, min=0.1, max=86400, help="an idle keep-alive connection is closed after this"
    )
    workers: int = setting(
        1,
        help="`prism serve` processes on the port (`auto`: one per CPU; `--workers N` "
        "overrides): the supervisor holds the port and hands it to every worker, restarts a "
        "worker that dies (backoff 1 s doubling to 30 s) and drains them all on SIGTERM (each "
        "gets `shutdown_grace_s`, then 10 s to clean up before it is killed; the supervisor "
        "exits 1, saying which, when a worker was killed or exited non-zero); SIGHUP reloads "
        "every worker. Plugins whose state cannot be split refuse it at start-up: "
        "prism-breaker does unless prism-redis shares its state. `max_concurrency` counts "
        "per worker, or for the fleet with prism-redis",
        parse=_workers,
        type_text="whole number or `auto`",
    )
    max_connections: int | None = setting(
        None,
        min=1,
        help="connections open at once; at it, a new connection takes the place of one still "
        "waiting for its request head (see *Hostile clients*), else it gets 503 "
        "`too_many_connections` and is closed at once, so the rest keep being served (the "
        "limit in force is logged at start-up). Each caller's call in flight also holds an "
        "upstream connection, so the default leaves the other half of the files for those: "
        "the gateway never runs out of files and blames an upstream for it (and if other "
        "file use exhausts them, the attempt is `cancelled` with `gateway_out_of_resources`, "
        "never held against the upstream)",
        default_text="45% of the open-file soft limit",
    )
    backlog: int = setting(
        DEFAULT_BACKLOG,
        min=1,
        max=65535,
        help="connections the kernel queues for the gateway before it accepts them (a burst "
        "of new callers waits there instead of being refused); the kernel caps it at "
        "`net.core.somaxconn`",
    )
    services: tuple[str, ...] = setting(
        (),
        help="`SERVICE:PLUGIN` pairs choosing the provider of a service two loaded plugins "
        "offer (`capacity:redis`); see *Services* in the [plugin guide](docs/plugin-guide.md)",
    )

    def check(self, section: Section) -> None:
        if self.backoff_cap_ms < self.backoff_base_ms:
            raise section.error(
                "backoff_cap_ms",
                f"must be at least {self.backoff_base_ms}, got {self.backoff_cap_ms}",
            )

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

    def state_file(
        self, section: Section, key: str, *, default_name: str, off: str, check: bool = True
    ) -> Path | None:
        """A plugin's state file: the path at ``key`` (relative to the configuration's
        directory), else ``default_name`` in :attr:`state_dir`; None for ``off``.

        A configuration built in memory (tests, embedding apps) has no file to
        sit beside, so without ``key`` it keeps no file either: that also keeps
        separate apps in one process from sharing one by accident.  ``check``
        refuses a directory, a missing directory and one not writable, naming
        ``key``.
        """
        raw = section.get_str(key)
        if raw is None:
            if not Path(self.source).is_file():
                return None
            raw = str(self.state_dir / default_name)
        if not raw:
            raise section.error(key, f"must not be empty (use {off} for no file)")
        if raw == off:
            return None
        path = Path(raw).expanduser()
        if not path.is_absolute():
            path = self.base_dir / path
        if check:
            if path.is_dir():
                raise section.error(key, f"{path} is a directory, expected a file")
            if not path.parent.is_dir():
                raise section.error(key, f"directory {path.parent} does not exist")
            if not os.access(path.parent, os.W_OK):
                raise section.error(key, f"directory {path.parent} is not writable")
        return path.resolve()

    def section(self, plugin_name: str) -> Section:
        """The plugin's own section (empty, and not ``written``, if the operator wrote none)."""
        found = self.sections.get(plugin_name)
        if found is None:
            found = Section(self.source, f"prism:{plugin_name}")
            self.sections[plugin_name] = found
        return found


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
    core, plugin_sections = read_sections(path)
    return config_from_mapping(core, plugin_sections, source=source, base_dir=path.parent)


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
    base = base_dir or Path.cwd()
    config = read_settings(
        Config,
        core,
        source=source,
        base_dir=base,
        core=core,
        sections={
            name: Section(source, f"prism:{name}", dict(values), written=True)
            for name, values in (plugin_values or {}).items()
        },
        catalog_data=catalog_data,
    )
    if config.catalog_path is None and catalog_data is None:
        raise core.error("catalog", "missing: name the model catalog TOML file")
    if config.catalog_path is not None:
        config.catalog_path = (base / config.catalog_path).resolve()
    if config.admin_token_env:
        # An unset variable is no error here: `prism serve` warns that the
        # admin API stays off (see admin_token_unset), other commands stay quiet.
        config.admin_token = os.environ.get(config.admin_token_env) or None
    return config


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
