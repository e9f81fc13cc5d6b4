"""The ``key-admin`` service: organisations, keys and the audit log, for the admin API.

Every write runs in one transaction that also appends its audit row (who,
what, the record before and after, when, from where) and bumps the
revision, so a refused write changes nothing and the audit log never
misses one.  Records never hold a key's text or hash: the text of a new or
rotated key is handed back once, beside the record, and kept nowhere.

Settings are checked by the declarations (``prism_org_settings``) of the
generation that provides the service, with the parsers calls use; a value
they refuse is a 400 naming ``settings.NAME``.  After a write, this
gateway's key ring is re-read at once (other gateways within
``refresh_s``, or at once on PostgreSQL's NOTIFY).
"""

from __future__ import annotations

import time
from collections.abc import Callable, Mapping, Sequence
from typing import Any

import attrs
import orjson

from prism_proxy import (
    Actor,
    AdminCaller,
    Generation,
    NewSecret,
    OrgSetting,
    PrismError,
)

from .admin_db import AdminDb, Tx
from .auth import AUTH_PLUGIN_NAME, KeysAuth
from .names import declaration_for
from .scopes import ScopeError, parse_scopes
from .settings import KeysSettings
from .store import InvalidName, _loads, check_name, format_time, parse_time
from .tokens import KEY_PREFIX, new_key, rekey

__all__ = ["KeysAdmin", "anchored_wall", "write_last_used"]

Record = dict[str, Any]
_ORG_COLUMNS = "name, tags, created, disabled"
_KEY_COLUMNS = (
    "id, org, scopes, created, revoked, expires_at, previous_until, description, owner, last_used"
)
_TEXT_MAX = 200


def anchored_wall(clock: Callable[[], float]) -> Callable[[], float]:
    """Wall time that moves with ``clock`` (the generation's, a test's manual one)."""
    offset = time.time() - clock()
    return lambda: clock() + offset


def _bad(field: str, message: str) -> PrismError:
    return PrismError(400, "invalid_request", message, param=field)


def _missing(what: str, name: str) -> PrismError:
    return PrismError(404, "not_found", f"no {what} {name!r}")


def _dumps(value: Any) -> str:
    return orjson.dumps(value).decode()


