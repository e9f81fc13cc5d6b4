"""The fleet profile: two gateways sharing PostgreSQL and Redis, and their round trips.

``run.py --profile fleet`` serves the full profile as a fleet runs it: keys and
the ledger in PostgreSQL, the breaker's state, the limits' counters and the
cache in Redis (prism-redis), from two ``prism serve`` processes that wrk's
threads split between them (``BENCH_PORTS`` in ``post.lua``).  Each run makes
a database of its own (dropped at the end) and a Redis key prefix of its own
(its keys deleted at the end).

Round trips per call are read around every measured run of the fleet:

- Redis, by kind, from each gateway's ``/readyz`` (prism-redis counts each
  round trip it makes under a kind: ``limits_admit``, ``cache``, ...), sorted
  into those a call awaits and those made in the background (see
  :data:`AWAITED`), and Redis's own ``total_commands_processed`` (server-wide:
  other clients of the same Redis count in it too);
- PostgreSQL, from ``pg_stat_database`` for the run's database alone:
  transactions committed, of which the ledger's commits (the gateways'
  ``billing_commits``: a call awaits its row's commit) and the rest (keys).
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import secrets
import shutil
import urllib.parse
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path

from profiles import Fleet, forget_prefixes, shown, write_full_profile

__all__ = ["AWAITED", "HALF_AWAITED", "FleetTrips", "Trips", "fleet_state", "write_fleet"]

#: Redis round-trip kinds a call waits for: the limits' admission.  The cache's
#: lookup is awaited too, its store is not, and both count under ``cache``: the
#: fleet's prompts are all distinct, every lookup a miss followed by one store, so
#: half of ``cache`` is counted awaited and half background.  Every other kind runs
#: in the background (settlement, renewals, the breaker's exchange, pings).
AWAITED = frozenset({"limits_admit"})
HALF_AWAITED = frozenset({"cache"})


@contextlib.contextmanager
def fleet_state(postgres: str, redis_url: str) -> Iterator[Fleet]:
    """A database and a Redis prefix of this run's own, dropped after it."""
    word = secrets.token_hex(4)
    database = f"prism_bench_{word}"
    asyncio.run(_admin(postgres, f'CREATE DATABASE "{database}"'))
    parts = urllib.parse.urlsplit(postgres)
    url = urllib.parse.urlunsplit(parts._replace(path=f"/{database}"))
    fleet = Fleet(postgres_url=url, redis_url=redis_url, prefix=f"prism-bench-fleet-{word}")
    try:
        yield fleet
    finally:
        forget_prefixes(redis_url, [fleet.prefix])
        try:
            asyncio.run(_admin(postgres, f'DROP DATABASE IF EXISTS "{database}" WITH (FORCE)'))
        except Exception as exc:  # said, not raised: the run's figures are already out
            print(f"could not drop {database} at {shown(postgres)}: {type(exc).__name__}")


async def _admin(postgres: str, statement: str) -> None:
    import asyncpg

    conn = await asyncpg.connect(postgres, timeout=10)
    try:
        await conn.execute(statement)
    finally:
        await conn.close()


def write_fleet(
    directory: Path, ports: Sequence[int], upstream_base: str, fleet: Fleet
) -> tuple[list[Path], str | None]:
    """One configuration per gateway (the same but for ``listen``) and the API key."""
    first, key = write_full_profile(directory / "gw0", ports[0], upstream_base, fleet=fleet)
    inis = [first]
    for number, port in enumerate(ports[1:], start=1):
        here = directory / f"gw{number}"
        here.mkdir(parents=True, exist_ok=True)
        shutil.copy(first.parent / "catalog.toml", here / "catalog.toml")
        text = first.read_text().replace(f":{ports[0]}\n", f":{port}\n", 1)
        (here / "prism.ini").write_text(text)
        inis.append(here / "prism.ini")
    return inis, key


@dataclass
class Trips:
    """Counters summed over the fleet's gateways, at one moment."""

    redis: dict[str, int] = field(default_factory=dict)
    redis_server: int = 0
    pg_commits: int = 0
    ledger_commits: int = 0

    def minus(self, other: Trips) -> Trips:
        kinds = set(self.redis) | set(other.redis)
        return Trips(
            {k: self.redis.get(k, 0) - other.redis.get(k, 0) for k in kinds},
            self.redis_server - other.redis_server,
            self.pg_commits - other.pg_commits,
            self.ledger_commits - other.ledger_commits,
        )

    def plus(self, other: Trips) -> Trips:
        kinds = set(self.redis) | set(other.redis)
        return Trips(
            {k: self.redis.get(k, 0) + other.redis.get(k, 0) for k in kinds},
            self.redis_server + other.redis_server,
            self.pg_commits + other.pg_commits,
            self.ledger_commits + other.ledger_commits,
        )


