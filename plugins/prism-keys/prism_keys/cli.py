"""``prism keys ...``: create, list and revoke keys; tag organisations and set their settings.

Exit status: 0 done, 1 refused (bad scope or name, unknown key id or
organisation), 2 configuration error (reported by ``prism`` itself) or an
organisation setting no loaded plugin declares, or a value its declaration
refuses.

The organisation settings ``org-set`` accepts are those the plugins the
configuration loads declare (``prism_org_settings``), checked with the same
parsers the gateway uses.
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Mapping, Sequence

import asyncpg

from prism_proxy import (
    GATEWAY,
    Commands,
    Config,
    OrgSetting,
    create_app,
    declared_org_settings,
)

from .pg_store import SchemaTooNew, SyncPgKeyStore
from .scopes import ScopeError, parse_scopes
from .settings import require_settings
from .store import InvalidName, KeyStore, Revoked

#: The SQLite file (``db_path``) or the PostgreSQL database (``db_url``).
Store = KeyStore | SyncPgKeyStore

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
    org_set = actions.add_parser(
        "org-set",
        help="set (NAME=VALUE) or remove (--unset NAME) organisation settings that plugins declare",
        # argparse takes no NAME=VALUE after an option that follows ORG: say the order.
        usage="prism keys org-set ORG [NAME=VALUE ...] [--unset NAME ...]",
    )
    org_set.add_argument("org", metavar="ORG")
    org_set.add_argument(
        "assignments", nargs="*", metavar="NAME=VALUE", help="checked against the declaration"
    )
    org_set.add_argument(
        "--unset", action="append", default=[], metavar="NAME", help="remove it (repeatable)"
    )
    org_show = actions.add_parser(
        "org-show", help="an organisation's settings as stored, and which the plugins declare"
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
    for sub in (create, listing, revoke, tags, orgs, org_set, org_show, regions):
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
        if action == "revoke":
            return _revoke(store, args.key_id, refresh_s)
        if action == "org-tags":
            return _org_tags(store, args.org, args.tags)
        if action == "org-set":
            return _org_set(store, config, args.org, args.assignments, args.unset, refresh_s)
        if action == "org-show":
            return _org_show(store, config, args.org)
        if action == "org-regions":
            if args.clear:
                return _org_set(store, config, args.org, [], [REGIONS], refresh_s, action)
            if args.regions is not None:
                assignment = f"{REGIONS}={args.regions}"
                return _org_set(store, config, args.org, [assignment], [], refresh_s, action)
            return _org_regions(store, args.org)
        return _orgs(store)
    except (ScopeError, InvalidName) as exc:
        print(f"prism keys {action}: {exc}", file=sys.stderr)
        return 1


REGIONS = "regions"
REGIONS_HINT = (
    f"the {REGIONS!r} setting is declared by the prism-regions plugin: install it, or "
    "enable it in the configuration"
)


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


def _revoke(store: Store, key_id: str, refresh_s: float) -> int:
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


def _declared(config: Config) -> dict[str, OrgSetting]:
    """The settings the plugins this configuration loads declare (as a gateway would)."""
    return declared_org_settings(config)


def _describe(declared: Mapping[str, OrgSetting]) -> str:
    if not declared:
        return "no loaded plugin declares any organisation setting"
    listed = ", ".join(
        f"{name} ({declared[name].help})" if declared[name].help else name
        for name in sorted(declared)
    )
    return f"declared: {listed}"


def _refusal(action: str, problem: str) -> int:
    print(f"prism keys {action}: {problem}", file=sys.stderr)
    return 2


def _org_set(
    store: Store,
    config: Config,
    org: str,
    assignments: Sequence[str],
    unset: Sequence[str],
    refresh_s: float,
    action: str = "org-set",
) -> int:
    if not assignments and not unset:
        return _refusal(action, "nothing to do: give NAME=VALUE or --unset NAME")
    declared = _declared(config)
    values: dict[str, str] = {}
    for assignment in assignments:
        name, equals, text = assignment.partition("=")
        name = name.strip()
        if not equals or not name:
            return _refusal(action, f"expected NAME=VALUE, got {assignment!r}")
        declaration = declared.get(name)
        if declaration is None:
            problem = f"unknown organisation setting {name!r}; {_describe(declared)}"
            if name == REGIONS:
                problem += f" ({REGIONS_HINT})"
            return _refusal(action, problem)
        if name in values:
            return _refusal(action, f"{name} is given twice")
        try:
            declaration.parse(text)
        except Exception as exc:
            return _refusal(action, f"invalid value for {name}: {_reason(exc)}")
        values[name] = text
    both = sorted(set(values) & set(unset))
    if both:
        return _refusal(action, f"{both[0]} is both set and unset")
    # Any stored name may be removed, declared or not (a plugin since removed).
    removed = store.update_org_settings(org, values, unset)
    if removed is None:
        print(
            f"prism keys {action}: unknown organisation {org!r} (see prism keys orgs)",
            file=sys.stderr,
        )
        return 1
    for name, text in values.items():
        print(f"{org}: {name} = {_shown(text)}")
    _doubts(config, declared, values)
    for name in dict.fromkeys(unset):
        print(f"{org}: {name} {'unset' if name in removed else 'was not set'}")
    if values or removed:
        print(f"running gateways apply it within {refresh_s:g} s")
    return 0


def _doubts(config: Config, declared: Mapping[str, OrgSetting], values: Mapping[str, str]) -> None:
    """Warn (never refuse) where a value looks wrong against the catalog."""
    checks = {name: declared[name] for name in values if declared[name].doubts is not None}
    if not checks:
        return
    catalog = create_app(config)[GATEWAY].current.catalog
    for name, setting in checks.items():
        assert setting.doubts is not None
        for doubt in setting.doubts(setting.parse(values[name]), catalog):
            print(f"prism keys: warning: {name}: {doubt}", file=sys.stderr)


def _org_show(store: Store, config: Config, org: str) -> int:
    stored = store.org_settings(org)
    if stored is None:
        print(
            f"prism keys org-show: unknown organisation {org!r} (see prism keys orgs)",
            file=sys.stderr,
        )
        return 1
    declared = _declared(config)
    if not stored:
        print(f"{org}: no settings")
    else:
        rows = []
        for name, text in stored.items():
            declaration = declared.get(name)
            if declaration is None:
                status = "declared by no loaded plugin: ignored"
            else:
                try:
                    declaration.parse(text)
                    status = "ok"
                except Exception as exc:
                    status = f"does not parse, left out: {_reason(exc)}"
            rows.append((name, _shown(text), status))
        _table(("setting", "value", "status"), rows)
    unset = [name for name in sorted(declared) if name not in stored]
    if unset:
        print("declared, not set:")
        for name in unset:
            help_text = declared[name].help
            print(f"  {name}" + (f": {help_text}" if help_text else ""))
    return 0


def _org_regions(store: Store, org: str) -> int:
    stored = store.org_settings(org)
    if stored is None:
        print(
            f"prism keys org-regions: unknown organisation {org!r} (see prism keys orgs)",
            file=sys.stderr,
        )
        return 1
    text = stored.get(REGIONS)
    print(f"{org}: {REGIONS} = {_shown(text)}" if text is not None else f"{org}: {REGIONS} not set")
    return 0


def _reason(exc: Exception) -> str:
    return str(exc) or type(exc).__name__


def _shown(text: str) -> str:
    return text if text else '""'


def _orgs(store: Store) -> int:
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
