"""The ``[prism:billing]`` section, described once on :class:`BillingSettings`."""

from __future__ import annotations

import os
import re
from pathlib import Path
from typing import Literal

import attrs

from prism_proxy import Config, Section, read_settings, redact_url, setting

__all__ = ["PLUGIN_NAME", "BillingSettings"]

PLUGIN_NAME = "billing"
#: The URL schemes asyncpg connects with.
POSTGRES_SCHEMES = ("postgresql", "postgres")
#: The spool's file in the state directory, unless ``spool_path`` says otherwise.
SPOOL_FILE = "prism-billing.spool"
#: ``spool_path`` value that turns the spool off.
SPOOL_OFF = "off"
_CURRENCY = re.compile(r"[A-Za-z][A-Za-z0-9_-]{0,15}")


def _postgres_url(section: Section, key: str, default: str | None) -> str | None:
    return section.get_url(key, schemes=POSTGRES_SCHEMES)


def _currency(section: Section, key: str, default: str) -> str:
    currency = section.get_str(key, default) or ""
    if not _CURRENCY.fullmatch(currency):
        raise section.error(key, f"expected a short code such as USD, got {currency!r}")
    return currency


@attrs.frozen
class BillingSettings:
    """What the operator configured; neither ``ledger_path`` nor ``ledger_url`` means off
    (only without a section: a section that names no ledger is an error)."""

    ledger_path: Path | None = setting(
        None,
        help="The SQLite ledger file; relative paths are relative to the configuration file's "
        "directory. Its directory must exist and be writable (checked at start-up).",
        default_text="unset (billing off)",
    )
    #: Never shown as it is: :attr:`ledger_name` hides the password.
    ledger_url: str | None = setting(
        None,
        help="A PostgreSQL ledger instead of a file: a `postgresql://` or `postgres://` URL "
        "(libpq form: user, password, host, port, database, `?sslmode=…`). Setting it and "
        "`ledger_path` both, or another scheme, stops start-up naming "
        "`[prism:billing] ledger_url`. The password is never shown: messages and logs print "
        "`postgresql://prism:***@…`.",
        parse=_postgres_url,
        type_text="`postgresql://` URL",
    )
    currency: str = setting(
        "USD",
        help="The currency the catalog's prices are in. A label only (reported by "
        "`/prism/usage`); Prism does no conversion.",
        parse=_currency,
        type_text="short code (`USD`)",
    )
    require_prices: bool = setting(
        True,
        help="With billing on, every chain line must have a `price`; a missing one stops "
        "start-up naming `models.<m>.chain[<i>].price`. Set `false` to serve unpriced lines "
        "anyway: they are billed 0 and their rows are flagged `unpriced`. The default refuses "
        "because a line silently served for free is a billing bug nobody notices until the "
        "invoice.",
    )
    #: SQLite ``PRAGMA synchronous`` in WAL mode (SQLite reads it in any case).
    synchronous: Literal["full", "normal"] = setting(
        "full",
        help="SQLite only. `PRAGMA synchronous` in WAL mode. `full` fsyncs the WAL on every "
        "commit, so a committed row survives a power cut, not only a process crash. `normal` "
        "survives a process crash (SIGKILL) but may lose the last commits on power loss; it is "
        "cheaper on slow disks.",
    )
    max_batch_rows: int = setting(
        1000,
        min=1,
        max=100_000,
        help="At most this many rows share one transaction (bounds one commit's latency under "
        "a burst).",
    )
    commit_delay_ms: float = setting(
        1.0,
        min=0.0,
        max=100.0,
        help="When more calls are in flight than rows are queued, a commit first waits up to "
        "this long for their rows, so that more calls share one fsync (PostgreSQL's "
        "`commit_delay`); it goes as soon as every call in flight has queued its row. A call "
        "alone never waits; `0` commits at once. Under load it trades up to this much latency "
        "for fewer commits per call: each commit costs a thread hand-off, SQLite's work and an "
        "fsync, several hundred µs of CPU on a small VM.",
    )
    #: Where rows wait while the PostgreSQL ledger is unreachable (None: no spool); the
    #: declaration reads the text, :meth:`from_config` makes it a path (``config.state_file``).
    spool_path: Path | None = setting(
        None,
        help="PostgreSQL only. The file where rows wait while the PostgreSQL ledger cannot be "
        "reached (see [below](#when-postgresql-is-unreachable-the-spool)); relative paths are "
        "relative to the configuration file's directory, which must exist (checked at "
        "start-up). `off`: no spool, calls are refused while PostgreSQL is away. A "
        "configuration built in memory (tests, an embedding app) has no spool unless this "
        "names one. Setting it with `ledger_path` stops start-up naming "
        "`[prism:billing] spool_path`.",
        type_text="text or `off`",
        default_text=f"`{SPOOL_FILE}` in `$STATE_DIRECTORY` (systemd's `StateDirectory=`) "
        "when set, else beside the configuration file",
    )
    spool_max_bytes: int = setting(
        256 * 1024 * 1024,
        min=65536,
        max=1 << 40,
        help="PostgreSQL only. The spool takes no more rows once its file is this large "
        "(256 MiB by default; a row is about 600 bytes): calls are then refused until it has "
        "been replayed.",
    )
    #: The configuration file, for error messages.
    source: str = "<config>"

    @property
    def enabled(self) -> bool:
        return self.ledger_path is not None or self.ledger_url is not None

    @property
    def ledger_name(self) -> str:
        """The ledger as it may be shown: the file, or the URL without its password."""
        if self.ledger_url is not None:
            return redact_url(self.ledger_url)
        return str(self.ledger_path)

    @property
    def ledger_key(self) -> str:
        """The setting that names the ledger, for error messages."""
        return f"[prism:{PLUGIN_NAME}] " + ("ledger_url" if self.ledger_url else "ledger_path")

    def check(self, section: Section) -> None:
        if self.ledger_url is not None and self.ledger_path is not None:
            raise section.error(
                "ledger_url",
                "ledger_path is set too: name one ledger, a SQLite file (ledger_path) "
                "or a PostgreSQL database (ledger_url), not both",
            )
        if self.ledger_url is None and "spool_path" in section:
            raise section.error(
                "spool_path",
                "the spool keeps rows for a PostgreSQL ledger while it is unreachable: "
                "set ledger_url, or remove spool_path",
            )
        if not self.enabled and section.written:
            # The operator meant to bill: a gateway that silently records nothing
            # is worse than one that does not start.
            raise section.error(
                "ledger_path",
                "not set (nor ledger_url): name the ledger (ledger_path = ledger.sqlite, or "
                "ledger_url = postgresql://...); without it prism-billing is off, records "
                "nothing and bills nobody (to leave billing off, remove the section)",
            )

    @classmethod
    def from_config(cls, config: Config, *, check_dir: bool = True) -> BillingSettings:
        section = config.section(PLUGIN_NAME)
        settings = read_settings(cls, section, source=config.source)
        if settings.ledger_url is not None:
            spool = config.state_file(
                section, "spool_path", default_name=SPOOL_FILE, off=SPOOL_OFF, check=check_dir
            )
            return attrs.evolve(settings, spool_path=spool)
        if settings.ledger_path is None:
            return settings
        path = settings.ledger_path.expanduser()
        if not path.is_absolute():
            path = config.base_dir / path
        if check_dir:
            directory = path.parent
            if not directory.is_dir():
                raise section.error("ledger_path", f"directory {directory} does not exist")
            if not os.access(directory, os.W_OK):
                raise section.error("ledger_path", f"directory {directory} is not writable")
            if path.exists() and not path.is_file():
                raise section.error("ledger_path", f"{path} is not a file")
        return attrs.evolve(settings, ledger_path=path)
