"""The ``full`` profile: Prism as an operator runs it, every bundled plugin on.

keys (the load generator sends a real key), billing (prices, the ledger on
SQLite at ``synchronous = full``), the breaker, regions (an allowed region by
default), 200 routing rules of which none match, metrics, the timeout header,
prism-limits with one limit of each kind applying to the key's organisation,
prism-cache (memory store, the model's answers all cacheable: the load sends
every prompt distinct, so every call is a miss that is stored) and
prism-responses loaded while the load calls chat.  ``without`` leaves one
plugin out (and the configuration only it reads), so that full minus that
plugin shows what the plugin costs.  ``classic=True`` is the full profile as
it was before limits, cache and responses joined it (:data:`CLASSIC_PLUGINS`):
the base of the limits profile, and what ``compare.py`` serves a build that
lacks those plugins.

The ``limits`` profile is the full profile plus prism-limits, in the variants
of :data:`LIMITS_VARIANTS`: no limit applying to the bench key's organisation,
limits applying counted in the process, and the same counted in Redis (beside
the full profile with prism-redis alone, whose breaker shares its state there
too, so that the limits' own share of the Redis variant can be told apart).
"""

from __future__ import annotations

import argparse
import http.client
import json
import secrets
import subprocess
import sys
import urllib.parse
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

__all__ = [
    "BENCH_LIMITS",
    "CLASSIC_PLUGINS",
    "FULL_PLUGINS",
    "Fleet",
    "LIMITS_VARIANTS",
    "RULES",
    "LimitsVariant",
    "add_profile",
    "forget_prefixes",
    "limits_prefix",
    "redis_answers",
    "shown",
    "verify_variant",
    "write_full_profile",
]

#: The plugins the classic full profile turns on (the provider kind is always there).
CLASSIC_PLUGINS = ("keys", "billing", "breaker", "regions", "rules", "metrics", "timeout-header")
#: The plugins the full profile turns on: the classic ones, limits that apply, a cache
#: that misses every time, and the Responses API loaded but off the measured path.
FULL_PLUGINS = (*CLASSIC_PLUGINS, "limits", "cache", "responses")
RULES = 200
MODEL = "bench"
#: The bench organisation's limits when they apply: one of each kind, all high enough
#: never to refuse a call of the bench (the budget reserves a call's worst case, about 2
#: with no max_tokens sent: 500,000 calls in flight before it would refuse).
BENCH_LIMITS = (
    "rpm=100000000",
    "tpm=100000000000",
    "max_parallel=100000",
    "budget=1000000/month",
)
#: Redis commands may take this long before Redis counts as down: under callgrind a
#: reply waits out other calls' work at a fiftieth of the speed, and the bench must
#: measure the fleet's counters, not the fallback to local ones.
REDIS_TIMEOUT_MS = 5000


@dataclass(frozen=True)
class Fleet:
    """Where a fleet profile's gateways share their state (``fleet.py`` makes it)."""

    postgres_url: str
    redis_url: str
    prefix: str


@dataclass(frozen=True)
class LimitsVariant:
    """One target of the limits profile: the full profile plus what it says."""

    name: str
    #: prism-limits loaded.
    limits: bool
    #: The bench organisation has :data:`BENCH_LIMITS` (else no limit applies to its key).
    applying: bool
    #: prism-redis configured: the limits' counters and the breaker's state in Redis.
    redis: bool
    #: The target it is judged against (measured in the same run).
    reference: str = "full"


LIMITS_VARIANTS = (
    LimitsVariant("full+limits none", limits=True, applying=False, redis=False),
    LimitsVariant("full+limits local", limits=True, applying=True, redis=False),
    LimitsVariant("full+redis", limits=False, applying=False, redis=True),
    LimitsVariant(
        "full+limits redis", limits=True, applying=True, redis=True, reference="full+redis"
    ),
)


def add_profile(
    parser: argparse.ArgumentParser, full: str, limits: str | None = None, fleet: str | None = None
) -> None:
    """``--profile default|full|full-classic`` (``|limits``, ``|fleet`` when ``limits``,
    ``fleet`` say what those add)."""
    extra = {"limits": limits, "fleet": fleet}
    choices = ["default", "full", "full-classic", *(k for k, v in extra.items() if v)]
    text = (
        f"full: {full}; full-classic: the same as before limits, cache and responses "
        "joined the full profile"
        + "".join(f"; {name}: {what}" for name, what in extra.items() if what)
    )
    parser.add_argument("--profile", choices=choices, default="default", help=text)


