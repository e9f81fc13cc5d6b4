"""The ``[prism:keys]`` section."""

from __future__ import annotations

from pathlib import Path

import attrs

from prism_proxy import Config, ConfigError

__all__ = ["SECTION", "KeysSettings", "require_settings"]

SECTION = "keys"
DEFAULT_REFRESH_S = 5.0


@attrs.frozen
class KeysSettings:
    """``db_path`` (relative to the config file) and how often gateways re-read it."""

    db_path: Path
    refresh_s: float

    @classmethod
    def from_config(cls, config: Config) -> KeysSettings | None:
        """The settings, or None when the operator has not configured the plugin at all.

        A section that sets anything but lacks ``db_path`` is a mistake, not
        "off": the operator clearly meant to turn authentication on.
        """
        section = config.section(SECTION)
        section.check_keys({"db_path", "refresh_s"})
        db = section.get_str("db_path")
        if not db:
            if section.values:
                raise section.error(
                    "db_path",
                    "missing: name the key database (e.g. db_path = keys.db); without it "
                    "prism-keys authenticates nobody and the gateway stays open",
                )
            return None
        path = (config.base_dir / Path(db).expanduser()).resolve()
        if not path.parent.is_dir():
            raise section.error("db_path", f"directory {path.parent} does not exist")
        refresh_s = section.get_float("refresh_s", DEFAULT_REFRESH_S, min=0.01, max=300)
        return cls(db_path=path, refresh_s=refresh_s)


def require_settings(config: Config) -> KeysSettings:
    """For the CLI: the settings, or a configuration error saying what to add."""
    settings = KeysSettings.from_config(config)
    if settings is None:
        raise ConfigError(
            config.source,
            f"[prism:{SECTION}] db_path",
            "not set: add it to name the key database (e.g. db_path = keys.db)",
        )
    return settings
