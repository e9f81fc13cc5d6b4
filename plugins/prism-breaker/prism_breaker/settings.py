"""``[prism:breaker]``: every knob, its default, and the checks that stop start-up."""

from __future__ import annotations

import logging
from pathlib import Path
from typing import Any

import attrs

from prism_proxy import Catalog, Config, ConfigError, Section, read_settings, setting

from .predictor import Model, ModelError, load_model

__all__ = ["MEMORY", "POLICIES", "SECTION", "Settings"]

SECTION = "breaker"
#: ``state_path`` value that keeps the store in memory (nothing survives a restart).
MEMORY = ":memory:"
POLICIES = frozenset({"consecutive", "error_rate", "latency"})
_DEFAULT_FILE = "prism-breaker.sqlite"

log = logging.getLogger("prism.breaker")


def _policies(section: Section, key: str, default: frozenset[str]) -> frozenset[str]:
    policies = frozenset(section.get_list(key, sorted(default)))
    unknown = policies - POLICIES
    if unknown:
        raise section.error(
            key,
            f"unknown polic{'y' if len(unknown) == 1 else 'ies'} {', '.join(sorted(unknown))} "
            f"(known: {', '.join(sorted(POLICIES))})",
        )
    return policies


def _fraction(section: Section, key: str, default: float) -> float:
    value = section.get_float(key, default)
    if not 0.0 < value < 1.0:
        raise section.error(key, f"must be a fraction between 0 and 1 (exclusive), got {value}")
    return value


def _predictor(section: Section, key: str, default: Model | None) -> Model | None:
    text = section.get_str(key, None)
    if not text:
        return default
    path = Path(text)
    if not path.is_absolute():
        path = Path(section.source).parent / path
    try:
        return load_model(path)
    except ModelError as exc:
        raise section.error(key, f"{path}: {exc}") from None


def _resolved(section: Section, key: str, default: str) -> str:
    # from_config resolves the path with Config.state_file (it needs the
    # configuration's directory, which a section does not know) and hands it over.
    return default