def _catalog(upstream_base: str, without: str | None, cache: bool) -> str:
    price = ", price = { input = 1.0, output = 2.0 }" if without != "billing" else ""
    out = [
        "[providers.upstream]",
        'kind = "openai"',
        f'base_url = "{upstream_base}"',
        'region = "eu-west-1"',
        "",
        f"[models.{MODEL}]",
        f'chain = [ {{ provider = "upstream", model = "{MODEL}"{price} }} ]',
    ]
    if cache:
        # The bench's request sets no temperature: the model says any answer may be kept.
        out.append('cache = "all"')
    if without != "rules":
        for i in range(RULES):
            out += [
                f"[[models.{MODEL}.rules]]",
                f'name = "tenant-{i}"',
                f'when = {{ "metadata.tenant" = "t{i}" }}',
                f'chain = [ {{ provider = "upstream", model = "{MODEL}" }} ]',
            ]
    return "\n".join(out) + "\n"


def write_full_profile(
    directory: Path,
    port: int,
    upstream_base: str,
    *,
    without: str | None = None,
    variant: LimitsVariant | None = None,
    redis: tuple[str, str] | None = None,
    env: Mapping[str, str] | None = None,
    classic: bool = False,
    fleet: Fleet | None = None,
) -> tuple[Path, str | None]:
    """The configuration (and the API key the load must send, None without keys).

    With ``variant``, the limits profile's target it names (on the classic full
    profile); ``redis`` is then the URL and the key prefix of the Redis its state
    is shared in (if it uses one).  With ``fleet``, the full profile on shared
    state: keys and the ledger in PostgreSQL, the breaker's state, the limits'
    counters and the cache in Redis.
    """
    from run import installed_plugin_names

    classic = classic or variant is not None
    plugins = CLASSIC_PLUGINS if classic else FULL_PLUGINS
    cache = "cache" in plugins and without != "cache"
    directory.mkdir(parents=True, exist_ok=True)
    (directory / "catalog.toml").write_text(_catalog(upstream_base, without, cache))
    keep = {"openai", *plugins} - {without}
    sections = {
        "keys": "[prism:keys]\ndb_path = keys.sqlite\n",
        "billing": "[prism:billing]\nledger_path = ledger.sqlite\nsynchronous = full\n",
        "regions": "[prism:regions]\ndefault = eu-west-1\n",
    }
    if cache:
        sections["cache"] = "[prism:cache]\nstore = memory\n"
    if fleet is not None:
        keep.add("redis")
        sections["keys"] = f"[prism:keys]\ndb_url = {fleet.postgres_url}\n"
        sections["billing"] = (
            f"[prism:billing]\nledger_url = {fleet.postgres_url}\nspool_path = off\n"
        )
        sections["redis"] = f"[prism:redis]\nurl = {fleet.redis_url}\nkey_prefix = {fleet.prefix}\n"
        if cache:
            sections["cache"] = "[prism:cache]\nstore = redis\n"
    if variant is not None and variant.limits:
        keep.add("limits")
    if variant is not None and variant.redis:
        if redis is None:
            raise ValueError(f"{variant.name} needs a Redis URL and key prefix")
        keep.add("redis")
        url, prefix = redis
        sections["redis"] = (
            f"[prism:redis]\nurl = {url}\nkey_prefix = {prefix}\ntimeout_ms = {REDIS_TIMEOUT_MS}\n"
        )
    disable = sorted(set(installed_plugin_names()) - keep)
    ini = directory / "prism.ini"
    ini.write_text(
        "[prism]\n"
        f"listen = 127.0.0.1:{port}\n"
        "catalog = catalog.toml\n"
        "log_level = WARNING\n"
        "shutdown_grace_s = 1\n"
        + (f"disable = {', '.join(disable)}\n" if disable else "")
        + "".join(text for name, text in sections.items() if name != without)
    )
    key = None
    if without != "keys":
        key = _create_key(ini, env=env)
        applying = variant.applying if variant is not None else "limits" in keep
        if applying:
            _keys_cli(ini, "org-set", "bench", *BENCH_LIMITS, env=env)
    return ini, key


