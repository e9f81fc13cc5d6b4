"""A scenario file (TOML): providers, gateway variants, traffic and a timeline of faults.

Every duration here is in scenario time; ``time_scale`` says how many real
seconds one scenario second takes. Every mistake is refused with the file and
the key named, before anything starts.
"""

from __future__ import annotations

import itertools
import tomllib
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import attrs

__all__ = [
    "Fault",
    "Provider",
    "Scenario",
    "ScenarioError",
    "Traffic",
    "Variant",
    "load_scenario",
]

_KINDS = ("openai",)


class ScenarioError(ValueError):
    """A scenario that cannot run: ``file: key: problem``."""

    def __init__(self, file: Path | str, key: str, problem: str) -> None:
        super().__init__(f"{file}: {key}: {problem}")
        self.file = str(file)
        self.key = key
        self.problem = problem


@attrs.frozen
class Provider:
    name: str
    region: str | None
    #: Normal first-token latency and gap between streamed tokens (scenario ms).
    first_token_ms: float
    token_ms: float
    #: The upstream's own concurrency: requests beyond it wait in arrival order (None: no limit).
    concurrency: int | None = None


@attrs.frozen
class Fault:
    """One window of trouble on one provider (its fake upstream scenario)."""

    provider: str
    start_s: float
    end_s: float
    latency_x: float = 1.0
    #: The latency multiplier climbs from 1 to ``latency_x`` over this long (0: at once).
    ramp_s: float = 0.0
    errors: Mapping[int, float] = attrs.field(factory=dict)
    rate_limited: float = 0.0
    retry_after_s: float = 1.0
    refused: float = 0.0
    empty: float = 0.0
    cut: float = 0.0
    #: Recovery that comes and goes: sick for ``flap_down_s``, well for ``flap_up_s``, repeat.
    flap_down_s: float = 0.0
    flap_up_s: float = 0.0

    def active(self, t: float) -> bool:
        if not self.start_s <= t < self.end_s:
            return False
        if self.flap_up_s <= 0 or self.flap_down_s <= 0:
            return True
        return (t - self.start_s) % (self.flap_down_s + self.flap_up_s) < self.flap_down_s

    def multiplier(self, t: float) -> float:
        if self.ramp_s <= 0:
            return self.latency_x
        return 1.0 + (self.latency_x - 1.0) * min(1.0, (t - self.start_s) / self.ramp_s)


_WIRES = ("openai", "anthropic")


@attrs.frozen
class Traffic:
    """One kind of client: its rates, and who it is (organisation, region, wire)."""

    #: Calls per scenario second, per catalog model (a scheduled model: its highest rate).
    rate: Mapping[str, float]
    stream_share: float
    prompt_words: tuple[int, int]
    max_tokens: int
    #: The organisation the calls carry a key of (None: no key).
    org: str | None = None
    #: The caller's region, sent as ``x-prism-regions`` (None: not sent).
    region: str | None = None
    #: ``openai`` (``/v1/chat/completions``) or ``anthropic`` (``/v1/messages``).
    wire: str = "openai"
    #: Per model, a rate that varies: ``(t_s, calls per second)`` points, linear between.
    schedule: Mapping[str, tuple[tuple[float, float], ...]] = attrs.field(factory=dict)

    def rate_at(self, model: str, t: float) -> float:
        points = self.schedule.get(model)
        if not points:
            return self.rate[model]
        if t <= points[0][0]:
            return points[0][1]
        for (t0, r0), (t1, r1) in itertools.pairwise(points):
            if t < t1:
                return r0 + (r1 - r0) * (t - t0) / (t1 - t0)
        return points[-1][1]


@attrs.frozen
class Variant:
    name: str
    description: str
    #: ``[prism]`` keys, ``[prism:breaker]`` keys (None: breaker off), per-model catalog keys.
    prism: Mapping[str, Any]
    breaker: Mapping[str, Any] | None
    models: Mapping[str, Mapping[str, Any]]
    billing: bool
    #: ``[prism:metrics]`` keys (None: prism-metrics not loaded); the capacity rule lives there.
    metrics: Mapping[str, Any] | None = None


