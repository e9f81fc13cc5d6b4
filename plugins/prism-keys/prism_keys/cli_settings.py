"""``prism keys org-set / set / org-show / show``: the settings plugins declare, on
organisations and on single keys.

What a command accepts is what the plugins the configuration loads declare
(``prism_org_settings``), checked with the parsers the gateway uses: any
declared name on an organisation, only ``per_key`` ones on a key, and
``NAME@MODEL`` (the setting for one model) where ``NAME`` is ``per_model``.
A refused setting exits 2 with one line naming it; nothing is written
unless every setting given is valid.  What only looks wrong against the
catalog (a model it does not have, a declaration's own doubts) is a
warning, never a refusal: the catalog may be about to change.
"""

from __future__ import annotations

import sys
from collections.abc import Callable, Mapping, Sequence

from prism_proxy import (
    GATEWAY,
    Catalog,
    Config,
    OrgSetting,
    create_app,
    declared_org_settings,
    split_setting_name,
)

from .names import Unusable, declaration_for
from .pg_store import SyncPgKeyStore
from .store import KeyRow, KeyStore
from .tokens import KEY_PREFIX

__all__ = [
    "REGIONS",
    "Store",
    "key_set",
    "key_show",
    "org_regions",
    "org_set",
    "org_show",
    "refuse_key_text",
    "settings_cell",
    "table",
]

#: The SQLite file (``db_path``) or the PostgreSQL database (``db_url``).
Store = KeyStore | SyncPgKeyStore

REGIONS = "regions"
REGIONS_HINT = (
    f"the {REGIONS!r} setting is declared by the prism-regions plugin: install it, or "
    "enable it in the configuration"
)


class Refused(Exception):
    """A setting the command refuses (exit 2); the message names it and says why."""


# --- checking what is given ---


def _declared(config: Config) -> dict[str, OrgSetting]:
    """The settings the plugins this configuration loads declare (as a gateway would)."""
    return declared_org_settings(config)


def _entry(name: str, declaration: OrgSetting, *, per_key: bool) -> str:
    notes = [declaration.help] if declaration.help else []
    wider = []
    if declaration.per_key and not per_key:  # a list of per-key settings says so once
        wider.append("per key")
    if declaration.per_model:
        wider.append(f"per model as {name}@MODEL")
    if wider:
        notes.append("also " + " and ".join(wider))
    return f"{name} ({'; '.join(notes)})" if notes else name


def _describe(declared: Mapping[str, OrgSetting], *, per_key: bool = False) -> str:
    shown = {name: d for name, d in declared.items() if d.per_key or not per_key}
    if not shown:
        if per_key:
            return "no loaded plugin declares a setting that may be set per key"
        return "no loaded plugin declares any organisation setting"
    listed = ", ".join(_entry(name, shown[name], per_key=per_key) for name in sorted(shown))
    return f"{'declared per key' if per_key else 'declared'}: {listed}"


def _checked(
    declared: Mapping[str, OrgSetting],
    assignments: Sequence[str],
    unset: Sequence[str],
    *,
    per_key: bool,
) -> dict[str, str]:
    """The values to store, by stored name (``NAME`` or ``NAME@MODEL``); raises Refused."""
    values: dict[str, str] = {}
    for assignment in assignments:
        stored, equals, text = assignment.partition("=")
        stored = stored.strip()
        if not equals or not stored:
            raise Refused(f"expected NAME=VALUE, got {assignment!r}")
        name, model = split_setting_name(stored)
        if model is not None and (not name or not model):
            raise Refused(f"expected NAME@MODEL=VALUE, got a setting named {stored!r}")
        found = declaration_for(declared, stored, per_key=per_key)
        if not isinstance(found, OrgSetting):
            raise Refused(_unusable(declared, stored, found, per_key=per_key))
        if stored in values:
            raise Refused(f"{stored} is given twice")
        try:
            found.parse(text)
        except Exception as exc:
            raise Refused(f"invalid value for {stored}: {_reason(exc)}") from None
        values[stored] = text
    both = sorted(set(values) & set(unset))
    if both:
        raise Refused(f"{both[0]} is both set and unset")
    return values