@attrs.frozen
class Settings:
    """The breaker's policy; the defaults are argued for in the README."""

    policies: frozenset[str] = setting(
        POLICIES,
        help="which trip policies are active",
        parse=_policies,
        type_text="list of `consecutive`, `error_rate`, `latency`",
    )
    consecutive_failures: int = setting(3, min=1, max=1000, help="failures in a row that isolate")
    error_rate: float = setting(
        0.25,
        help="failure fraction that isolates when exceeded",
        parse=_fraction,
        type_text="number, between 0 and 1 (exclusive)",
    )
    error_rate_window_s: float = setting(60.0, min=1.0, help="the error-rate window")
    error_rate_min_calls: int = setting(
        20,
        min=1,
        help="counted calls needed in the window before the rate can trip (and before a "
        "binding is `healthy`)",
    )
    latency_factor: float = setting(
        3.0, min=1.0, help="K: slow means over K times the binding's rolling median"
    )
    latency_floor_ms: float = setting(
        100.0,
        min=0.0,
        help="a first byte at or below this is never slow, whatever the median: against a "
        "median of a few milliseconds, three times as long is the gateway's own queueing "
        "under load (its event loop's lag), not a slow upstream; LLM first tokens take "
        "hundreds of milliseconds, so a real slowdown clears it",
    )
    latency_sustain_s: float = setting(60.0, min=0.0, help="how long slowness must last")
    latency_min_samples: int = setting(
        20, min=1, help="baseline samples needed before latency is judged"
    )
    latency_min_slow: int = setting(5, min=1, help="slow samples in a row needed to trip")
    latency_window_s: float = setting(
        600.0, min=1.0, help="the baseline window (must exceed `latency_sustain_s`)"
    )
    latency_whole_body: bool = setting(False, help="also judge non-streaming whole-body latency")
    isolation_s: float = setting(30.0, min=1.0, help="first isolation window")
    isolation_max_s: float = setting(
        900.0, help="longest isolation window (at least `isolation_s`)"
    )
    trial_min_successes: int = setting(5, min=1, help="trial successes needed to restore")
    trial_min_duration_s: float = setting(
        60.0, min=0.0, help="minimum time in trial before restoring"
    )
    trial_max_in_flight: int = setting(1, min=1, help="absolute ceiling of concurrent trial calls")
    suspect_max_inflight: int = setting(
        4,
        min=1,
        help="calls a `suspect` binding admits at once; the rest move to the next line at "
        "once (`breaker: suspect, 4 in flight` in the record). A suspect binding has shown "
        "failures, not yet enough to isolate it: four concurrent calls give four verdicts "
        "per round trip, enough to confirm or clear the suspicion quickly, while a burst of "
        "hundreds of callers no longer lands on a binding that may be dead",
    )
    trial_spacing_s: float = setting(1.0, min=0.0, help="minimum gap between trial slot hand-outs")
    trial_lease_s: float = setting(
        120.0,
        min=1.0,
        help="a trial slot whose holder never reports back is reclaimed after this",
        default_text="the longest call budget",
    )
    state_path: str = setting(
        MEMORY,
        help="the SQLite state file; `:memory:` for none; relative paths resolve against the "
        "config file's directory, which must exist and be writable",
        parse=_resolved,
        type_text="path or `:memory:`",
        default_text="`prism-breaker.sqlite` in `$STATE_DIRECTORY` (systemd's "
        "`StateDirectory=`) when set, else beside the config file",
    )
    refresh_s: float = setting(
        2.0,
        min=0.01,
        max=3600.0,
        help="how often the gateway re-reads overrides written by others (CLI) and records "
        "window ends",
    )
    review_default_s: float = setting(
        7 * 86400.0,
        min=60.0,
        help="review-by time of an override that names none (7 days)",
    )
    review_warn_h: float = setting(
        24.0,
        min=0.0,
        max=24.0 * 365,
        help="an override is flagged (`reviews_due_soon` in `/prism/health`, a WARNING, a "
        'board banner, `prism_override_reviews{when="due_soon"}`) this many hours before its '
        "review time",
    )
    ramp_s: float = setting(
        30.0,
        min=0.0,
        max=3600.0,
        help="after a restoration the binding takes a growing share of calls, from 10% to all "
        "over this many seconds (slow start); 0: all at once",
    )
    predictor: Model | None = setting(
        None,
        help="a health model written by `prism-lab predict` (JSON): when its probability that "
        "the chain is unavailable within its horizon passes its threshold, an eligible binding "
        "turns `suspect` (never isolated); used only if its held-out precision reaches "
        "`predictor_precision_floor`; relative paths resolve against the config file's "
        "directory",
        parse=_predictor,
        type_text="path",
        default_text="off",
    )
    predictor_precision_floor: float = setting(
        0.9,
        min=0.0,
        max=1.0,
        help="the held-out precision a `predictor` model must have recorded to be used; below "
        "it the model is ignored, with one WARNING at start saying why",
    )
    #: Bindings whose catalog line says ``restore = "manual"``: a passed trial waits
    #: for an operator's release.
    manual: frozenset[str] = frozenset()
    #: The configuration file the settings came from (for errors met later).
    source: str = "<config>"

    def check(self, section: Section) -> None:
        if self.isolation_max_s < self.isolation_s:
            raise section.error(
                "isolation_max_s",
                f"must be at least {self.isolation_s}, got {self.isolation_max_s}",
            )
        if self.latency_window_s <= self.latency_sustain_s:
            raise section.error(
                "latency_window_s",
                f"must be longer than latency_sustain_s ({self.latency_sustain_s:g}): the "
                "baseline median needs history from before the slow period",
            )
        model = self.predictor
        if model is not None and model.precision < self.predictor_precision_floor:
            log.warning(
                "%s: not used: its held-out precision %.3f is below predictor_precision_floor "
                "%.3f (a suspicion it raised would more often be wrong than the floor allows)",
                section.warning("predictor", model.source),
                model.precision,
                self.predictor_precision_floor,
            )

    @property
    def active_predictor(self) -> Model | None:
        """The predictor model, if one is set and its held-out precision reaches the floor."""
        model = self.predictor
        if model is None or model.precision < self.predictor_precision_floor:
            return None
        return model

    @classmethod
    def from_config(cls, config: Config, catalog: Catalog | None = None) -> Settings:
        section = config.section(SECTION)
        state = config.state_file(section, "state_path", default_name=_DEFAULT_FILE, off=MEMORY)
        computed: dict[str, Any] = {
            "trial_lease_s": _longest_budget_s(config, catalog),
            "state_path": MEMORY if state is None else str(state),
        }
        return read_settings(
            cls,
            section,
            defaults=computed,
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


def _longest_budget_s(config: Config, catalog: Catalog | None) -> float:
    """A trial slot whose holder never reports back is reclaimed after the longest call."""
    budgets = [config.call_budget_ms]
    if catalog is not None:
        budgets += [m.call_budget_ms for m in catalog.models.values() if m.call_budget_ms]
    return max(budgets) / 1000
