"""The ``[prism:keys]`` section, described once on :class:`KeysSettings`."""

from __future__ import annotations

from pathlib import Path

import attrs

from prism_proxy import Config, ConfigError, Section, read_settings, redact_url, setting

__all__ = ["SECTION", "KeysSettings", "require_settings"]

SECTION = "keys"
#: The URL schemes asyncpg connects with.
POSTGRES_SCHEMES = ("postgresql", "postgres")


def _postgres_url(section: Section, key: str, default: str | None) -> str | None:
    return section.get_url(key, schemes=POSTGRES_SCHEMES)


@attrs.frozen
class KeysSettings:
    """Where the keys live (a SQLite ``db_path`` or a PostgreSQL ``db_url``) and how
    often gateways re-read them."""

    db_path: Path | None = setting(
        None,
        help="SQLite file holding organisations and keys, relative to the config file's "
        "directory. Its directory must exist; the file and tables are created when missing. "
        "**Setting it is what turns authentication on.**",
    )
    #: A ``postgresql://`` URL: keys shared by every replica.  Never log it: see :attr:`name`.
    db_url: str | None = setting(
        None,
        help="Instead of `db_path`: a `postgresql://` (or `postgres://`) URL. Keys, "
        "organisations and their settings then live in PostgreSQL, shared by every replica "
        "(see [PostgreSQL](#postgresql-shared-by-every-replica)). Setting both `db_path` and "
        "`db_url` is a configuration error; so is any other scheme, or a bad port.",
        parse=_postgres_url,
        type_text="`postgresql://` URL",
    )
    refresh_s: float = setting(
        5.0,
        min=0.01,
        max=300,
        help="Seconds between checks for changes. A revocation, tag or setting change made "
        "with `prism keys` takes effect on every running gateway within this interval. Each "
        "check reads one row (a revision number) and reloads only when it moved, so 5 s costs "
        "next to nothing while keeping a leaked key usable for at most a few seconds after "
        "revocation.",
    )

    def __repr__(self) -> str:
        # attrs leaves a class's own __repr__ alone: this one shows db_url without its password.
        return f"KeysSettings(name={self.name!r}, refresh_s={self.refresh_s!r})"

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

    def check(self, section: Section) -> None:
        # A section (even an empty one) that names no database is a mistake, not
        # "off": the operator clearly meant to turn authentication on.
        if self.db_url is not None and self.db_path is not None:
            raise section.error(
                "db_url",
                "db_path is set too: name one key database, a SQLite file (db_path) "
                "or a PostgreSQL database (db_url), not both",
            )
        if self.db_url is None and self.db_path is None and section.written:
            raise section.error(
                "db_path",
                "missing: name the key database (e.g. db_path = keys.db, or "
                "db_url = postgresql://...); without it prism-keys authenticates nobody "
                "and the gateway stays open",
            )

    @classmethod
    def from_config(cls, config: Config) -> KeysSettings | None:
        """The settings, or None when the operator has not configured the plugin at all."""
        section = config.section(SECTION)
        settings = read_settings(cls, section)
        if settings.db_path is None:
            return settings if settings.db_url is not None else None
        path = (config.base_dir / settings.db_path.expanduser()).resolve()
        if not path.parent.is_dir():
            raise section.error("db_path", f"directory {path.parent} does not exist")
        return attrs.evolve(settings, db_path=path)


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
