"""``[prism:probes]``: when, how often, how many at once, and how much they may spend."""

from __future__ import annotations

import logging
from pathlib import Path
from typing import Any

import attrs

from prism_proxy import Config, Section

from .fixtures import load_bodies

__all__ = ["SECTION", "ProbeSettings"]

log = logging.getLogger("prism.probes")

SECTION = "probes"
_KEYS = frozenset(
    {
        "enabled",
        "interval_s",
        "max_concurrent",
        "deadline_ms",
        "first_token_ms",
        "allowance_per_hour",
        "probe_opens_trial",
        "fixtures",
    }
)


@attrs.frozen
class ProbeSettings:
    interval_s: float = 30.0
    max_concurrent: int = 2
    deadline_ms: int = 15_000
    first_token_ms: int = 5_000
    #: In the catalog's currency, priced from each line's own price.
    allowance_per_hour: float = 1.0
    probe_opens_trial: bool = True
    #: Fixture requests replacing the shipped ones, by fixture name (``fixtures = FILE``).
    bodies: dict[str, dict[str, Any]] = attrs.field(factory=dict, hash=False)

    @classmethod
    def from_config(cls, config: Config) -> ProbeSettings | None:
        """None unless ``enabled = true``: probes spend money, so they are asked for.

        A section that tunes probes without saying ``enabled`` gets a WARNING
        (not an error: the gateway serves as well without probes).
        """
        section = config.section(SECTION)
        section.check_keys(_KEYS)
        if not section.get_bool("enabled", False):
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
        return cls(
            interval_s=section.get_float("interval_s", 30.0, min=0.05, max=86400.0),
            max_concurrent=section.get_int("max_concurrent", 2, min=1, max=64),
            deadline_ms=section.get_int("deadline_ms", 15_000, min=100, max=600_000),
            first_token_ms=section.get_int("first_token_ms", 5_000, min=1, max=600_000),
            allowance_per_hour=section.get_float("allowance_per_hour", 1.0, min=0.0),
            probe_opens_trial=section.get_bool("probe_opens_trial", True),
            bodies=_bodies(config, section),
        )


def _bodies(config: Config, section: Section) -> dict[str, dict[str, Any]]:
    raw = section.get_str("fixtures")
    if raw is None:
        return {}
    path = Path(raw).expanduser()
    if not path.is_absolute():
        path = config.base_dir / path
    try:
        return load_bodies(path)
    except ValueError as exc:
        raise section.error("fixtures", str(exc)) from None