@attrs.frozen
class Scenario:
    path: Path
    name: str
    description: str
    duration_s: float
    time_scale: float
    seed: int
    replicas: int
    providers: Mapping[str, Provider]
    #: Catalog models: name → chain lines (dicts as the catalog takes them) and keys.
    models: Mapping[str, Mapping[str, Any]]
    #: One entry per kind of client (``[traffic]`` or ``[[traffic]]``).
    traffic: tuple[Traffic, ...]
    faults: tuple[Fault, ...]
    variants: tuple[Variant, ...]

    def primary(self, model: str) -> str:
        """The binding (``provider/model``) a model's calls go to when all is well."""
        line = self.models[model]["chain"][0]
        return f"{line['provider']}/{line['model']}"

    def sick(self, provider: str, t: float) -> bool:
        return any(f.provider == provider and f.active(t) for f in self.faults)


@attrs.define
class _Reader:
    """Reads one table, naming the full key in every complaint."""

    file: Path
    prefix: str
    table: Mapping[str, Any]
    allowed: tuple[str, ...]

    def __attrs_post_init__(self) -> None:
        for key in self.table:
            if key not in self.allowed:
                raise self.error(key, f"unknown key (known: {', '.join(self.allowed)})")

    def key(self, name: str) -> str:
        return f"{self.prefix}.{name}" if self.prefix else name

    def error(self, name: str, problem: str) -> ScenarioError:
        return ScenarioError(self.file, self.key(name), problem)

    def number(
        self,
        name: str,
        default: float | None = None,
        *,
        low: float = 0.0,
        high: float | None = None,
    ) -> float:
        value = self.table.get(name, default)
        if value is None:
            raise self.error(name, "required")
        if isinstance(value, bool) or not isinstance(value, int | float):
            raise self.error(name, f"must be a number, got {value!r}")
        if value < low or (high is not None and value > high):
            bound = f"between {low} and {high}" if high is not None else f"at least {low}"
            raise self.error(name, f"must be {bound}, got {value!r}")
        return float(value)

    def integer(self, name: str, default: int, *, low: int = 0) -> int:
        value = self.table.get(name, default)
        if isinstance(value, bool) or not isinstance(value, int) or value < low:
            raise self.error(name, f"must be a whole number, at least {low}, got {value!r}")
        return value

    def text(self, name: str, default: str | None = None) -> str:
        value = self.table.get(name, default)
        if not isinstance(value, str):
            raise self.error(name, "required" if value is None else f"must be text, got {value!r}")
        return value

    def sub(self, name: str, allowed: tuple[str, ...] | None = None) -> _Reader:
        value = self.table.get(name, {})
        if not isinstance(value, dict):
            raise self.error(name, "must be a table")
        return _Reader(self.file, self.key(name), value, allowed or tuple(value))


def _fraction(r: _Reader, name: str) -> float:
    return r.number(name, 0.0, high=1.0)


def _provider(file: Path, name: str, table: object) -> Provider:
    if not isinstance(table, dict):
        raise ScenarioError(file, f"providers.{name}", "must be a table")
    r = _Reader(
        file,
        f"providers.{name}",
        table,
        ("kind", "region", "first_token_ms", "token_ms", "concurrency"),
    )
    kind = r.text("kind", "openai")
    if kind not in _KINDS:
        raise r.error("kind", f"must be one of {', '.join(_KINDS)}, got {kind!r}")
    region = table.get("region")
    if region is not None and not isinstance(region, str):
        raise r.error("region", f"must be text, got {region!r}")
    concurrency = r.integer("concurrency", 0, low=1) if "concurrency" in table else None
    return Provider(
        name,
        region,
        r.number("first_token_ms", 300.0),
        r.number("token_ms", 10.0),
        concurrency,
    )


def _fault(file: Path, i: int, table: object, providers: Mapping[str, Provider]) -> Fault:
    if not isinstance(table, dict):
        raise ScenarioError(file, f"faults[{i}]", "must be a table")
    fields = [f.name for f in attrs.fields(Fault)]
    r = _Reader(file, f"faults[{i}]", table, tuple(fields))
    provider = r.text("provider")
    if provider not in providers:
        raise r.error("provider", f"unknown provider {provider!r} (known: {', '.join(providers)})")
    start, end = r.number("start_s"), r.number("end_s")
    if end <= start:
        raise r.error("end_s", f"must be after start_s ({start}), got {end}")
    errors_r = r.sub("errors")
    errors: dict[int, float] = {}
    for status in errors_r.table:
        if not status.isdigit() or not 500 <= int(status) <= 599:
            raise errors_r.error(status, "must be a 5xx status (429s: rate_limited)")
        errors[int(status)] = _fraction(errors_r, status)
    fault = Fault(
        provider=provider,
        start_s=start,
        end_s=end,
        latency_x=r.number("latency_x", 1.0, low=1.0),
        ramp_s=r.number("ramp_s", 0.0),
        errors=errors,
        rate_limited=_fraction(r, "rate_limited"),
        retry_after_s=r.number("retry_after_s", 1.0),
        refused=_fraction(r, "refused"),
        empty=_fraction(r, "empty"),
        cut=_fraction(r, "cut"),
        flap_down_s=r.number("flap_down_s", 0.0),
        flap_up_s=r.number("flap_up_s", 0.0),
    )
    total = sum(errors.values()) + fault.rate_limited + fault.refused + fault.empty + fault.cut
    if total > 1.0 + 1e-9:
        raise r.error("errors", f"errors, rate_limited, refused, empty and cut add up to {total}")
    return fault


