"""The prism_proxy entry point ``cache``: an exact-match response cache, off unless configured.

``[prism:cache] store = memory`` keeps answers in this process (bounded by
``max_bytes``), ``store = redis`` in the fleet's Redis (prism-redis's
``shared-state`` service).  A hit is answered without an upstream call
(``prism_lookup``), in the caller's wire, streamed when the caller streams,
and settled with outcome ``cached``: billing prices it at the line's
``cache_price`` (0 unless set), limits count it at that price.
"""

from __future__ import annotations

import time
from collections.abc import Awaitable
from typing import Any

import attrs
import cachetools

from prism_proxy import (
    SHARED_STATE,
    Attempt,
    Binding,
    Call,
    CatalogKeys,
    CheckLine,
    ConfigError,
    Endpoint,
    Generation,
    Hit,
    ModelSpec,
    OrgSetting,
    Outcome,
    Settlement,
    Verdict,
    hookimpl,
    new_id,
)

from .entry import Entry, read_answer, render
from .policy import BINDING_KEYS, MODEL_KEYS, CallerSay, Policy, cache_price, caller_say
from .policy import check_catalog as _check_catalog
from .settings import SECTION, CacheSettings
from .stores import MemoryStore, RedisStore, Store

__all__ = ["CACHE_HEADER", "PLUGIN_OBJECT", "CacheHooks"]

CACHE_HEADER = "x-prism-cache"
#: The name each generation's hooks are registered under.
PLUGIN_OBJECT = "cache.hooks"
_EMBEDDINGS, _RESPONSES = Endpoint.EMBEDDINGS, Endpoint.RESPONSES
_OK = Outcome.OK


@attrs.define(eq=False)
class _Pending:
    """A call the cache looked at: where its answer goes, if it is kept."""

    key: str
    ttl_s: int
    model: ModelSpec
    write: bool


@attrs.define(eq=False)
class CacheHooks:
    """One generation's cache: its policy and the (kept) store."""

    settings: CacheSettings
    policy: Policy
    store: Store
    generation: Generation
    #: A priced copy of each line a hit names: billing and limits price it at ``cache_price``.
    #: Bounded: a wildcard model's lines are made per name, and callers choose the names.
    _priced: cachetools.LRUCache[Binding, Binding] = attrs.field(
        factory=lambda: cachetools.LRUCache(4096), init=False
    )

    @hookimpl
    def prism_lookup(self, call: Call) -> Awaitable[Hit | None] | None:
        model = call.model
        if call.traffic != "customer" or call.endpoint is _EMBEDDINGS or model is None:
            return None
        say = caller_say(call)
        policy, fingerprint = self.policy.of(model)
        reason = self.policy.bypass(call, policy) or (None if say.write else say.reason)
        if reason is not None:
            call.response_headers[CACHE_HEADER] = f"bypass; reason={reason}"
            self._count(model, "bypass")
            return None
        ttl = policy.ttl_s or self.settings.ttl_s
        if say.ttl_s is not None:
            ttl = min(ttl, say.ttl_s)
        pending = _Pending(self.policy.key(call, fingerprint), ttl, model, say.write)
        call.extensions[SECTION] = pending
        call.keep_answer = self.settings.max_entry_bytes
        if not say.read or self._followed_up(call):
            reason = say.reason or "responses-stream"
            call.response_headers[CACHE_HEADER] = f"miss; reason={reason}"
            self._count(model, "miss")
            return None
        return self._look(call, pending, say)

    async def _look(self, call: Call, pending: _Pending, say: CallerSay) -> Hit | None:
        blob = await self.store.get(pending.key)
        entry = Entry.loads(blob) if blob is not None else None
        chain = pending.model.chain
        age = 0.0 if entry is None else max(self.store.now() - entry.stored_at, 0.0)
        if (
            entry is None
            or not 0 <= entry.line < len(chain)
            or (say.ttl_s is not None and age > say.ttl_s)
        ):
            call.response_headers[CACHE_HEADER] = "miss"
            self._count(pending.model, "miss")
            return None
        call.extensions.pop(SECTION, None)  # a hit is not stored again
        call.keep_answer = 0
        call.response_headers[CACHE_HEADER] = "hit"
        call.response_headers["age"] = str(int(age))
        self._count(pending.model, "hit")
        self.generation.telemetry.count(
            "prism_cache_tokens_saved_total",
            entry.input_tokens + entry.output_tokens,
            model=pending.model.name,
        )
        binding = self._priced_line(chain[entry.line])
        attempt = Attempt(
            number=0,
            binding=binding,
            id=new_id("att_"),
            started_at=self.generation.clock(),
            generation=self.generation.number,
            status=200,
            verdict=Verdict(_OK, "cache hit"),
            finish_reason="tool_calls" if entry.calls else "stop",
        )
        settlement = Settlement(outcome="cached", status=200, served=attempt, usage=entry.usage)
        suffix = call.request_id.removeprefix("req_")
        body, tail = render(
            call.endpoint, call.stream, entry, suffix, call.include_usage, call.body
        )
        return Hit(body=body, tail=tail, settlement=settlement)

    @staticmethod
    def _followed_up(call: Call) -> bool:
        """A streamed Responses call the core keeps for ``previous_response_id``: the core
        keeps only what an upstream streamed, so a replayed stream would leave a
        follow-up on it 404.  It is looked up never, stored as any other."""
        return call.stream and call.endpoint is _RESPONSES and call.body.get("store") is not False

    def _priced_line(self, line: Binding) -> Binding:
        priced = self._priced.get(line)
        if priced is None:
            where = f"models.*.chain[{line.id}]"
            price = cache_price(line, where, self.generation.catalog.source)
            options = {**line.options, "price": price}
            priced = self._priced[line] = Binding(
                line.provider, line.model, options=options, region=line.region
            )
        return priced

    def _count(self, model: ModelSpec, result: str) -> None:
        self.generation.telemetry.count(
            "prism_cache_lookups_total", model=model.name, result=result
        )

    @hookimpl
    def prism_settle(self, call: Call, settlement: Settlement) -> None:
        pending = call.extensions.get(SECTION)
        if not isinstance(pending, _Pending) or not pending.write:
            return
        answer, usage, served = settlement.answer, settlement.usage, settlement.served
        if (
            settlement.outcome != "ok"
            or answer is None
            or usage is None
            or usage.estimated
            or usage.suspect
            or served is None
        ):
            return
        line = next((i for i, b in enumerate(pending.model.chain) if b is served.binding), None)
        if line is None:
            return  # served by a line outside the model's chain (a fallback model, a rule)
        read = read_answer(call.endpoint, call.stream, answer)
        if read is None:
            return
        entry = Entry(
            text=read.text,
            model=read.model or served.binding.model,
            line=line,
            input_tokens=usage.input_tokens,
            output_tokens=usage.output_tokens,
            stored_at=self.store.now(),
            calls=read.calls,
        )
        blob = entry.dumps()
        if len(blob) <= self.settings.max_entry_bytes:
            self.store.put(pending.key, blob, pending.ttl_s)