def _create_key(ini: Path, argv: Sequence[str] = (), env: Mapping[str, str] | None = None) -> str:
    made = _keys_cli(ini, "create", "--org", "bench", "--scopes", "*", *argv, env=env)
    return made.strip().splitlines()[-1]


def _keys_cli(ini: Path, action: str, *argv: str, env: Mapping[str, str] | None = None) -> str:
    """``prism keys ACTION --config INI ARGV...``; its output (what it failed with, raised).

    ``env``: the environment of the build under test (compare.py's older build), so
    that the key database is written by the prism-keys that will read it."""
    done = subprocess.run(
        [sys.executable, "-m", "prism_proxy.cli", "keys", action, "--config", str(ini), *argv],
        capture_output=True, text=True, timeout=60, check=False,
        env=None if env is None else dict(env),
    )  # fmt: skip
    if done.returncode != 0:
        raise RuntimeError(f"prism keys {action} failed: {done.stderr.strip()[-500:]}")
    return done.stdout


def limits_prefix() -> str:
    """A Redis key prefix of this run's own (the limits profile's targets add ``-N``)."""
    return f"prism-bench-limits-{secrets.token_hex(4)}"


def redis_answers(url: str) -> str | None:
    """None if the Redis at ``url`` answers a PING, else why not (its password never shown)."""
    import redis

    client = redis.Redis.from_url(url, socket_timeout=2, socket_connect_timeout=2)
    try:
        client.ping()
    except redis.RedisError as exc:
        return f"no Redis answers at {shown(url)} ({type(exc).__name__})"
    finally:
        client.close()
    return None


def shown(url: str) -> str:
    """``url`` without its user and password: fit to print."""
    parts = urllib.parse.urlsplit(url)
    if parts.username is None and parts.password is None:
        return url
    host = parts.hostname or ""
    netloc = f"***@{host}" + (f":{parts.port}" if parts.port is not None else "")
    return urllib.parse.urlunsplit(parts._replace(netloc=netloc))


def forget_prefixes(url: str, prefixes: Sequence[str]) -> None:
    """Delete every key under ``prefixes`` (``PREFIX:*``) in the Redis at ``url``."""
    import redis

    client = redis.Redis.from_url(url, socket_timeout=5, socket_connect_timeout=2)
    try:
        for prefix in prefixes:
            keys = list(client.scan_iter(match=f"{prefix}:*", count=500))
            if keys:
                client.delete(*keys)
    except redis.RedisError as exc:
        # A Redis that never answered holds nothing of ours; one that went away is said.
        print(f"could not delete {', '.join(prefixes)}:* at {shown(url)} ({type(exc).__name__})")
    finally:
        client.close()


def verify_variant(port: int, variant: LimitsVariant, key: str | None) -> str | None:
    """None if the target on ``port`` is what ``variant`` says, else what differs.

    One call (is it served, does it carry the limits' headers?) and ``/readyz``
    (is prism-limits loaded, counting in Redis or in the process?): a Redis
    that timed out under load would have the limits fall back to local counters
    and the Redis variant measure the wrong thing, silently.
    """
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=60)
    try:
        body = json.dumps({"model": MODEL, "messages": [{"role": "user", "content": "hi"}]})
        headers = {"Content-Type": "application/json"}
        if key is not None:
            headers["Authorization"] = f"Bearer {key}"
        conn.request("POST", "/v1/chat/completions", body, headers)
        answer = conn.getresponse()
        answer.read()
        if answer.status != 200:
            return f"a call was answered {answer.status}"
        limited = answer.getheader("x-ratelimit-limit-requests") is not None
        conn.request("GET", "/readyz")
        ready = json.loads(conn.getresponse().read())
    except (OSError, ValueError) as exc:
        return f"could not check it: {type(exc).__name__}"
    finally:
        conn.close()
    problems = []
    if limited != variant.applying:
        problems.append("limits applied" if limited else "no limit applied")
    if ("limits" in ready.get("plugins", ())) != variant.limits:
        problems.append(f"plugins loaded: {ready.get('plugins')}")
    counted = (ready.get("limits") or {}).get("counted")
    if variant.limits and counted != ("fleet" if variant.redis else "per process"):
        problems.append(f"limits counted {counted!r}")
    return "; ".join(problems) or None