def _models(file: Path, table: object, providers: Mapping[str, Provider]) -> dict[str, Any]:
    if not isinstance(table, dict) or not table:
        raise ScenarioError(file, "models", "required: at least one [models.NAME] with a chain")
    for name, model in table.items():
        if not isinstance(model, dict):
            raise ScenarioError(file, f"models.{name}", "must be a table")
        chain = model.get("chain")
        if not isinstance(chain, list) or not chain:
            raise ScenarioError(file, f"models.{name}.chain", "required: a non-empty list")
        for j, line in enumerate(chain):
            key = f"models.{name}.chain[{j}]"
            if not isinstance(line, dict) or not isinstance(line.get("model"), str):
                raise ScenarioError(file, key, "must be { provider = ..., model = ... }")
            if line.get("provider") not in providers:
                raise ScenarioError(
                    file, f"{key}.provider", f"unknown provider {line.get('provider')!r}"
                )
    return dict(table)


_TRAFFIC_KEYS = (
    "rate", "stream_share", "prompt_words", "max_tokens", "org", "region", "wire",
)  # fmt: skip


def _schedule(r: _Reader, model: str, points: list[Any]) -> tuple[tuple[float, float], ...]:
    """``[[t_s, rate], ...]``: times rising from 0, rates at least 0, one above 0."""
    out: list[tuple[float, float]] = []
    for point in points:
        if (
            not isinstance(point, list)
            or len(point) != 2
            or not all(isinstance(v, int | float) and not isinstance(v, bool) for v in point)
            or point[1] < 0
        ):
            raise r.error(
                model, f"schedule points must be [t_s, calls per second >= 0], got {point!r}"
            )
        if out and point[0] <= out[-1][0]:
            raise r.error(model, f"schedule times must rise, got {point[0]} after {out[-1][0]}")
        out.append((float(point[0]), float(point[1])))
    if not out or out[0][0] != 0:
        raise r.error(model, "a schedule starts at t_s = 0, e.g. [[0, 2], [60, 8]]")
    if max(v for _, v in out) < 0.001:
        raise r.error(model, "a schedule needs a rate of at least 0.001 somewhere")
    return tuple(out)


def _traffic_entry(file: Path, key: str, table: object, models: Mapping[str, Any]) -> Traffic:
    if not isinstance(table, dict):
        raise ScenarioError(file, key, "must be a table")
    r = _Reader(file, key, table, _TRAFFIC_KEYS)
    rates_r = r.sub("rate")
    if not rates_r.table:
        raise r.error("rate", "required: calls per second per model, e.g. rate = { chat = 10 }")
    rate: dict[str, float] = {}
    schedule: dict[str, tuple[tuple[float, float], ...]] = {}
    for model, value in rates_r.table.items():
        if model not in models:
            raise rates_r.error(model, f"unknown model (known: {', '.join(models)})")
        if isinstance(value, list):
            schedule[model] = _schedule(rates_r, model, value)
            rate[model] = max(v for _, v in schedule[model])
        else:
            rate[model] = rates_r.number(model, low=0.001)
    words = table.get("prompt_words", [20, 200])
    if (
        not isinstance(words, list)
        or len(words) != 2
        or not all(isinstance(w, int) and not isinstance(w, bool) and w >= 1 for w in words)
        or words[0] > words[1]
    ):
        raise r.error("prompt_words", f"must be [low, high] whole numbers >= 1, got {words!r}")
    org = r.text("org") if "org" in table else None
    if org is not None and not (org and len(org) <= 64 and org.replace("-", "").isalnum()):
        raise r.error("org", f"must be a name of letters, digits and '-', got {org!r}")
    region = r.text("region") if "region" in table else None
    if region is not None and not region:
        raise r.error("region", "must be a region name, got ''")
    wire = r.text("wire", "openai")
    if wire not in _WIRES:
        raise r.error("wire", f"must be one of {', '.join(_WIRES)}, got {wire!r}")
    return Traffic(
        rate=rate,
        stream_share=_fraction(r, "stream_share") if "stream_share" in table else 0.5,
        prompt_words=(words[0], words[1]),
        max_tokens=r.integer("max_tokens", 16, low=1),
        org=org,
        region=region,
        wire=wire,
        schedule=schedule,
    )


