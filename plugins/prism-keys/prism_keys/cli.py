"""``prism keys ...``: create, list, show and revoke keys; tag organisations; set the
settings plugins declare on organisations and on single keys.

Exit status: 0 done, 1 refused (bad scope or name, unknown key id or
organisation, a setting on a revoked key), 2 configuration error (reported
by ``prism`` itself) or a setting the loaded plugins' declarations refuse
(undeclared, organisation-only on a key, NAME@MODEL where not per model, a
value its parser refuses).

The settings ``org-set`` and ``set`` accept are those the plugins the
configuration loads declare (``prism_org_settings``), checked with the same
parsers the gateway uses (:mod:`.cli_settings`).
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence

import asyncpg

from prism_proxy import Commands, Config

from .cli_settings import (
    REGIONS,
    Store,
    key_set,
    key_show,
    org_regions,
    org_set,
    org_show,
    refuse_key_text,
    settings_cell,
    table,
)
from .pg_store import SchemaTooNew, SyncPgKeyStore
from .scopes import ScopeError, parse_scopes
from .settings import require_settings
from .store import InvalidName, KeyStore, Revoked

__all__ = ["add_commands"]


def add_commands(commands: Commands) -> None:
    parser = commands.add("keys", "manage API keys and organisations (prism-keys)", _run)
    actions = parser.add_subparsers(dest="keys_action", required=True, metavar="ACTION")

    create = actions.add_parser(
        "create", help="make a key; it is printed once, alone on the last line"
    )
    create.add_argument("--org", required=True, help="the organisation the key belongs to")
    create.add_argument(
        "--scopes",
        required=True,
        help="comma-separated: chat, embeddings, model:NAME, model:PREFIX*, model:*, *, "
        "or labels like tier:gold",
    )
    listing = actions.add_parser(
        "list", help="list keys with their own settings (never the keys themselves)"
    )
    listing.add_argument("--org", help="only this organisation's keys")
    show = actions.add_parser(
        "show", help="a key (never the key itself) and its own settings, as stored"
    )
    show.add_argument("key_id", metavar="KEY_ID", help="the id shown by create and list")
    key_settings = actions.add_parser(
        "set",
        help="set (NAME=VALUE) or remove (--unset NAME) one key's own settings, those "
        "plugins declare per key",
        usage="prism keys set KEY_ID [NAME=VALUE ...] [--unset NAME ...]",
    )
    key_settings.add_argument("key_id", metavar="KEY_ID", help="the id shown by create and list")
    key_settings.add_argument(
        "assignments",
        nargs="*",
        metavar="NAME=VALUE",
        help="checked against the declaration; NAME@MODEL=VALUE for one model",
    )
    key_settings.add_argument(
        "--unset", action="append", default=[], metavar="NAME", help="remove it (repeatable)"
    )
    revoke = actions.add_parser("revoke", help="revoke a key by its key id")
    revoke.add_argument("key_id", help="the id shown by create and list")
    tags = actions.add_parser(
        "org-tags", help="show an organisation's tags, or replace them with --set"
    )
    tags.add_argument("org")
    tags.add_argument(
        "--set", dest="tags", metavar="TAGS", help="comma-separated; an empty string clears"
    )
    orgs = actions.add_parser("orgs", help="list organisations with their tags")
    org_set = actions.add_parser(
        "org-set",
        help="set (NAME=VALUE) or remove (--unset NAME) organisation settings that plugins declare",
        # argparse takes no NAME=VALUE after an option that follows ORG: say the order.
        usage="prism keys org-set ORG [NAME=VALUE ...] [--unset NAME ...]",
    )
    org_set.add_argument("org", metavar="ORG")
    org_set.add_argument(
        "assignments",
        nargs="*",
        metavar="NAME=VALUE",
        help="checked against the declaration; NAME@MODEL=VALUE for one model",
    )
    org_set.add_argument(
        "--unset", action="append", default=[], metavar="NAME", help="remove it (repeatable)"
    )
    org_show = actions.add_parser(
        "org-show",
        help="an organisation's settings and its keys' as stored, and which the plugins declare",
    )
    org_show.add_argument("org", metavar="ORG")
    regions = actions.add_parser(
        "org-regions",
        help=f"show an organisation's {REGIONS!r} setting, or --set/--clear it "
        f"(org-set ORG {REGIONS}=...)",
    )
    regions.add_argument("org", metavar="ORG")
    change = regions.add_mutually_exclusive_group()
    change.add_argument(
        "--set", dest="regions", metavar="REGIONS", help="comma-separated region names"
    )
    change.add_argument("--clear", action="store_true", help=f"unset {REGIONS!r}")
    for sub in (
        create,
        listing,
        show,
        key_settings,
        revoke,
        tags,
        orgs,
        org_set,
        org_show,
        regions,
    ):
        # Also accepted after the action; SUPPRESS keeps a value given before it.
        sub.add_argument("--config", default=argparse.SUPPRESS, help=argparse.SUPPRESS)


def _run(args: argparse.Namespace, config: Config) -> int:
    settings = require_settings(config)
    action: str = args.keys_action
    if settings.db_url is None:
        assert settings.db_path is not None
        return _act(args, config, KeyStore(settings.db_path), settings.refresh_s)
    store = SyncPgKeyStore(settings.db_url)
    try:
        return _act(args, config, store, settings.refresh_s)
    except (
        OSError,
        TimeoutError,
        asyncpg.PostgresError,
        asyncpg.InterfaceError,
        SchemaTooNew,
    ) as exc:
        # The URL shown without its password; asyncpg's messages do not hold it.
        print(
            f"prism keys {action}: PostgreSQL at {store.name}: {type(exc).__name__}: {exc}",
            file=sys.stderr,
        )
        return 1


def _act(args: argparse.Namespace, config: Config, store: Store, refresh_s: float) -> int:
    store.ensure_schema()
    action: str = args.keys_action
    try:
        if action == "create":
            return _create(store, args.org, _split(args.scopes))
        if action == "list":
            return _list(store, args.org)
        if action == "show":
            return key_show(store, config, args.key_id)
        if action == "set":
            return key_set(store, config, args.key_id, args.assignments, args.unset, refresh_s)
        if action == "revoke":
            return _revoke(store, args.key_id, refresh_s)
        if action == "org-tags":
            return _org_tags(store, args.org, args.tags)
        if action == "org-set":
            return org_set(store, config, args.org, args.assignments, args.unset, refresh_s)
        if action == "org-show":
            return org_show(store, config, args.org)
        if action == "org-regions":
            if args.clear:
                return org_set(store, config, args.org, [], [REGIONS], refresh_s, action)
            if args.regions is not None:
                assignment = f"{REGIONS}={args.regions}"
                return org_set(store, config, args.org, [assignment], [], refresh_s, action)
            return org_regions(store, args.org)
        return _orgs(store)
    except (ScopeError, InvalidName) as exc:
        print(f"prism keys {action}: {exc}", file=sys.stderr)
        return 1


def _split(text: str) -> list[str]:
    return [item.strip() for item in text.split(",") if item.strip()]


def _create(store: Store, org: str, scopes: Sequence[str]) -> int:
    checked = parse_scopes(scopes)
    made = store.create_key(org, checked)
    print(f"key id:  {made.key_id}")
    print(f"org:     {org}")
    print(f"scopes:  {','.join(checked)}")
    print("The key is shown once, on the next line; Prism keeps only its SHA-256 hash.")
    print(made.key)
    return 0


def _list(store: Store, org: str | None) -> int:
    keys = store.list_keys(org)
    settings = store.key_settings(org=org)
    rows = [
        (
            r.key_id,
            r.org,
            ",".join(r.scopes),
            r.created,
            f"revoked {r.revoked}" if r.revoked else "active",
            # Last: a value may hold spaces.
            settings_cell(settings.get(r.key_id)),
        )
        for r in keys
    ]
    table(("key id", "org", "scopes", "created", "status", "settings"), rows)
    return 0


def _revoke(store: Store, key_id: str, refresh_s: float) -> int:
    refused = refuse_key_text("revoke", key_id)
    if refused is not None:
        return refused
    result = store.revoke(key_id)
    if result is Revoked.UNKNOWN:
        print(
            f"prism keys revoke: unknown key id {key_id!r} (see prism keys list)", file=sys.stderr
        )
        return 1
    if result is Revoked.ALREADY:
        print(f"{key_id}: already revoked")
        return 0
    print(f"{key_id}: revoked; running gateways refuse it within {refresh_s:g} s")
    return 0


def _org_tags(store: Store, org: str, tags: str | None) -> int:
    if tags is None:
        current = store.org_tags(org)
        if current is None:
            print(f"prism keys org-tags: unknown organisation {org!r}", file=sys.stderr)
            return 1
    else:
        current = store.set_org_tags(org, _split(tags))
    print(f"{org}: {','.join(current) or '(no tags)'}")
    return 0


def _orgs(store: Store) -> int:
    rows = [
        (o.name, ",".join(o.tags) or "-", str(o.active_keys), o.created) for o in store.list_orgs()
    ]
    table(("org", "tags", "active keys", "created"), rows)
    return 0
