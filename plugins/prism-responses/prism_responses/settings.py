"""``[prism:responses]``: where Responses API answers are kept, and for how long."""

from __future__ import annotations

from pathlib import Path
from typing import Literal

import attrs

from prism_proxy import Config, Section, read_settings, redact_url, setting

__all__ = ["ENGINES", "SECTION", "ResponsesSettings"]

SECTION = "responses"
ENGINES = ("memory", "sqlite", "postgres", "redis")
#: The URL schemes asyncpg connects with.
POSTGRES_SCHEMES = ("postgresql", "postgres")

Engine = Literal["memory", "sqlite", "postgres", "redis"]


def _engine(section: Section, key: str, default: str) -> str:
    value = (section.get_str(key, default) or default).strip().lower()
    if value not in ENGINES:
        raise section.error(key, f"expected memory, sqlite, postgres or redis, got {value[:32]!r}")
    return value


def _postgres_url(section: Section, key: str, default: str | None) -> str | None:
    return section.get_url(key, schemes=POSTGRES_SCHEMES)


@attrs.frozen
class ResponsesSettings:
    """The store's engine, where it is, and its bounds."""

    store: Engine = setting(
        "memory",
        help="what keeps responses: `memory` (this process only, as without the plugin, "
        "with the bounds below), `sqlite` (the file `path`), `postgres` (the database `url`, "
        "shared by replicas) or `redis` (through prism-redis's link, shared by replicas)",
        parse=_engine,
        type_text="`memory`, `sqlite`, `postgres` or `redis`",
    )
    path: Path | None = setting(
        None,
        help="`store = sqlite`: the SQLite file, relative to the configuration file's "
        "directory (its directory must exist; the file and table are created)",
    )
    url: str | None = setting(
        None,
        help="`store = postgres`: a `postgresql://` URL (the table is created); its password "
        "is never shown",
        parse=_postgres_url,
        type_text="`postgresql://` URL",
    )
    ttl_s: float = setting(
        3600.0,
        min=1.0,
        max=90 * 86400.0,
        help="seconds a response is kept after it was served; then it is as if it never was",
    )
    max_items: int = setting(
        10_000,
        min=1,
        help="`store = memory`: the most responses kept (the least recently used go first)",
    )
    max_bytes: int = setting(
        64 * 1024 * 1024,
        min=1024,
        help="`store = memory`: the most bytes of responses kept (their JSON); one larger "
        "than this is not kept",
    )

    def __repr__(self) -> str:
        where = redact_url(self.url) if self.url else self.path
        return f"ResponsesSettings(store={self.store!r}, where={where!r}, ttl_s={self.ttl_s!r})"

    @classmethod
    def from_config(cls, config: Config) -> ResponsesSettings:
        section = config.section(SECTION)
        settings = read_settings(cls, section)
        if settings.store == "sqlite":
            if settings.path is None:
                raise section.error("path", "missing: store = sqlite needs the file (path = ...)")
            path = (config.base_dir / settings.path.expanduser()).resolve()
            if not path.parent.is_dir():
                raise section.error("path", f"directory {path.parent} does not exist")
            settings = attrs.evolve(settings, path=path)
        elif settings.path is not None:
            raise section.error("path", f"only store = sqlite reads it (store = {settings.store})")
        if settings.store == "postgres" and settings.url is None:
            raise section.error("url", "missing: store = postgres needs url = postgresql://...")
        if settings.store != "postgres" and settings.url is not None:
            raise section.error("url", f"only store = postgres reads it (store = {settings.store})")
        return settings