def _traffic(file: Path, table: object, models: Mapping[str, Any]) -> tuple[Traffic, ...]:
    if isinstance(table, dict):
        return (_traffic_entry(file, "traffic", table, models),)
    if not isinstance(table, list) or not table:
        raise ScenarioError(file, "traffic", "required: a [traffic] table or [[traffic]] entries")
    return tuple(_traffic_entry(file, f"traffic[{i}]", t, models) for i, t in enumerate(table))


def _variant(file: Path, name: str, table: object, models: Mapping[str, Any]) -> Variant:
    if not isinstance(table, dict):
        raise ScenarioError(file, f"variants.{name}", "must be a table")
    r = _Reader(
        file,
        f"variants.{name}",
        table,
        ("description", "prism", "breaker", "models", "billing", "metrics"),
    )
    breaker_raw = table.get("breaker", {})
    if breaker_raw is False:
        breaker: dict[str, Any] | None = None
    elif isinstance(breaker_raw, dict):
        breaker = dict(breaker_raw)
    else:
        raise r.error("breaker", "must be a table of [prism:breaker] keys, or false for none")
    per_model = r.sub("models")
    for model in per_model.table:
        if model not in models:
            raise per_model.error(model, f"unknown model (known: {', '.join(models)})")
        per_model.sub(model)
    billing = table.get("billing", True)
    if not isinstance(billing, bool):
        raise r.error("billing", f"must be true or false, got {billing!r}")
    metrics_raw = table.get("metrics", False)
    if metrics_raw is not False and not isinstance(metrics_raw, dict):
        raise r.error("metrics", "must be a table of [prism:metrics] keys, or false for none")
    return Variant(
        name=name,
        description=r.text("description", ""),
        prism=dict(r.sub("prism").table),
        breaker=breaker,
        models={m: dict(v) for m, v in per_model.table.items()},
        billing=billing,
        metrics=None if metrics_raw is False else dict(metrics_raw),
    )


def load_scenario(path: Path | str) -> Scenario:
    """Read and check a scenario file; raises ScenarioError naming the file and key."""
    file = Path(path)
    try:
        data = tomllib.loads(file.read_text())
    except OSError as exc:
        raise ScenarioError(file, "(file)", f"cannot be read: {exc.strerror}") from None
    except tomllib.TOMLDecodeError as exc:
        raise ScenarioError(file, "(file)", f"not valid TOML: {exc}") from None
    top = _Reader(
        file, "", data, ("scenario", "providers", "models", "traffic", "faults", "variants")
    )
    head = top.sub(
        "scenario", ("name", "description", "duration_s", "time_scale", "seed", "replicas")
    )
    if not head.table:
        raise top.error("scenario", "required: a [scenario] table with name and duration_s")
    providers_t = data.get("providers")
    if not isinstance(providers_t, dict) or not providers_t:
        raise top.error("providers", "required: at least one [providers.NAME]")
    providers = {n: _provider(file, n, t) for n, t in providers_t.items()}
    models = _models(file, data.get("models"), providers)
    faults_t = data.get("faults", [])
    if not isinstance(faults_t, list):
        raise top.error("faults", "must be an array of tables ([[faults]])")
    variants_t = data.get("variants")
    if not isinstance(variants_t, dict) or not variants_t:
        raise top.error("variants", "required: at least one [variants.NAME]")
    return Scenario(
        path=file,
        name=head.text("name"),
        description=head.text("description", ""),
        duration_s=head.number("duration_s", low=1.0),
        time_scale=head.number("time_scale", 1.0, low=0.01, high=10.0),
        seed=head.integer("seed", 1),
        replicas=head.integer("replicas", 1, low=1),
        providers=providers,
        models=models,
        traffic=_traffic(file, data.get("traffic"), models),
        faults=tuple(_fault(file, i, t, providers) for i, t in enumerate(faults_t)),
        variants=tuple(_variant(file, n, t, models) for n, t in variants_t.items()),
    )
