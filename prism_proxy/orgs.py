"""Organisation settings: what plugins read per organisation, declared so it can be checked.

A plugin that reads a per-organisation setting (prism-regions' ``regions``,
prism-billing's ``max_output_price``) declares it with ``prism_org_settings``:
its name, a parser that turns the stored text into the value (raising
``ValueError`` with a message that names the problem), and a line of help.
An auth plugin that knows organisations (prism-keys) stores the text,
checks it against the declaration when an operator sets it, and hands the
parsed values to every hook on ``Principal.settings``.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from typing import Any

import attrs

from .catalog import Catalog

__all__ = ["OrgSetting", "collect_org_settings"]


@attrs.frozen
class OrgSetting:
    """``parse`` refuses what cannot be; ``doubts(value, catalog)`` names what looks
    wrong against the catalog (a region no line serves): said, not refused."""

    name: str
    parse: Callable[[str], Any]
    help: str = ""
    doubts: Callable[[Any, Catalog], Iterable[str]] | None = None


def collect_org_settings(
    answers: Iterable[tuple[str, Iterable[OrgSetting] | None]],
) -> dict[str, OrgSetting]:
    """Every declaration by name; two plugins declaring one name raise ValueError naming both."""
    found: dict[str, tuple[str, OrgSetting]] = {}
    for plugin, settings in answers:
        for setting in settings or ():
            if setting.name in found:
                raise ValueError(
                    f"plugins {found[setting.name][0]!r} and {plugin!r} both declare the "
                    f"organisation setting {setting.name!r}"
                )
            found[setting.name] = (plugin, setting)
    return {name: setting for name, (_, setting) in found.items()}
