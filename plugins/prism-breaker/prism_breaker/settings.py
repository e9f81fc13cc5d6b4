"""``[prism:breaker]``: every knob, its default, and the checks that stop start-up."""

from __future__ import annotations

from pathlib import Path

import attrs

from prism_proxy import Catalog, Config, ConfigError, Section

__all__ = ["MEMORY", "POLICIES", "SECTION", "Settings"]

SECTION = "breaker"
#: ``state_path`` value that keeps the store in memory (nothing survives a restart).
MEMORY = ":memory:"
POLICIES = frozenset({"consecutive", "error_rate", "latency"})
_DEFAULT_FILE = "prism-breaker.sqlite"

_KEYS = frozenset(
    {
        "policies",
        "consecutive_failures",
        "error_rate",
        "error_rate_window_s",
        "error_rate_min_calls",
        "latency_factor",
        "latency_floor_ms",
        "latency_sustain_s",
        "latency_min_samples",
        "latency_min_slow",
        "latency_window_s",
        "latency_whole_body",
        "isolation_s",
        "isolation_max_s",
        "trial_min_successes",
        "trial_min_duration_s",
        "trial_max_in_flight",
        "suspect_max_inflight",
        "trial_spacing_s",
        "trial_lease_s",
        "state_path",
        "refresh_s",
        "review_default_s",
        "review_warn_h",
        "ramp_s",
    }
)


@attrs.frozen
class Settings:
    """The breaker's policy; the defaults are argued for in the README."""

    policies: frozenset[str] = POLICIES
    consecutive_failures: int = 3
    error_rate: float = 0.25
    error_rate_window_s: float = 60.0
    error_rate_min_calls: int = 20
    latency_factor: float = 3.0
    #: A first byte sooner than this is never slow, whatever the median.
    latency_floor_ms: float = 100.0
    latency_sustain_s: float = 60.0
    latency_min_samples: int = 20
    latency_min_slow: int = 5
    latency_window_s: float = 600.0
    latency_whole_body: bool = False
    isolation_s: float = 30.0
    isolation_max_s: float = 900.0
    trial_min_successes: int = 5
    trial_min_duration_s: float = 60.0
    trial_max_in_flight: int = 1
    #: Calls in flight a suspect binding admits at once (see the README for the default).
    suspect_max_inflight: int = 4
    trial_spacing_s: float = 1.0
    trial_lease_s: float = 120.0
    state_path: str = MEMORY
    refresh_s: float = 2.0
    review_default_s: float = 7 * 86400.0
    #: Overrides are flagged this many hours before their review time.
    review_warn_h: float = 24.0
    #: After a restoration the binding's share of traffic grows from 10% to all over this.
    ramp_s: float = 30.0
    #: Bindings whose catalog line says ``restore = "manual"``: a passed trial waits
    #: for an operator's release.
    manual: frozenset[str] = frozenset()
    #: The configuration file the settings came from (for errors met later).
    source: str = "<config>"

    @classmethod
    def from_config(cls, config: Config, catalog: Catalog | None = None) -> Settings:
        section = config.section(SECTION)
        section.check_keys(_KEYS)
        policies = frozenset(section.get_list("policies", sorted(POLICIES)))
        unknown = policies - POLICIES
        if unknown:
            raise section.error(
                "policies",
                f"unknown polic{'y' if len(unknown) == 1 else 'ies'} {', '.join(sorted(unknown))} "
                f"(known: {', '.join(sorted(POLICIES))})",
            )
        isolation_s = section.get_float("isolation_s", 30.0, min=1.0)
        window_s = section.get_float("error_rate_window_s", 60.0, min=1.0)
        latency_sustain_s = section.get_float("latency_sustain_s", 60.0, min=0.0)
        latency_window_s = section.get_float("latency_window_s", 600.0, min=1.0)
        if latency_window_s <= latency_sustain_s:
            raise section.error(
                "latency_window_s",
                f"must be longer than latency_sustain_s ({latency_sustain_s:g}): the baseline "
                "median needs history from before the slow period",
            )
        return cls(
            policies=policies,
            consecutive_failures=section.get_int("consecutive_failures", 3, min=1, max=1000),
            error_rate=_fraction(section, "error_rate", 0.25),
            error_rate_window_s=window_s,
            error_rate_min_calls=section.get_int("error_rate_min_calls", 20, min=1),
            latency_factor=section.get_float("latency_factor", 3.0, min=1.0),
            latency_floor_ms=section.get_float("latency_floor_ms", 100.0, min=0.0),
            latency_sustain_s=latency_sustain_s,
            latency_min_samples=section.get_int("latency_min_samples", 20, min=1),
            latency_min_slow=section.get_int("latency_min_slow", 5, min=1),
            latency_window_s=latency_window_s,
            latency_whole_body=section.get_bool("latency_whole_body", False),
            isolation_s=isolation_s,
            isolation_max_s=section.get_float("isolation_max_s", 900.0, min=isolation_s),
            trial_min_successes=section.get_int("trial_min_successes", 5, min=1),
            trial_min_duration_s=section.get_float("trial_min_duration_s", 60.0, min=0.0),
            trial_max_in_flight=section.get_int("trial_max_in_flight", 1, min=1),
            suspect_max_inflight=section.get_int("suspect_max_inflight", 4, min=1),
            trial_spacing_s=section.get_float("trial_spacing_s", 1.0, min=0.0),
            trial_lease_s=section.get_float(
                "trial_lease_s", _longest_budget_s(config, catalog), min=1.0
            ),
            state_path=_state_path(config, section),
            refresh_s=section.get_float("refresh_s", 2.0, min=0.01, max=3600.0),
            review_default_s=section.get_float("review_default_s", 7 * 86400.0, min=60.0),
            review_warn_h=section.get_float("review_warn_h", 24.0, min=0.0, max=24.0 * 365),
            ramp_s=section.get_float("ramp_s", 30.0, min=0.0, max=3600.0),
            manual=_manual(catalog),
            source=config.source,
        )


