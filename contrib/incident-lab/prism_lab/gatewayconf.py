"""A variant's gateway configuration (prism.ini and catalog TOML), time-scaled.

Every duration a variant sets, and every duration default of the core and the
breaker that the lab knows of, is multiplied by the scenario's time scale, so
a 30 s isolation in a run at scale 0.1 is 3 real seconds. Counts (failures in
a row, minimum calls) are not durations and stay as written.
"""

from __future__ import annotations

import importlib.metadata
import json
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from .scenario import Scenario, Variant
from .traffic import organisations

__all__ = ["KEYS_DB", "scaled", "write_gateway_config"]

#: The variant's key database (beside its ini files, shared by its replicas).
KEYS_DB = "keys.db"

#: Duration defaults of ``[prism]`` (README's settings table), scaled with the rest.
CORE_TIME_DEFAULTS: Mapping[str, float] = {
    "attempt_timeout_ms": 60000,
    "backoff_base_ms": 250,
    "backoff_cap_ms": 8000,
    "call_budget_ms": 120000,
}
#: Duration defaults of ``[prism:breaker]`` (plugins/prism-breaker/README.md).
BREAKER_TIME_DEFAULTS: Mapping[str, float] = {
    "error_rate_window_s": 60,
    "latency_floor_ms": 100,
    "latency_sustain_s": 60,
    "latency_window_s": 600,
    "isolation_s": 30,
    "isolation_max_s": 900,
    "trial_min_duration_s": 60,
    "trial_spacing_s": 1,
    "ramp_s": 30,
    "refresh_s": 2,
}
#: Whole-millisecond keys (the gateway takes no fractions there).
_WHOLE_MS = ("attempt_timeout_ms", "backoff_base_ms", "backoff_cap_ms", "call_budget_ms")
#: What a variant keeps loaded; everything else installed is disabled so the run
#: measures the policies the scenario names and nothing else.
_KEEP = {"openai", "breaker", "billing", "redis"}


def _is_duration(key: str) -> bool:
    return key.endswith("_s") or key.endswith("_ms")


def scaled(
    settings: Mapping[str, Any], scale: float, defaults: Mapping[str, float] = {}
) -> dict[str, Any]:
    """``settings`` over ``defaults``, every duration multiplied by ``scale``."""
    out: dict[str, Any] = {}
    for key, value in {**defaults, **settings}.items():
        if _is_duration(key) and isinstance(value, int | float) and not isinstance(value, bool):
            value = value * scale
            value = max(1, round(value)) if key in _WHOLE_MS else round(value, 4)
        out[key] = value
    return out


def _ini_value(value: Any) -> str:
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, list | tuple):
        return ", ".join(str(v) for v in value)
    return str(value)


def _toml_value(value: Any) -> str:
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, int | float):
        return repr(value)
    if isinstance(value, str):
        return json.dumps(value)
    if isinstance(value, list | tuple):
        return "[ " + ", ".join(_toml_value(v) for v in value) + " ]"
    if isinstance(value, Mapping):
        return "{ " + ", ".join(f"{k} = {_toml_value(v)}" for k, v in value.items()) + " }"
    raise TypeError(f"cannot write {value!r} to TOML")


def catalog_text(scenario: Scenario, variant: Variant, fake_url: str) -> str:
    lines: list[str] = []
    for provider in scenario.providers.values():
        lines += [
            f"[providers.{provider.name}]",
            'kind = "openai"',
            f'base_url = "{fake_url}/s/{provider.name}/v1"',
        ]
        if provider.region is not None:
            lines.append(f"region = {_toml_value(provider.region)}")
    for name, model in scenario.models.items():
        merged = scaled({**model, **variant.models.get(name, {})}, scenario.time_scale)
        if isinstance(merged.get("chain"), list):
            merged["chain"] = [_line(line, scenario.time_scale) for line in merged["chain"]]
        lines.append(f"[models.{name}]")
        lines += [f"{key} = {_toml_value(value)}" for key, value in merged.items()]
    return "\n".join(lines) + "\n"


def _line(line: Any, scale: float) -> Any:
    """A chain line with its ``queue_ms`` scaled (the catalog takes whole ms, at least 1)."""
    if not isinstance(line, Mapping) or not isinstance(line.get("queue_ms"), int | float):
        return line
    return {**line, "queue_ms": max(1, round(line["queue_ms"] * scale))}


def _disabled(keep: set[str]) -> str:
    installed = {ep.name for ep in importlib.metadata.entry_points(group="prism_proxy")}
    return ", ".join(sorted(installed - keep))


def write_gateway_config(
    scenario: Scenario,
    variant: Variant,
    directory: Path,
    *,
    fake_url: str,
    port: int,
    replica: int,
    redis_url: str | None,
) -> Path:
    """Write catalog.toml and replica{N}.ini into ``directory``; returns the ini."""
    directory.mkdir(parents=True, exist_ok=True)
    (directory / "catalog.toml").write_text(catalog_text(scenario, variant, fake_url))
    keep = set(_KEEP)
    if variant.breaker is None:
        keep.discard("breaker")
    if not variant.billing:
        keep.discard("billing")
    if redis_url is None:
        keep.discard("redis")
    if variant.metrics is not None:
        keep.add("metrics")
    # Keys only when traffic names organisations (the ledger then records them);
    # regions only when callers send theirs.
    if organisations(scenario):
        keep.add("keys")
    if any(t.region is not None for t in scenario.traffic):
        keep.add("regions")
    core = scaled(variant.prism, scenario.time_scale, CORE_TIME_DEFAULTS)
    core.update(
        listen=f"127.0.0.1:{port}",
        catalog="catalog.toml",
        log_level=core.get("log_level", "WARNING"),
        shutdown_grace_s=0.5,
        disable=_disabled(keep),
    )
    sections: dict[str, dict[str, Any]] = {"prism": core}
    if variant.breaker is not None:
        breaker = scaled(variant.breaker, scenario.time_scale, BREAKER_TIME_DEFAULTS)
        if redis_url is None:
            breaker.setdefault("state_path", ":memory:")
        sections["prism:breaker"] = breaker
    if variant.billing:
        sections["prism:billing"] = {"ledger_path": f"ledger{replica}.sqlite"}
    if variant.metrics is not None:
        sections["prism:metrics"] = scaled(
            variant.metrics, scenario.time_scale, {"capacity_window_s": 3600}
        )
    if "keys" in keep:
        sections["prism:keys"] = {"db_path": KEYS_DB}
    if redis_url is not None:
        sections["prism:redis"] = {"url": redis_url, "key_prefix": "prism-lab", "sync_s": 0.1}
    text = "".join(
        f"[{name}]\n" + "".join(f"{k} = {_ini_value(v)}\n" for k, v in body.items())
        for name, body in sections.items()
    )
    ini = directory / f"replica{replica}.ini"
    ini.write_text(text)
    return ini