class FleetTrips:
    """Reads the fleet's round trips around each measured run (``run.measure``'s hook)."""

    def __init__(
        self, ports: Sequence[int], fleet: Fleet, admin_url: str, target_key: str = "fleet"
    ) -> None:
        self.ports = list(ports)
        self.fleet = fleet
        #: Statistics are read from another database: reading them in the run's own
        #: would count the reads among its transactions.
        self.admin_url = admin_url
        self.target_key = target_key
        #: Per scenario label: (calls, trips), summed over its measured runs.
        self.cells: dict[str, tuple[int, Trips]] = {}
        self._last = self.read()

    def read(self) -> Trips:
        from run import http_request

        trips = Trips()
        for port in self.ports:
            with contextlib.suppress(OSError, ValueError, KeyError):
                _, body = http_request(port, "GET", "/readyz")
                kinds = json.loads(body).get("redis", {}).get("round_trips", {})
                for kind, count in kinds.items():
                    trips.redis[kind] = trips.redis.get(kind, 0) + int(count)
            with contextlib.suppress(OSError, ValueError, KeyError):
                _, body = http_request(port, "GET", "/prism/stats")
                counters = json.loads(body)["counters"]
                trips.ledger_commits += int(counters.get("billing_commits", 0))
        trips.redis_server = self._redis_commands()
        trips.pg_commits = asyncio.run(self._pg_commits())
        return trips

    def _redis_commands(self) -> int:
        import redis

        client = redis.Redis.from_url(self.fleet.redis_url, socket_timeout=2)
        try:
            return int(client.info("stats")["total_commands_processed"])
        except redis.RedisError:
            return 0
        finally:
            client.close()

    async def _pg_commits(self) -> int:
        import asyncpg

        database = urllib.parse.urlsplit(self.fleet.postgres_url).path.lstrip("/")
        try:
            conn = await asyncpg.connect(self.admin_url, timeout=5)
        except (OSError, asyncpg.PostgresError):
            return 0
        try:
            # The statistics collector reports with a delay: ask for a fresh snapshot.
            await conn.execute("SELECT pg_stat_clear_snapshot()")
            value = await conn.fetchval(
                "SELECT xact_commit FROM pg_stat_database WHERE datname = $1", database
            )
            return int(value or 0)
        finally:
            await conn.close()

    def __call__(self, target: object, scenario: object, result: object) -> None:
        now = self.read()
        key = getattr(target, "key", None)
        if key == self.target_key:
            label = str(getattr(scenario, "label", "?"))
            calls, trips = self.cells.get(label, (0, Trips()))
            requests = int(getattr(result, "requests", 0))
            self.cells[label] = (calls + requests, trips.plus(now.minus(self._last)))
        self._last = now

    def lines(self) -> list[str]:
        """Per scenario: round trips per call, awaited and background."""
        out = [
            "fleet round trips per call (two gateways; Redis by kind from /readyz, "
            "PostgreSQL from pg_stat_database of the run's database):"
        ]
        for label, (calls, trips) in self.cells.items():
            if calls <= 0:
                continue
            halves = sum(trips.redis.get(kind, 0) for kind in HALF_AWAITED) / 2
            awaited = (sum(trips.redis.get(kind, 0) for kind in AWAITED) + halves) / calls
            total = sum(trips.redis.values())
            background = total / calls - awaited
            kinds = ", ".join(
                f"{kind} {n / calls:.3f}" for kind, n in sorted(trips.redis.items()) if n
            )
            ledger = trips.ledger_commits / calls
            other = max(trips.pg_commits - trips.ledger_commits, 0) / calls
            out.append(
                f"  {label:<14} {calls} calls: Redis {awaited:.2f} awaited + {background:.2f} "
                f"background [{kinds}]; "
                f"Redis server commands {trips.redis_server / calls:.2f} (all clients); "
                f"PostgreSQL commits {trips.pg_commits / calls:.3f} "
                f"(ledger {ledger:.3f} awaited, other {other:.3f})"
            )
        return out