def _unusable(
    declared: Mapping[str, OrgSetting], stored: str, why: Unusable, *, per_key: bool
) -> str:
    name, _ = split_setting_name(stored)
    if name not in declared:
        if per_key:
            return f"unknown setting {name!r}; {_describe(declared, per_key=True)}"
        problem = f"unknown organisation setting {name!r}; {_describe(declared)}"
        return problem + (f" ({REGIONS_HINT})" if name == REGIONS else "")
    if per_key and not declared[name].per_key:
        return (
            f"{name} is organisation-only: its declaration does not allow it on one key "
            f"(set it for the organisation: prism keys org-set ORG {name}=VALUE)"
        )
    return (
        f"{name} cannot be set per model ({stored}): its declaration does not allow "
        f"NAME@MODEL (set {name}=VALUE for every model)"
    )


def _warn(declared: Mapping[str, OrgSetting], values: Mapping[str, str], config: Config) -> None:
    """Say (never refuse) where a value looks wrong against the catalog."""
    checks: dict[str, tuple[OrgSetting, str | None]] = {}
    for stored in values:
        name, model = split_setting_name(stored)
        if model is not None or declared[name].doubts is not None:
            checks[stored] = (declared[name], model)
    if not checks:
        return
    catalog: Catalog = create_app(config)[GATEWAY].current.catalog
    for stored, (declaration, model) in checks.items():
        doubts: list[str] = []
        if model is not None and catalog.resolve(model) is None:
            doubts.append(
                f"model {model!r} is not in the catalog: the setting applies to no call until it is"
            )
        if declaration.doubts is not None:
            doubts.extend(declaration.doubts(declaration.parse(values[stored]), catalog))
        for doubt in doubts:
            print(f"prism keys: warning: {stored}: {doubt}", file=sys.stderr)


# --- the commands ---


def _refusal(action: str, problem: str, status: int = 2) -> int:
    print(f"prism keys {action}: {problem}", file=sys.stderr)
    return status


def refuse_key_text(action: str, key_id: str) -> int | None:
    """Exit status 1 when a whole key was given for a key id (never echoed), else None."""
    if not key_id.startswith(KEY_PREFIX):
        return None
    return _refusal(
        action,
        "give the key id (the 12 hex digits that create and list show), not the key itself",
        status=1,
    )


def _change(
    action: str,
    owner: str,
    assignments: Sequence[str],
    unset: Sequence[str],
    config: Config,
    refresh_s: float,
    *,
    per_key: bool,
    write: Callable[[Mapping[str, str]], frozenset[str] | None],
    unknown: str,
) -> int:
    """Check, write in one transaction (``write``), report: one line per setting."""
    if not assignments and not unset:
        return _refusal(action, "nothing to do: give NAME=VALUE or --unset NAME")
    declared = _declared(config)
    try:
        values = _checked(declared, assignments, unset, per_key=per_key)
    except Refused as refused:
        return _refusal(action, str(refused))
    # Any stored name may be removed, declared or not (a plugin since removed).
    removed = write(values)
    if removed is None:
        return _refusal(action, unknown, status=1)
    for name, text in values.items():
        print(f"{owner}: {name} = {_shown(text)}")
    _warn(declared, values, config)
    for name in dict.fromkeys(unset):
        print(f"{owner}: {name} {'unset' if name in removed else 'was not set'}")
    if values or removed:
        print(f"running gateways apply it within {refresh_s:g} s")
    return 0


def org_set(
    store: Store,
    config: Config,
    org: str,
    assignments: Sequence[str],
    unset: Sequence[str],
    refresh_s: float,
    action: str = "org-set",
) -> int:
    return _change(
        action,
        org,
        assignments,
        unset,
        config,
        refresh_s,
        per_key=False,
        write=lambda values: store.update_org_settings(org, values, unset),
        unknown=f"unknown organisation {org!r} (see prism keys orgs)",
    )


def key_set(
    store: Store,
    config: Config,
    key_id: str,
    assignments: Sequence[str],
    unset: Sequence[str],
    refresh_s: float,
) -> int:
    action = "set"
    refused = refuse_key_text(action, key_id)
    if refused is not None:
        return refused
    row = store.key(key_id)
    if row is not None and row.revoked and assignments:
        # Its settings would reach no gateway; removing them is harmless.
        return _refusal(
            action,
            f"key id {key_id!r} is revoked: a setting on it would apply to nothing",
            status=1,
        )
    return _change(
        action,
        key_id,
        assignments,
        unset,
        config,
        refresh_s,
        per_key=True,
        write=lambda values: store.update_key_settings(key_id, values, unset),
        unknown=f"unknown key id {key_id!r} (see prism keys list)",
    )


