"""The ``[prism:keys]`` section."""

from __future__ import annotations

from pathlib import Path

import attrs

from prism_proxy import Config, ConfigError, redact_url

__all__ = ["SECTION", "KeysSettings", "require_settings"]

SECTION = "keys"
DEFAULT_REFRESH_S = 5.0
#: The URL schemes asyncpg connects with.
POSTGRES_SCHEMES = ("postgresql", "postgres")


@attrs.frozen
class KeysSettings:
    """Where the keys live (a SQLite ``db_path`` or a PostgreSQL ``db_url``) and how
    often gateways re-read them."""

    db_path: Path | None
    refresh_s: float
    #: A ``postgresql://`` URL: keys shared by every replica.  Never log it: see :attr:`name`.
    db_url: str | None = attrs.field(default=None, repr=False)

    @property
    def name(self) -> str:
        """The key database as it may be shown: the file, or the URL without its password."""
        if self.db_url is not None:
            return redact_url(self.db_url)
        return str(self.db_path)

    @property
    def ident(self) -> str:
        """What identifies the database (for keeping one ring per database); not for logs."""
        return self.db_url if self.db_url is not None else str(self.db_path)

    @classmethod
    def from_config(cls, config: Config) -> KeysSettings | None:
        """The settings, or None when the operator has not configured the plugin at all.

        A section (even an empty one) that names no database is a mistake, not
        "off": the operator clearly meant to turn authentication on.
        """
        section = config.section(SECTION)
        section.check_keys({"db_path", "db_url", "refresh_s"})
        db = section.get_str("db_path")
        url = section.get_url("db_url", schemes=POSTGRES_SCHEMES)
        refresh_s = section.get_float("refresh_s", DEFAULT_REFRESH_S, min=0.01, max=300)
        if url:
            if db:
                raise section.error(
                    "db_url",
                    "db_path is set too: name one key database, a SQLite file (db_path) "
                    "or a PostgreSQL database (db_url), not both",
                )
            return cls(db_path=None, refresh_s=refresh_s, db_url=url)
        if not db:
            if section.written:
                raise section.error(
                    "db_path",
                    "missing: name the key database (e.g. db_path = keys.db, or "
                    "db_url = postgresql://...); without it prism-keys authenticates nobody "
                    "and the gateway stays open",
                )
            return None
        path = (config.base_dir / Path(db).expanduser()).resolve()
        if not path.parent.is_dir():
            raise section.error("db_path", f"directory {path.parent} does not exist")
        return cls(db_path=path, refresh_s=refresh_s)


def require_settings(config: Config) -> KeysSettings:
    """For the CLI: the settings, or a configuration error saying what to add."""
    settings = KeysSettings.from_config(config)
    if settings is None:
        raise ConfigError(
            config.source,
            f"[prism:{SECTION}] db_path",
            "not set: add it to name the key database (e.g. db_path = keys.db), or set "
            "db_url = postgresql://... to share keys between replicas",
        )
    return settings
