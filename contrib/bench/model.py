"""What run.py measures: scenarios, targets, their goals and results."""

from __future__ import annotations

from dataclasses import dataclass, field

P99_FACTOR_TARGET = 2.0  # every Prism profile: p99 at c16 and c64 <= 2 x the bare proxy's

# --------------------------------------------------------------------------- model


@dataclass(frozen=True)
class Scenario:
    stream: bool
    concurrency: int

    @property
    def label(self) -> str:
        return f"{'stream' if self.stream else 'non-stream'} c{self.concurrency}"

    @property
    def wrk_threads(self) -> int:
        return 1 if self.concurrency == 1 else 2


@dataclass(frozen=True)
class Goal:
    """What a Prism profile must reach against the bare proxy in the same run."""

    ratio: float  # req/s at c16 at least this times the bare proxy's
    p50_delta_ms: float  # p50 at c1 at most the bare proxy's plus this


#: The targets (see README.md): every feature on at 0.85x the bare proxy; the fleet is
#: held to the full profile's.
GOALS = {"prism": Goal(0.8, 0.3), "full": Goal(0.85, 1.0), "fleet": Goal(0.85, 1.0)}


@dataclass(frozen=True)
class Target:
    key: str  # "direct" | "bare" | "prism" | "full" | a peer's name
    label: str
    url: str
    #: The server's process (its CPU per request is measured; None: not ours to read).
    pid: int | None = None
    #: An API key wrk sends (the full profile), and other headers (peers).
    key_header: str | None = None
    headers: tuple[tuple[str, str], ...] = ()
    #: Why the target could not be measured (a peer that did not install or start).
    broken: str | None = None
    #: A slow target (LiteLLM) completes too few calls in a short round to count.
    min_seconds: int = 0
    #: Every request's prompt distinct (``BENCH_DISTINCT``): a response cache misses all.
    distinct: bool = False
    #: More gateways behind the target (the fleet): wrk's threads split between
    #: ``url``'s port and these (``BENCH_PORTS``); their CPU counts with ``pid``'s.
    more_ports: tuple[int, ...] = ()
    more_pids: tuple[int, ...] = ()

    @property
    def goal(self) -> Goal | None:
        return GOALS.get(self.key)


@dataclass(frozen=True)
class Result:
    target: Target
    scenario: Scenario
    rps: float = 0.0
    p50_ms: float = 0.0
    p99_ms: float = 0.0
    requests: int = 0
    errors: dict[str, int] = field(default_factory=dict)
    failure: str | None = None  # wrk did not run or printed no result
    #: Requests/s of each round, in order (one entry for a single wrk run).
    round_rps: tuple[float, ...] = ()
    #: The server's CPU time (user + system, its process tree) per request, in µs.
    cpu_us: float | None = None

    @property
    def error_count(self) -> int:
        return sum(self.errors.values())

    @property
    def ok(self) -> bool:
        return self.failure is None and self.error_count == 0 and self.requests > 0


SCENARIOS = (
    Scenario(stream=False, concurrency=1),
    Scenario(stream=False, concurrency=16),
    Scenario(stream=False, concurrency=64),
    Scenario(stream=True, concurrency=1),
    Scenario(stream=True, concurrency=16),
    Scenario(stream=True, concurrency=64),
)