def _manual(catalog: Catalog | None) -> frozenset[str]:
    """The bindings whose line says ``restore = "manual"`` (checking every ``restore``)."""
    if catalog is None:
        return frozenset()
    manual = set()
    for model in catalog.models.values():
        for index, binding in enumerate(model.chain):
            value = binding.options.get("restore", "auto")
            if value not in ("auto", "manual"):
                raise ConfigError(
                    catalog.source,
                    f"models.{model.name}.chain[{index}].restore",
                    f'expected "auto" or "manual", got {value!r}',
                )
            if value == "manual":
                manual.add(binding.id)
    return frozenset(manual)


def _fraction(section: Section, key: str, default: float) -> float:
    value = section.get_float(key, default)
    if not 0.0 < value < 1.0:
        raise section.error(key, f"must be a fraction between 0 and 1 (exclusive), got {value}")
    return value


def _longest_budget_s(config: Config, catalog: Catalog | None) -> float:
    """A trial slot whose holder never reports back is reclaimed after the longest call."""
    budgets = [config.call_budget_ms]
    if catalog is not None:
        budgets += [m.call_budget_ms for m in catalog.models.values() if m.call_budget_ms]
    return max(budgets) / 1000


def _state_path(config: Config, section: Section) -> str:
    """Where the SQLite state lives.

    Default: ``prism-breaker.sqlite`` in ``config.state_dir`` (systemd's
    ``$STATE_DIRECTORY``, else beside the configuration file).  A
    configuration built in memory (tests, embedding apps) has no file to sit
    beside, so its state stays in memory unless ``state_path`` names one;
    that also keeps separate apps in one process from sharing a file by
    accident.
    """
    raw = section.get_str("state_path")
    if raw is None:
        if not Path(config.source).is_file():
            return MEMORY
        raw = str(config.state_dir / _DEFAULT_FILE)
    if not raw:
        raise section.error("state_path", "must not be empty (use :memory: for no file)")
    if raw == MEMORY:
        return MEMORY
    path = Path(raw).expanduser()
    if not path.is_absolute():
        path = config.base_dir / path
    if path.exists() and path.is_dir():
        raise section.error("state_path", f"{path} is a directory, expected a file")
    if not path.parent.is_dir():
        raise section.error("state_path", f"directory {path.parent} does not exist")
    return str(path.resolve())
