"""The ``[prism:billing]`` section."""

from __future__ import annotations

import os
import re
from pathlib import Path

import attrs

from prism_proxy import Config, Section, redact_url

__all__ = ["PLUGIN_NAME", "BillingSettings"]

PLUGIN_NAME = "billing"
#: The URL schemes asyncpg connects with.
POSTGRES_SCHEMES = ("postgresql", "postgres")
_KEYS = (
    "ledger_path",
    "ledger_url",
    "currency",
    "require_prices",
    "synchronous",
    "max_batch_rows",
    "commit_delay_ms",
    "spool_path",
    "spool_max_bytes",
)
#: The spool's file beside the configuration file, unless ``spool_path`` says otherwise.
_DEFAULT_SPOOL = "prism-billing.spool"
#: ``spool_path`` value that turns the spool off.
SPOOL_OFF = "off"
_CURRENCY = re.compile(r"[A-Za-z][A-Za-z0-9_-]{0,15}")


@attrs.frozen
class BillingSettings:
    """What the operator configured; neither ``ledger_path`` nor ``ledger_url`` means off
    (only without a section: a section that names no ledger is an error)."""

    ledger_path: Path | None
    #: A ``postgresql://`` URL: the ledger lives in PostgreSQL instead of a SQLite file.
    ledger_url: str | None = None
    #: The configuration file, for error messages.
    source: str = "<config>"
    currency: str = "USD"
    require_prices: bool = True
    #: SQLite ``PRAGMA synchronous`` in WAL mode: FULL fsyncs every commit.
    synchronous: str = "FULL"
    max_batch_rows: int = 1000
    #: With other calls in flight, how long a commit waits for their rows to share it.
    commit_delay_ms: float = 1.0
    #: Where rows wait while the PostgreSQL ledger is unreachable (None: no spool).
    spool_path: Path | None = None
    #: The spool takes no more rows once its file is this large.
    spool_max_bytes: int = 256 * 1024 * 1024

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

    @classmethod
    def from_config(cls, config: Config, *, check_dir: bool = True) -> BillingSettings:
        section = config.section(PLUGIN_NAME)
        section.check_keys(_KEYS)
        currency = section.get_str("currency", "USD") or ""
        if not _CURRENCY.fullmatch(currency):
            raise section.error("currency", f"expected a short code such as USD, got {currency!r}")
        synchronous = (section.get_str("synchronous", "full") or "").upper()
        if synchronous not in ("FULL", "NORMAL"):
            raise section.error("synchronous", f"expected full or normal, got {synchronous!r}")
        settings = cls(
            ledger_path=None,
            source=config.source,
            currency=currency,
            require_prices=section.get_bool("require_prices", True),
            synchronous=synchronous,
            max_batch_rows=section.get_int("max_batch_rows", 1000, min=1, max=100_000),
            commit_delay_ms=section.get_float("commit_delay_ms", 1.0, min=0.0, max=100.0),
            spool_max_bytes=section.get_int(
                "spool_max_bytes", 256 * 1024 * 1024, min=65536, max=1 << 40
            ),
        )
        raw = section.get_str("ledger_path")
        url = section.get_url("ledger_url", schemes=POSTGRES_SCHEMES)
        if url:
            if raw:
                raise section.error(
                    "ledger_url",
                    "ledger_path is set too: name one ledger, a SQLite file (ledger_path) "
                    "or a PostgreSQL database (ledger_url), not both",
                )
            spool = _spool_path(config, section, check_dir=check_dir)
            return attrs.evolve(settings, ledger_url=url, spool_path=spool)
        if "spool_path" in section:
            raise section.error(
                "spool_path",
                "the spool keeps rows for a PostgreSQL ledger while it is unreachable: "
                "set ledger_url, or remove spool_path",
            )
        if not raw:
            if section.written:
                # The operator meant to bill: a gateway that silently records nothing
                # is worse than one that does not start.
                raise section.error(
                    "ledger_path",
                    "not set (nor ledger_url): name the ledger (ledger_path = ledger.sqlite, or "
                    "ledger_url = postgresql://...); without it prism-billing is off, records "
                    "nothing and bills nobody (to leave billing off, remove the section)",
                )
            return settings
        path = Path(raw).expanduser()
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


def _spool_path(config: Config, section: Section, *, check_dir: bool) -> Path | None:
    """Where the PostgreSQL ledger's spool lives.

    Default: ``prism-billing.spool`` in ``config.state_dir`` (systemd's
    ``$STATE_DIRECTORY``, else beside the configuration file), as the breaker
    keeps its state.  A configuration built in memory (tests,
    embedding apps) has no file to sit beside, so it has no spool unless
    ``spool_path`` names one; ``off`` turns it off.
    """
    raw = section.get_str("spool_path")
    if raw is None:
        if not Path(config.source).is_file():
            return None
        raw = str(config.state_dir / _DEFAULT_SPOOL)
    if not raw:
        raise section.error("spool_path", f"must not be empty (use {SPOOL_OFF} for no spool)")
    if raw == SPOOL_OFF:
        return None
    path = Path(raw).expanduser()
    if not path.is_absolute():
        path = config.base_dir / path
    if check_dir:
        if path.is_dir():
            raise section.error("spool_path", f"{path} is a directory, expected a file")
        if not path.parent.is_dir():
            raise section.error("spool_path", f"directory {path.parent} does not exist")
        if not os.access(path.parent, os.W_OK):
            raise section.error("spool_path", f"directory {path.parent} is not writable")
    return path
