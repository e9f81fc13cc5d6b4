"""The ``[prism:keys]`` section."""

from __future__ import annotations

import urllib.parse
from pathlib import Path

import attrs

from prism_proxy import Config, ConfigError, Section

__all__ = ["SECTION", "KeysSettings", "redact_url", "require_settings"]

SECTION = "keys"
DEFAULT_REFRESH_S = 5.0
_PG_SCHEMES = ("postgresql", "postgres")


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

        A section that sets anything but names no database is a mistake, not
        "off": the operator clearly meant to turn authentication on.
        """
        section = config.section(SECTION)
        section.check_keys({"db_path", "db_url", "refresh_s"})
        db = section.get_str("db_path")
        url = section.get_str("db_url")
        refresh_s = section.get_float("refresh_s", DEFAULT_REFRESH_S, min=0.01, max=300)
        if url:
            if db:
                raise section.error(
                    "db_url",
                    "db_path is set too: name one key database, a SQLite file (db_path) "
                    "or a PostgreSQL database (db_url), not both",
                )
            return cls(db_path=None, refresh_s=refresh_s, db_url=_check_url(section, url))
        if not db:
            if section.values:
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


def _check_url(section: Section, url: str) -> str:
    """A ``postgresql://`` (or ``postgres://``) URL, or a ConfigError naming ``db_url``."""
    scheme = url.partition("://")[0].lower() if "://" in url else ""
    if scheme not in _PG_SCHEMES:
        raise section.error(
            "db_url", f"expected a postgresql:// or postgres:// URL, got {redact_url(url)!r}"
        )
    try:
        parts = urllib.parse.urlsplit(url)
        parts.port  # noqa: B018 - a bad port raises here, not at the first connection
    except ValueError as exc:
        raise section.error("db_url", f"{redact_url(url)}: {exc}") from None
    return url


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
