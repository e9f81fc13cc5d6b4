"""``prism keys ...``: create, list and revoke keys; tag organisations.

Exit status: 0 done, 1 refused (bad scope or name, unknown key id),
2 configuration error (reported by ``prism`` itself).
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence

from prism_proxy import Commands, Config

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
    listing = actions.add_parser("list", help="list keys (never the keys themselves)")
    listing.add_argument("--org", help="only this organisation's keys")
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
    for sub in (create, listing, revoke, tags, orgs):
        # Also accepted after the action; SUPPRESS keeps a value given before it.
        sub.add_argument("--config", default=argparse.SUPPRESS, help=argparse.SUPPRESS)


def _run(args: argparse.Namespace, config: Config) -> int:
    settings = require_settings(config)
    store = KeyStore(settings.db_path)
    store.ensure_schema()
    action: str = args.keys_action
    try:
        if action == "create":
            return _create(store, args.org, _split(args.scopes))
        if action == "list":
            return _list(store, args.org)
        if action == "revoke":
            return _revoke(store, args.key_id, settings.refresh_s)
        if action == "org-tags":
            return _org_tags(store, args.org, args.tags)
        return _orgs(store)
    except (ScopeError, InvalidName) as exc:
        print(f"prism keys {action}: {exc}", file=sys.stderr)
        return 1


def _split(text: str) -> list[str]:
    return [item.strip() for item in text.split(",") if item.strip()]


def _create(store: KeyStore, org: str, scopes: Sequence[str]) -> int:
    checked = parse_scopes(scopes)
    made = store.create_key(org, checked)
    print(f"key id:  {made.key_id}")
    print(f"org:     {org}")
    print(f"scopes:  {','.join(checked)}")
    print("The key is shown once, on the next line; Prism keeps only its SHA-256 hash.")
    print(made.key)
    return 0


def _list(store: KeyStore, org: str | None) -> int:
    rows = [
        (
            r.key_id,
            r.org,
            ",".join(r.scopes),
            r.created,
            f"revoked {r.revoked}" if r.revoked else "active",
        )
        for r in store.list_keys(org)
    ]
    _table(("key id", "org", "scopes", "created", "status"), rows)
    return 0


def _revoke(store: KeyStore, key_id: str, refresh_s: float) -> int:
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


def _org_tags(store: KeyStore, org: str, tags: str | None) -> int:
    if tags is None:
        current = store.org_tags(org)
        if current is None:
            print(f"prism keys org-tags: unknown organisation {org!r}", file=sys.stderr)
            return 1
    else:
        current = store.set_org_tags(org, _split(tags))
    print(f"{org}: {','.join(current) or '(no tags)'}")
    return 0


def _orgs(store: KeyStore) -> int:
    rows = [
        (o.name, ",".join(o.tags) or "-", str(o.active_keys), o.created) for o in store.list_orgs()
    ]
    _table(("org", "tags", "active keys", "created"), rows)
    return 0


def _table(header: tuple[str, ...], rows: Sequence[tuple[str, ...]]) -> None:
    widths = [max(len(row[i]) for row in [header, *rows]) for i in range(len(header))]
    for row in [header, *rows]:
        print(
            "  ".join(cell.ljust(width) for cell, width in zip(row, widths, strict=True)).rstrip()
        )
