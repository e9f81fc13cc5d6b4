"""The gateway's in-memory copy of the active keys, refreshed in the background.

Authentication is a synchronous decision hook, so it reads this snapshot and
never touches the database.  A background task polls the database's revision
every ``refresh_s`` and swaps in a fresh snapshot when it changed: a key
revoked with ``prism keys revoke`` stops working within one interval.  With
a PostgreSQL database (``db_url``) the ring also LISTENs for the ``NOTIFY``
every change sends and refreshes at once; the poll stays as the fallback
(and re-LISTENs when that connection was lost).  The
database stays open from start-up to shutdown, so polling needs no new file
handle and goes on working when the process has none left to give.

The snapshot also holds every organisation's tags and settings and every
active key's own settings as stored (text), read in the same transaction as
the keys; each generation's :class:`KeysAuth <prism_keys.auth.KeysAuth>`
parses them with the declarations it was built with.
"""

from __future__ import annotations

import asyncio
import contextlib
import hmac
import logging
import types
from collections.abc import AsyncIterator, Awaitable, Callable, Mapping
from typing import Any

import attrs

from prism_proxy import Principal, background

from .pg_store import PgKeyStore
from .scopes import Grants
from .store import KeyStore, Loaded, LoadedKey
from .tokens import _NO_MATCH, hash_key, key_id_of

__all__ = ["NO_SETTINGS", "ActiveKey", "KeyRing", "Snapshot"]

log = logging.getLogger("prism.keys")

#: The settings of a principal whose organisation has none (read-only, shared).
NO_SETTINGS: Mapping[str, Any] = types.MappingProxyType({})


@attrs.frozen
class ActiveKey:
    """One usable key: its hash, the principal it stands for and what it may use."""

    hash: str = attrs.field(repr=False)
    principal: Principal
    grants: Grants
    #: When it stops working (Unix seconds), if ever.
    expires_at: float | None = None
    #: Its text before a rotation, accepted until ``previous_until``.
    previous_hash: str | None = attrs.field(default=None, repr=False)
    previous_until: float | None = None
    #: Its organisation is disabled: refused with ``org_disabled`` until re-enabled.
    org_disabled: bool = False

    def expired(self, now: float) -> bool:
        return self.expires_at is not None and now >= self.expires_at

    @classmethod
    def from_loaded(cls, row: LoadedKey) -> ActiveKey:
        principal = Principal(
            key_id=row.key_id,
            org=row.org,
            org_tags=frozenset(row.org_tags),
            scopes=frozenset(row.scopes),
            settings=NO_SETTINGS,
            key_settings=NO_SETTINGS,
        )
        return cls(
            hash=row.hash,
            principal=principal,
            grants=Grants.from_scopes(row.scopes),
            expires_at=row.expires_at,
            previous_hash=row.previous_hash,
            previous_until=row.previous_until,
            org_disabled=row.org_disabled,
        )


@attrs.frozen
class Snapshot:
    revision: int
    keys: Mapping[str, ActiveKey]
    #: Organisation settings as stored (text), by organisation then name; not parsed.
    settings: Mapping[str, Mapping[str, str]] = attrs.field(factory=dict)
    #: The active keys' own settings as stored (text), by key id then name; not parsed.
    key_settings: Mapping[str, Mapping[str, str]] = attrs.field(factory=dict)
    #: Every organisation in the database (with active keys or not) and its tags.
    orgs: Mapping[str, tuple[str, ...]] = attrs.field(factory=dict)


_EMPTY = Snapshot(revision=-1, keys={})