def _status(declared: Mapping[str, OrgSetting], stored: str, text: str, *, per_key: bool) -> str:
    """What a gateway makes of a stored setting, as the gateway decides it (auth.py)."""
    found = declaration_for(declared, stored, per_key=per_key)
    if isinstance(found, Unusable):
        return f"{found.reason}: ignored"
    try:
        found.parse(text)
    except Exception as exc:
        return f"does not parse, left out: {_reason(exc)}"
    return "ok"


def _not_set(declared: Mapping[str, OrgSetting], stored: Mapping[str, str], per_key: bool) -> None:
    names = [
        name
        for name in sorted(declared)
        if name not in stored and (declared[name].per_key or not per_key)
    ]
    if names:
        print("declared per key, not set:" if per_key else "declared, not set:")
        for name in names:
            help_text = declared[name].help
            print(f"  {name}" + (f": {help_text}" if help_text else ""))


def org_show(store: Store, config: Config, org: str) -> int:
    stored = store.org_settings(org)
    if stored is None:
        return _refusal("org-show", f"unknown organisation {org!r} (see prism keys orgs)", 1)
    declared = _declared(config)
    if not stored:
        print(f"{org}: no settings")
    else:
        table(
            ("setting", "value", "status"),
            [
                (name, _shown(text), _status(declared, name, text, per_key=False))
                for name, text in sorted(stored.items())
            ],
        )
    by_key = store.key_settings(org=org)
    if by_key:
        revoked = {row.key_id for row in store.list_keys(org) if row.revoked}
        print("key settings (prism keys show KEY_ID):")
        table(
            ("key id", "setting", "value", "status"),
            [
                (
                    key_id,
                    name,
                    _shown(text),
                    "key revoked: applies to nothing"
                    if key_id in revoked
                    else _status(declared, name, text, per_key=True),
                )
                for key_id, settings in by_key.items()
                for name, text in sorted(settings.items())
            ],
            indent="  ",
        )
    _not_set(declared, stored, per_key=False)
    return 0


def key_show(store: Store, config: Config, key_id: str) -> int:
    action = "show"
    refused = refuse_key_text(action, key_id)
    if refused is not None:
        return refused
    row = store.key(key_id)
    if row is None:
        return _refusal(action, f"unknown key id {key_id!r} (see prism keys list)", 1)
    stored = store.key_settings(key_id=key_id).get(key_id, {})
    _describe_key(row)
    declared = _declared(config)
    if not stored:
        print(f"{key_id}: no settings of its own")
    else:
        table(
            ("setting", "value", "status"),
            [
                (name, _shown(text), _status(declared, name, text, per_key=True))
                for name, text in sorted(stored.items())
            ],
        )
    _not_set(declared, stored, per_key=True)
    return 0


def _describe_key(row: KeyRow) -> None:
    print(f"key id:  {row.key_id}")
    print(f"org:     {row.org}")
    print(f"scopes:  {','.join(row.scopes)}")
    print(f"created: {row.created}")
    status = f"revoked {row.revoked}: its settings apply to nothing" if row.revoked else "active"
    print(f"status:  {status}")


def org_regions(store: Store, org: str) -> int:
    stored = store.org_settings(org)
    if stored is None:
        return _refusal("org-regions", f"unknown organisation {org!r} (see prism keys orgs)", 1)
    text = stored.get(REGIONS)
    print(f"{org}: {REGIONS} = {_shown(text)}" if text is not None else f"{org}: {REGIONS} not set")
    return 0


# --- output ---


def _reason(exc: Exception) -> str:
    return str(exc) or type(exc).__name__


def _shown(text: str) -> str:
    return text if text else '""'


def settings_cell(settings: Mapping[str, str] | None) -> str:
    """A key's settings in one table cell (``prism keys list``): ``rpm=60; budget@m=5``."""
    if not settings:
        return "-"
    return "; ".join(f"{name}={_shown(text)}" for name, text in sorted(settings.items()))


def table(header: tuple[str, ...], rows: Sequence[tuple[str, ...]], indent: str = "") -> None:
    widths = [max(len(row[i]) for row in [header, *rows]) for i in range(len(header))]
    for row in [header, *rows]:
        cells = "  ".join(cell.ljust(width) for cell, width in zip(row, widths, strict=True))
        print((indent + cells).rstrip())