@attrs.define(eq=False)
class KeysAdmin:
    """:class:`prism_proxy.KeyAdmin` over one generation's key database."""

    generation: Generation
    settings: KeysSettings
    wall: Callable[[], float]
    db: AdminDb = attrs.field(init=False)

    def __attrs_post_init__(self) -> None:
        self.db = AdminDb(self.settings)

    def now(self) -> float:
        return self.wall()

    def _auth(self) -> KeysAuth | None:
        auth = self.generation.plugin(AUTH_PLUGIN_NAME)
        return auth if isinstance(auth, KeysAuth) else None

    @property
    def _declared(self) -> Mapping[str, OrgSetting]:
        return self.generation.org_settings

    async def caller(self, presented: str) -> AdminCaller | None:
        auth = self._auth()
        if auth is None or not auth.ring.loaded:
            return None
        now = self.wall()
        active = auth.ring.verify(presented, now)
        if active is None or active.expired(now):
            return None
        principal = active.principal
        return AdminCaller(
            principal.key_id or "", principal.org or "", principal.scopes, active.org_disabled
        )

    # --- checking ---

    def _settings(
        self, given: Any, *, per_key: bool, field: str = "settings"
    ) -> dict[str, str | None]:
        if not isinstance(given, Mapping):
            raise _bad(field, f"{field}: expected an object of NAME: text (null unsets)")
        checked: dict[str, str | None] = {}
        for name, text in given.items():
            where = f"{field}.{name}"
            found = declaration_for(self._declared, name, per_key=per_key)
            if not isinstance(found, OrgSetting):
                known = ", ".join(
                    sorted(n for n, d in self._declared.items() if d.per_key or not per_key)
                )
                raise _bad(where, f"{where}: {found.reason} (declared: {known or 'none'})")
            if text is None:
                checked[name] = None
                continue
            if not isinstance(text, str):
                raise _bad(where, f"{where}: expected text, as the CLI takes it")
            try:
                found.parse(text)
            except Exception as exc:
                raise _bad(where, f"{where}: {exc}") from None
            checked[name] = text
        return checked

    @staticmethod
    def _tags(given: Any) -> list[str]:
        if not isinstance(given, list) or not all(isinstance(t, str) for t in given):
            raise _bad("tags", "tags: expected a list of text")
        try:
            return sorted({check_name("tag", tag) for tag in given})
        except InvalidName as exc:
            raise _bad("tags", f"tags: {exc}") from None

    @staticmethod
    def _scopes(given: Any) -> list[str]:
        if not isinstance(given, list) or not all(isinstance(s, str) for s in given):
            raise _bad("scopes", "scopes: expected a list of text")
        try:
            return list(parse_scopes(given))
        except ScopeError as exc:
            raise _bad("scopes", f"scopes: {exc}") from None

    @staticmethod
    def _text(field: str, given: Any) -> str | None:
        if given is not None and (not isinstance(given, str) or len(given) > _TEXT_MAX):
            raise _bad(field, f"{field}: expected text of at most {_TEXT_MAX} characters")
        return given

    @staticmethod
    def _time(field: str, given: Any) -> str | None:
        if given is None:
            return None
        if isinstance(given, bool) or not isinstance(given, int | float):
            raise _bad(field, f"{field}: expected Unix seconds or null")
        return format_time(float(given))

    # --- reading ---

    async def _org(self, tx: Tx, name: str) -> Record | None:
        rows = await tx.fetch(f"SELECT {_ORG_COLUMNS} FROM {{orgs}} WHERE name = ?", name)
        if not rows:
            return None
        return (await self._orgs(tx, rows))[0]

    async def _orgs(self, tx: Tx, rows: Sequence[tuple[Any, ...]]) -> list[Record]:
        settings = {
            (org, name): value
            for org, name, value in await tx.fetch("SELECT org, name, value FROM {org_settings}")
        }
        counts = dict(
            await tx.fetch("SELECT org, COUNT(*) FROM {keys} WHERE revoked IS NULL GROUP BY org")
        )
        return [
            {
                "name": name,
                "tags": list(_loads(tags)),
                "settings": {n: v for (o, n), v in sorted(settings.items()) if o == name},
                "created": created,
                "disabled": disabled is not None,
                "disabled_at": disabled,
                "active_keys": int(counts.get(name, 0)),
            }
            for name, tags, created, disabled in rows
        ]

    async def _key(self, tx: Tx, key_id: str) -> Record | None:
        found = await self._keys(tx, "WHERE id = ?", key_id)
        return found[0] if found else None

    async def _keys(self, tx: Tx, where: str, *params: Any) -> list[Record]:
        rows = await tx.fetch(
            f"SELECT {_KEY_COLUMNS} FROM {{keys}} {where} ORDER BY created, id", *params
        )
        settings: dict[str, dict[str, str]] = {}
        for key_id, name, value in await tx.fetch(
            "SELECT key_id, name, value FROM {key_settings} ORDER BY name"
        ):
            settings.setdefault(key_id, {})[name] = value
        auth = self._auth()
        pending = auth.ring.used if auth is not None else {}
        now = self.wall()
        records = []
        for (
            key_id,
            org,
            scopes,
            created,
            revoked,
            expires_at,
            previous_until,
            description,
            owner,
            last_used,
        ) in rows:
            used = pending.get(key_id)
            stored = parse_time(last_used)
            if used is not None and (stored is None or used > stored):
                last_used = format_time(used)
            until = parse_time(previous_until)
            records.append(
                {
                    "id": key_id,
                    "prefix": f"{KEY_PREFIX}{key_id}",
                    "org": org,
                    "scopes": list(_loads(scopes)),
                    "settings": settings.get(key_id, {}),
                    "created": created,
                    "last_used": last_used,
                    "expires_at": expires_at,
                    "expired": expires_at is not None and now >= (parse_time(expires_at) or 0),
                    "revoked": revoked,
                    "previous_text_until": previous_until
                    if until is not None and now < until
                    else None,
                    "description": description,
                    "owner": owner,
                }
            )
        return records

    async def list_orgs(self, org: str | None = None) -> list[Record]:
        async with self.db.transaction() as tx:
            if org is None:
                rows = await tx.fetch(f"SELECT {_ORG_COLUMNS} FROM {{orgs}} ORDER BY name")
            else:
                rows = await tx.fetch(f"SELECT {_ORG_COLUMNS} FROM {{orgs}} WHERE name = ?", org)
            return await self._orgs(tx, rows)

    async def get_org(self, name: str) -> Record | None:
        async with self.db.transaction() as tx:
            return await self._org(tx, name)

    async def list_keys(self, org: str | None = None) -> list[Record]:
        async with self.db.transaction() as tx:
            if org is None:
                return await self._keys(tx, "")
            return await self._keys(tx, "WHERE org = ?", org)

    async def get_key(self, key_id: str) -> Record | None:
        async with self.db.transaction() as tx:
            return await self._key(tx, key_id)

    async def audit(
        self, *, org: str | None = None, limit: int = 100, before: int | None = None
    ) -> list[Record]:
        clauses: list[str] = []
        params: list[Any] = []
        if org is not None:
            clauses.append("org = ?")
            params.append(org)
        if before is not None:
            clauses.append("id < ?")
            params.append(before)
        where = (" WHERE " + " AND ".join(clauses)) if clauses else ""
        async with self.db.transaction() as tx:
            rows = await tx.fetch(
                "SELECT id, at, actor, action, org, subject, before, after, address "
                f"FROM {{audit}}{where} ORDER BY id DESC LIMIT {int(limit)}",
                *params,
            )
        return [
            {
                "id": int(r[0]),
                "at": r[1],
                "actor": r[2],
                "action": r[3],
                "org": r[4],
                "subject": r[5],
                "before": orjson.loads(r[6]) if r[6] is not None else None,
                "after": orjson.loads(r[7]) if r[7] is not None else None,
                "address": r[8],
            }
            for r in rows
        ]

    # --- writing ---

    async def _record(
        self,
        tx: Tx,
        actor: Actor,
        action: str,
        org: str | None,
        subject: str,
        before: Record | None,
        after: Record | None,
    ) -> None:
        def clean(record: Record | None) -> str | None:
            if record is None:
                return None
            # Last use moves without anyone writing: it is not part of a change.
            return _dumps({k: v for k, v in record.items() if k not in ("last_used",)})

        await tx.execute(
            "INSERT INTO {audit} (at, actor, action, org, subject, before, after, address) "
            "VALUES (?, ?, ?, ?, ?, ?, ?, ?)",
            format_time(self.wall()),
            actor.name,
            action,
            org,
            subject,
            clean(before),
            clean(after),
            actor.address,
        )
        await tx.bump()

    async def record(
        self,
        actor: Actor,
        action: str,
        subject: str,
        *,
        org: str | None = None,
        before: Record | None = None,
        after: Record | None = None,
    ) -> None:
        """An audit row for a write another service made (a breaker override)."""
        async with self.db.transaction() as tx:
            await self._record(tx, actor, action, org, subject, before, after)

    async def _refresh(self) -> None:
        auth = self._auth()
        if auth is not None and auth.ring.loaded:
            await auth.ring.refresh_now()

    async def _set_settings(
        self, tx: Tx, table: str, column: str, owner: str, values: Mapping[str, str | None]
    ) -> None:
        for name, text in values.items():
            if text is None:
                await tx.execute(
                    f"DELETE FROM {{{table}}} WHERE {column} = ? AND name = ?", owner, name
                )
            else:
                await tx.execute(
                    f"INSERT INTO {{{table}}} ({column}, name, value) VALUES (?, ?, ?) "
                    f"ON CONFLICT ({column}, name) DO UPDATE SET value = excluded.value",
                    owner,
                    name,
                    text,
                )

    async def create_org(
        self, name: str, tags: Sequence[str], settings: Mapping[str, str], actor: Actor
    ) -> Record:
        try:
            check_name("organisation", name)
        except InvalidName as exc:
            raise _bad("name", f"name: {exc}") from None
        clean_tags = self._tags(tags)  # as given: text is not a list of tags
        values = self._settings(settings, per_key=False)
        async with self.db.transaction() as tx:
            if await self._org(tx, name) is not None:
                raise PrismError(409, "conflict", f"organisation {name!r} exists already")
            await tx.execute(
                "INSERT INTO {orgs} (name, tags, created) VALUES (?, ?, ?)",
                name,
                _dumps(clean_tags),
                format_time(self.wall()),
            )
            await self._set_settings(tx, "org_settings", "org", name, values)
            after = await self._org(tx, name)
            await self._record(tx, actor, "org.create", name, f"org:{name}", None, after)
        await self._refresh()
        assert after is not None
        return after

    async def update_org(self, name: str, changes: Mapping[str, Any], actor: Actor) -> Record:
        tags = self._tags(changes["tags"]) if "tags" in changes else None
        values = self._settings(changes.get("settings", {}), per_key=False)
        disabled = changes.get("disabled")
        if disabled is not None and not isinstance(disabled, bool):
            raise _bad("disabled", "disabled: expected true or false")
        async with self.db.transaction() as tx:
            before = await self._org(tx, name)
            if before is None:
                raise _missing("organisation", name)
            if tags is not None:
                await tx.execute("UPDATE {orgs} SET tags = ? WHERE name = ?", _dumps(tags), name)
            if disabled is not None and disabled != before["disabled"]:
                stamp = format_time(self.wall()) if disabled else None
                await tx.execute("UPDATE {orgs} SET disabled = ? WHERE name = ?", stamp, name)
            await self._set_settings(tx, "org_settings", "org", name, values)
            after = await self._org(tx, name)
            action = "org.update"
            if disabled is not None and disabled != before["disabled"]:
                action = "org.disable" if disabled else "org.enable"
            await self._record(tx, actor, action, name, f"org:{name}", before, after)
        await self._refresh()
        assert after is not None
        return after

    def _key_fields(self, fields: Mapping[str, Any]) -> dict[str, Any]:
        """The columns ``fields`` set (checked), by column; settings under ``settings``."""
        found: dict[str, Any] = {}
        if "scopes" in fields:
            found["scopes"] = _dumps(self._scopes(fields["scopes"]))
        if "settings" in fields:
            found["settings"] = self._settings(fields["settings"], per_key=True)
        if "expires_at" in fields:
            found["expires_at"] = self._time("expires_at", fields["expires_at"])
        for name in ("description", "owner"):
            if name in fields:
                found[name] = self._text(name, fields[name])
        return found

    async def create_key(self, org: str, fields: Mapping[str, Any], actor: Actor) -> NewSecret:
        if "scopes" not in fields:
            raise _bad("scopes", 'scopes: required (e.g. ["chat", "model:*"])')
        columns = self._key_fields(fields)
        settings = columns.pop("settings", {})
        async with self.db.transaction() as tx:
            owner = await self._org(tx, org)
            if owner is None:
                raise _bad("org", f"org: no organisation {org!r} (create it first)")
            if owner["disabled"]:
                raise PrismError(409, "conflict", f"organisation {org!r} is disabled", param="org")
            made = new_key()
            names = ", ".join(columns)
            await tx.execute(
                f"INSERT INTO {{keys}} (id, org, hash, created, {names}) "
                f"VALUES (?, ?, ?, ?{', ?' * len(columns)})",
                made.key_id,
                org,
                made.hash,
                format_time(self.wall()),
                *columns.values(),
            )
            await self._set_settings(tx, "key_settings", "key_id", made.key_id, settings)
            after = await self._key(tx, made.key_id)
            await self._record(tx, actor, "key.create", org, f"key:{made.key_id}", None, after)
        await self._refresh()
        assert after is not None
        return NewSecret(after, made.key)

    async def _live_key(self, tx: Tx, key_id: str) -> Record:
        before = await self._key(tx, key_id)
        if before is None:
            raise _missing("key", key_id)
        if before["revoked"] is not None:
            raise PrismError(409, "conflict", f"key {key_id!r} is revoked")
        return before

    async def update_key(self, key_id: str, changes: Mapping[str, Any], actor: Actor) -> Record:
        columns = self._key_fields(changes)
        settings = columns.pop("settings", {})
        async with self.db.transaction() as tx:
            before = await self._live_key(tx, key_id)
            for column, value in columns.items():
                # Column names come from _key_fields, never from input.
                await tx.execute(f"UPDATE {{keys}} SET {column} = ? WHERE id = ?", value, key_id)
            await self._set_settings(tx, "key_settings", "key_id", key_id, settings)
            after = await self._key(tx, key_id)
            org = before["org"]
            await self._record(tx, actor, "key.update", org, f"key:{key_id}", before, after)
        await self._refresh()
        assert after is not None
        return after

    async def revoke_key(self, key_id: str, actor: Actor) -> Record:
        async with self.db.transaction() as tx:
            before = await self._live_key(tx, key_id)
            await tx.execute(
                "UPDATE {keys} SET revoked = ?, previous_hash = NULL WHERE id = ?",
                format_time(self.wall()),
                key_id,
            )
            after = await self._key(tx, key_id)
            org = before["org"]
            await self._record(tx, actor, "key.revoke", org, f"key:{key_id}", before, after)
        await self._refresh()
        assert after is not None
        return after

    async def rotate_key(self, key_id: str, grace_s: float, actor: Actor) -> NewSecret:
        async with self.db.transaction() as tx:
            before = await self._live_key(tx, key_id)
            made = rekey(key_id)
            until = format_time(self.wall() + grace_s) if grace_s > 0 else None
            # The old text's hash moves aside for the grace period; with none, it goes.
            await tx.execute(
                "UPDATE {keys} SET previous_hash = CASE WHEN CAST(? AS TEXT) IS NULL THEN NULL "
                "ELSE hash END, "
                "previous_until = ?, hash = ? WHERE id = ?",
                until,
                until,
                made.hash,
                key_id,
            )
            after = await self._key(tx, key_id)
            org = before["org"]
            await self._record(tx, actor, "key.rotate", org, f"key:{key_id}", before, after)
        await self._refresh()
        assert after is not None
        return NewSecret(after, made.key)


async def write_last_used(db: AdminDb, batch: Mapping[str, float]) -> None:
    """Last-use times (key id → Unix seconds) in one transaction; no revision bump:
    gateways do not hold them."""
    async with db.transaction() as tx:
        for key_id, at in batch.items():
            stamp = format_time(at)
            await tx.execute(
                "UPDATE {keys} SET last_used = ? WHERE id = ? "
                "AND (last_used IS NULL OR last_used < ?)",
                stamp,
                key_id,
                stamp,
            )
