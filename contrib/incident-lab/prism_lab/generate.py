"""Randomised incidents for ``prism-lab predict``: seeded draws from a few templates.

Every generated scenario has the same two-line chain (``primary`` then
``backup``, one region) so one model can learn from all of them; what varies
is the trouble: when it starts, how hard, what precedes it, and whether the
backup goes down too. The templates follow the shipped scenarios: a cascade
(the primary fails, the backup is rate-limited, then overwhelmed), an outage
of the primary alone, a bad pod, a latency creep, a burst of 429s, a regional
outage with no warning, and quiet.

The ground truth is the timeline itself: a line is *down* while its faults
fail at least ``DOWN_SHARE`` of its requests (or make the first token later
than any attempt may wait), and the chain is *unavailable* while every line
of it is down.
"""

from __future__ import annotations

import random
from collections.abc import Callable, Sequence
from pathlib import Path

from .scenario import Fault, Provider, Scenario, Traffic, Variant

__all__ = ["DOWN_SHARE", "TEMPLATES", "chain_down", "generate", "line_down"]

#: A line failing at least this share of its requests is down.
DOWN_SHARE = 0.9
#: The core's default attempt timeout (scenario ms): a first token later than this never comes.
_ATTEMPT_TIMEOUT_MS = 60000.0
PRIMARY, BACKUP = "primary", "backup"

#: The variant every generated scenario is recorded with: the breaker as it ships.
RECORD = Variant(
    name="record",
    description="the breaker as it ships",
    prism={},
    breaker={},
    models={},
    billing=True,
)

#: The chain of every generated scenario: a dearer backup, as in single-bad-pod.
_CHAIN = (
    {"provider": PRIMARY, "model": "p-1", "price": {"input": 1.0, "output": 4.0}},
    {"provider": BACKUP, "model": "b-1", "price": {"input": 5.0, "output": 20.0}},
)

_Draw = Callable[[random.Random, float], list[Fault]]


def _down(rng: random.Random, provider: str, start: float, end: float) -> Fault:
    kind = rng.choice(("errors", "refused", "rate_limited"))
    if kind == "errors":
        return Fault(provider, start, end, errors={503: 1.0})
    if kind == "refused":
        return Fault(provider, start, end, refused=1.0)
    return Fault(provider, start, end, rate_limited=1.0, retry_after_s=rng.uniform(2, 10))


def _precursor(rng: random.Random, provider: str, start: float, end: float) -> Fault:
    """Trouble short of down: some errors, some 429s, slower first tokens."""
    return Fault(
        provider,
        start,
        end,
        latency_x=rng.uniform(1.0, 4.0),
        ramp_s=(end - start) * rng.uniform(0.2, 1.0),
        errors={503: rng.uniform(0.0, 0.3)},
        rate_limited=rng.uniform(0.0, 0.4),
        retry_after_s=rng.uniform(1, 5),
    )


def _cascade(rng: random.Random, duration: float) -> list[Fault]:
    # Fractions of the duration, so that the whole story fits in a short scenario too.
    t0 = rng.uniform(0.1, 0.25) * duration
    down = t0 + rng.uniform(0.05, 0.15) * duration
    backup_warn = down + rng.uniform(0.05, 0.2) * duration
    backup_down = backup_warn + rng.uniform(0.04, 0.12) * duration
    end = min(duration, backup_down + rng.uniform(0.1, 0.25) * duration)
    return [
        _precursor(rng, PRIMARY, t0, down),
        _down(rng, PRIMARY, down, end),
        Fault(
            BACKUP,
            backup_warn,
            backup_down,
            rate_limited=rng.uniform(0.2, 0.7),
            retry_after_s=rng.uniform(1, 5),
            latency_x=rng.uniform(1.0, 3.0),
        ),
        _down(rng, BACKUP, backup_down, end),
    ]


def _primary_outage(rng: random.Random, duration: float) -> list[Fault]:
    t0 = rng.uniform(0.1, 0.3) * duration
    down = t0 + rng.uniform(0.05, 0.15) * duration
    end = min(duration, down + rng.uniform(0.2, 0.5) * duration)
    return [_precursor(rng, PRIMARY, t0, down), _down(rng, PRIMARY, down, end)]


