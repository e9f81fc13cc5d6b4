"""``[prism:probes]``: when, how often, how many at once, and how much they may spend."""

from __future__ import annotations

import logging
from pathlib import Path
from typing import Any

import attrs

from prism_proxy import Config, Section, read_settings, setting

from .fixtures import load_bodies

__all__ = ["SECTION", "ProbeSettings"]

log = logging.getLogger("prism.probes")

SECTION = "probes"


@attrs.frozen
class ProbeSettings:
    enabled: bool = setting(
        False,
        help="probes spend money: they run only when asked for (a section that tunes probes "
        "without `enabled` gets a WARNING that probes are off, not an error: the gateway "
        "serves as well without them)",
    )
    interval_s: float = setting(
        30.0,
        min=0.05,
        max=86400.0,
        help="how often lines are looked at (and, with Redis, probed at most once across the "
        "fleet)",
    )
    max_concurrent: int = setting(2, min=1, max=64, help="probes in flight at once")
    deadline_ms: int = setting(15_000, min=100, max=600_000, help="one fixture's whole call")
    first_token_ms: int = setting(
        5_000, min=1, max=600_000, help="a fixture whose first token comes later fails"
    )
    allowance_per_hour: float = setting(
        1.0, min=0.0, help="catalog currency per clock hour, priced from each line's `price`"
    )
    probe_opens_trial: bool = setting(
        True, help="a passing probe opens an isolated line's trial early"
    )
    fixtures: Path | None = setting(
        None,
        help="a TOML file of fixture requests (*The fixtures* below), relative to the "
        "configuration",
        default_text="the shipped ones",
    )
    #: Fixture requests replacing the shipped ones, by fixture name (read from ``fixtures``).
    bodies: dict[str, dict[str, Any]] = attrs.field(factory=dict, hash=False)

    @classmethod
    def from_config(cls, config: Config) -> ProbeSettings | None:
        """None unless ``enabled = true``: probes spend money, so they are asked for.

        A section that tunes probes without saying ``enabled`` gets a WARNING
        (not an error: the gateway serves as well without probes).
        """
        section = config.section(SECTION)
        settings = read_settings(cls, section)
        if not settings.enabled:
            if section.written and "enabled" not in section:
                log.warning(
                    "%s",
                    section.warning(
                        "enabled",
                        "not set: live probes are off (probes spend money, so they run only "
                        "with enabled = true; enabled = false says off is meant)",
                    ),
                )
            return None
        if settings.fixtures is None:
            return settings
        return attrs.evolve(settings, bodies=_bodies(config, section, settings.fixtures))


def _bodies(config: Config, section: Section, raw: Path) -> dict[str, dict[str, Any]]:
    # The file is read only for probes that run: a disabled section costs no I/O.
    path = raw.expanduser()
    if not path.is_absolute():
        path = config.base_dir / path
    try:
        return load_bodies(path)
    except ValueError as exc:
        raise section.error("fixtures", str(exc)) from None