@attrs.define(eq=False)
class KeyRing:
    store: KeyStore | PgKeyStore
    refresh_s: float
    #: Replaced whole on refresh, never mutated: readers need no lock.
    snapshot: Snapshot = _EMPTY
    _refreshed: asyncio.Event | None = attrs.field(default=None, init=False)
    _refresh_lock: asyncio.Lock = attrs.field(factory=asyncio.Lock, init=False)
    #: The store's connection generation the snapshot was read from.
    _generation: int = attrs.field(default=-1, init=False)
    #: Set by a PostgreSQL notification (a change committed): the poll runs at once.
    _wake: asyncio.Event = attrs.field(factory=asyncio.Event, init=False)
    #: Whether the last attempt to LISTEN failed (logged once until it works again).
    _listen_failed: bool = attrs.field(default=False, init=False)
    #: Writes a batch of last-use times (key id → Unix seconds); None: not recorded.
    last_used_writer: Callable[[dict[str, float]], Awaitable[None]] | None = None
    #: Seconds between writes of last-use times.
    flush_s: float = 10.0
    #: Last-use times noted since the last flush, by key id.
    used: dict[str, float] = attrs.field(factory=dict, init=False)

    @property
    def source(self) -> str:
        """The key database as it may be logged (never a password)."""
        if isinstance(self.store, PgKeyStore):
            return self.store.name
        return str(self.store.path)

    @property
    def loaded(self) -> bool:
        """Whether a snapshot was read (a generation nobody started has none)."""
        return self.snapshot is not _EMPTY

    async def _revision(self) -> int:
        if isinstance(self.store, PgKeyStore):
            return await self.store.revision()
        return await asyncio.to_thread(self.store.revision)

    async def _load(self) -> Loaded:
        if isinstance(self.store, PgKeyStore):
            return await self.store.load_active()
        return await asyncio.to_thread(self.store.load_active)

    def verify(self, presented: str | None, now: float | None = None) -> ActiveKey | None:
        """The active key ``presented`` is, or None (missing, malformed, unknown, revoked).

        With ``now`` (wall time), a rotated key's previous text is accepted
        until its grace period ends.  An expired key, and a key of a disabled
        organisation, are returned: the caller says ``key_expired`` or
        ``org_disabled`` (only to someone who holds the key's text).
        """
        if not presented:
            return None
        key_id = key_id_of(presented)
        found = self.snapshot.keys.get(key_id) if key_id is not None else None
        # Hash and compare even for an unknown id, so timing does not tell which it was.
        digest = hash_key(presented)
        matches = hmac.compare_digest(digest, found.hash if found is not None else _NO_MATCH)
        if found is None:
            return None
        if matches:
            return found
        if (
            now is not None
            and found.previous_hash is not None
            and found.previous_until is not None
            and now < found.previous_until
            and hmac.compare_digest(digest, found.previous_hash)
        ):
            return found
        return None

    def touch(self, key_id: str, now: float) -> None:
        """Note that ``key_id`` was used at ``now``; written with the next flush."""
        self.used[key_id] = now

    async def flush_used(self) -> None:
        """Write the last-use times noted since the last flush, in one transaction.

        A failure is logged and the times are kept for the next flush.
        """
        if not self.used or self.last_used_writer is None:
            return
        batch, self.used = self.used, {}
        try:
            await self.last_used_writer(batch)
        except Exception as exc:
            for key_id, at in batch.items():
                self.used.setdefault(key_id, at)
            log.warning(
                "keys: cannot record when keys were last used in %s (%s); will retry",
                self.source,
                type(exc).__name__,
            )

    async def refresh(self) -> bool:
        """Reload when the database's revision moved; True when the snapshot changed.

        Raises what reading the database raises; the snapshot is then unchanged.
        """
        async with self._refresh_lock:
            revision = await self._revision()
            generation = self.store.generation
            if revision == self.snapshot.revision and generation == self._generation:
                return False
            loaded = await self._load()
            revision = loaded.revision
            keys = {row.key_id: ActiveKey.from_loaded(row) for row in loaded.keys}
            orgs = len({row.org for row in loaded.keys})
            self.snapshot = Snapshot(
                revision=revision,
                keys=keys,
                settings=loaded.settings,
                key_settings=loaded.key_settings,
                orgs=loaded.orgs,
            )
            self._generation = generation
        # Counts only: setting values stay out of the log.
        log.info(
            "keys: %d active keys in %d organisations, %d organisation settings, %d key "
            "settings (revision %d)",
            len(keys),
            orgs,
            sum(len(names) for names in loaded.settings.values()),
            sum(len(names) for names in loaded.key_settings.values()),
            revision,
        )
        return True

    async def refresh_now(self) -> bool:
        """Poll now, as the background task does: True when the snapshot changed.

        A failure is logged and the last good snapshot stays in use; the next
        poll tries again.
        """
        try:
            return await self.refresh()
        except Exception as exc:
            # Keep serving with the last good snapshot; a broken database must
            # not take the gateway down, but the operator has to hear about it.
            log.error(
                "keys: cannot re-read %s (%s: %s); still using revision %d",
                self.source,
                type(exc).__name__,
                exc,
                self.snapshot.revision,
            )
            return False

    async def next_refresh(self) -> None:
        """Wait for the background task to finish its next poll (tests, diagnostics)."""
        if self._refreshed is None:
            raise RuntimeError("the key refresh task is not running")
        await self._refreshed.wait()

    async def lifecycle(self) -> AsyncIterator[None]:
        """Open the database and load before serving (a failure stops start-up), then
        poll on that one connection until the last generation using the ring stops."""
        if isinstance(self.store, PgKeyStore):
            await self.store.open()
        else:
            await asyncio.to_thread(self.store.open)
        try:
            await self._ensure_listening()
            await self.refresh()
            if not self.snapshot.keys:
                log.warning(
                    "keys: no active API keys in %s: every call gets 401 until you run "
                    "`prism keys create`",
                    self.source,
                )
            self._refreshed = asyncio.Event()
            try:
                async with (
                    background(self._poll, "prism-keys-refresh"),
                    background(self._flush_loop, "prism-keys-last-used"),
                ):
                    yield
            finally:
                self._refreshed = None
                await self.flush_used()
        finally:
            if isinstance(self.store, PgKeyStore):
                await self.store.close()
            else:
                # Waits for a read still running in a worker thread (a cancelled poll's).
                await asyncio.to_thread(self.store.close)

    async def _ensure_listening(self) -> None:
        """(PostgreSQL.)  LISTEN for changes, again if the connection was lost.

        A failure is logged (once until it works again) and leaves the poll
        every ``refresh_s`` in charge; the next poll tries again.
        """
        store = self.store
        if not isinstance(store, PgKeyStore) or store.listening:
            return
        try:
            await store.listen(self._wake.set)
        except Exception as exc:
            if not self._listen_failed:
                self._listen_failed = True
                log.warning(
                    "keys: cannot LISTEN for changes on %s (%s: %s); re-reading every %g s",
                    self.source,
                    type(exc).__name__,
                    exc,
                    self.refresh_s,
                )
            return
        if self._listen_failed:
            self._listen_failed = False
            log.info("keys: listening for changes on %s again", self.source)
        if self._refreshed is not None:
            # Listening again: changes made while nobody listened are read now.
            self._wake.set()

    async def _flush_loop(self) -> None:
        # Last use is written every flush_s, in one transaction, never once per call;
        # a task of its own, so a slow write never delays noticing a revocation.
        while True:
            await asyncio.sleep(self.flush_s)
            await self.flush_used()

    async def _poll(self) -> None:
        while True:
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self._wake.wait(), self.refresh_s)
            self._wake.clear()
            await self._ensure_listening()
            await self.refresh_now()
            event, self._refreshed = self._refreshed, asyncio.Event()
            if event is not None:
                event.set()