def _bad_pod(rng: random.Random, duration: float) -> list[Fault]:
    t0 = rng.uniform(0.1, 0.5) * duration
    end = min(duration, t0 + rng.uniform(0.15, 0.4) * duration)
    return [Fault(PRIMARY, t0, end, errors={500: rng.uniform(0.2, 0.5)})]


def _creep(rng: random.Random, duration: float) -> list[Fault]:
    t0 = rng.uniform(0.1, 0.4) * duration
    ramp = rng.uniform(0.15, 0.4) * duration
    end = min(duration, t0 + ramp + rng.uniform(0.1, 0.3) * duration)
    return [Fault(PRIMARY, t0, end, rng.uniform(3, 12), ramp)]


def _rate_limits(rng: random.Random, duration: float) -> list[Fault]:
    t0 = rng.uniform(0.1, 0.5) * duration
    provider = rng.choice((PRIMARY, BACKUP))
    share = rng.uniform(0.3, 0.8)
    end = min(duration, t0 + rng.uniform(0.1, 0.3) * duration)
    return [Fault(provider, t0, end, rate_limited=share, retry_after_s=2.0)]


def _regional(rng: random.Random, duration: float) -> list[Fault]:
    t0 = rng.uniform(0.25, 0.5) * duration
    end = min(duration, t0 + rng.uniform(0.2, 0.4) * duration)
    return [_down(rng, PRIMARY, t0, end), _down(rng, BACKUP, t0 + rng.uniform(0, 3), end)]


def _quiet(rng: random.Random, duration: float) -> list[Fault]:
    return []


#: name → (weight, draw); the chain is unavailable at some point in cascade and regional.
TEMPLATES: dict[str, tuple[float, _Draw]] = {
    "cascade": (0.35, _cascade),
    "primary-outage": (0.15, _primary_outage),
    "bad-pod": (0.15, _bad_pod),
    "creep": (0.1, _creep),
    "rate-limits": (0.1, _rate_limits),
    "regional": (0.1, _regional),
    "quiet": (0.05, _quiet),
}


def generate(
    n: int,
    seed: int,
    *,
    duration_s: float = 120.0,
    time_scale: float = 0.1,
    rate: float = 4.0,
    templates: Sequence[str] = (),
) -> list[tuple[str, Scenario]]:
    """``n`` scenarios (template name, scenario), drawn from ``seed``; ``templates`` cycles
    through the named templates instead of drawing them (the tests' fixed mix)."""
    rng = random.Random(seed)
    names = list(TEMPLATES)
    weights = [TEMPLATES[t][0] for t in names]
    out = []
    for i in range(n):
        template = templates[i % len(templates)] if templates else rng.choices(names, weights)[0]
        faults = TEMPLATES[template][1](rng, duration_s)
        out.append(
            (
                template,
                Scenario(
                    path=Path(f"generated-{seed}-{i}"),
                    name=f"{template}-{seed}-{i}",
                    description=f"generated from template {template}",
                    duration_s=duration_s,
                    time_scale=time_scale,
                    seed=seed * 1000 + i,
                    replicas=1,
                    providers={
                        PRIMARY: Provider(PRIMARY, "eu-west-1", rng.uniform(300, 600), 15.0),
                        BACKUP: Provider(BACKUP, "eu-west-1", rng.uniform(400, 800), 15.0),
                    },
                    models={"chat": {"chain": list(_CHAIN)}},
                    traffic=(Traffic({"chat": rate}, 0.7, (20, 120), 16),),
                    faults=tuple(faults),
                    variants=(RECORD,),
                ),
            )
        )
    return out


def line_down(scenario: Scenario, provider: str, t: float) -> bool:
    """Whether ``provider`` fails at least DOWN_SHARE of its requests at ``t``."""
    share, multiplier = 0.0, 1.0
    for fault in scenario.faults:
        if fault.provider != provider or not fault.active(t):
            continue
        share += sum(fault.errors.values()) + fault.rate_limited + fault.refused + fault.cut
        multiplier = max(multiplier, fault.multiplier(t))
    slow = scenario.providers[provider].first_token_ms * multiplier > _ATTEMPT_TIMEOUT_MS
    return share >= DOWN_SHARE or slow


def chain_down(scenario: Scenario, model: str, t: float) -> bool:
    """Whether every line of ``model``'s chain is down at ``t``."""
    return all(line_down(scenario, line["provider"], t) for line in scenario.models[model]["chain"])