def _on_off(text: str) -> bool:
    value = text.strip().lower()
    if value in ("on", "true", "yes"):
        return True
    if value in ("off", "false", "no"):
        return False
    raise ValueError(f"expected on or off, got {text[:32]!r}")


@hookimpl
def prism_catalog_keys() -> CatalogKeys:
    return CatalogKeys(model=MODEL_KEYS, binding=BINDING_KEYS)


@hookimpl
def prism_settings() -> dict[str, type[Any]]:
    return {SECTION: CacheSettings}


@hookimpl
def prism_org_settings() -> list[OrgSetting]:
    return [
        OrgSetting(
            "cache", _on_off, help="off: this organisation's calls are never answered from cache"
        )
    ]


@hookimpl
def prism_generation(generation: Generation) -> None:
    settings = CacheSettings.from_config(generation.config)
    catalog = generation.catalog
    _check_catalog(catalog)  # a mistaken key is a mistake even with the cache off
    if not settings.enabled:
        return
    store: Store
    if settings.store == "redis":
        link = generation.services.get(SHARED_STATE)
        if link is None:
            raise ConfigError(
                settings_source(generation),
                f"[prism:{SECTION}] store",
                "redis needs prism-redis installed and [prism:redis] url set",
            )
        redis = generation.keep(
            ("cache.redis", link),
            lambda: RedisStore(link, settings.redis_timeout_ms / 1000, time.time),
        )
        redis.timeout_s = settings.redis_timeout_ms / 1000  # a reload may change it
        store = redis
    else:
        store = generation.keep(
            ("cache.memory", settings.max_bytes),
            lambda: MemoryStore(settings.max_bytes, generation.clock),
        )
    policy = Policy(catalog.source, settings.ttl_s)
    generation.register(CacheHooks(settings, policy, store, generation), PLUGIN_OBJECT)


@hookimpl
def prism_check(generation: Generation, offline: bool) -> list[CheckLine]:
    settings = CacheSettings.from_config(generation.config)
    if not settings.enabled:
        return [CheckLine("cache", f"off: no [prism:{SECTION}] store")]
    where = (
        "redis (prism-redis's shared state; its own line says whether it answers)"
        if settings.store == "redis"
        else f"memory, at most {settings.max_bytes} bytes per process"
    )
    return [CheckLine("cache", f"on, {where}; entries kept {settings.ttl_s} s by default")]


def settings_source(generation: Generation) -> str:
    return generation.config.source
