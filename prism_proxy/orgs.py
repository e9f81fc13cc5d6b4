"""Organisation settings: what plugins read per organisation, declared so it can be checked.

A plugin that reads a per-organisation setting (prism-regions' ``regions``,
prism-billing's ``max_output_price``) declares it with ``prism_org_settings``:
its name, a parser that turns the stored text into the value (raising
``ValueError`` with a message that names the problem), and a line of help.
An auth plugin that knows organisations (prism-keys) stores the text,
checks it against the declaration when an operator sets it, and hands the
parsed values to every hook on ``Principal.settings``.

A declaration may allow more: ``per_key`` lets an operator set it on one key
too (``prism keys set KEY_ID NAME=VALUE``; the key's values reach hooks on
``Principal.key_settings``), and ``per_model`` lets it be set for one model
under the name ``NAME@MODEL`` (``budget@gpt-4o=50/day``), parsed by the same
parser and handed over under that name.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from typing import Any

import attrs

from .catalog import Catalog

__all__ = ["OrgSetting", "collect_org_settings", "per_model_name", "split_setting_name"]

#: Between a setting's name and the model it is set for: ``budget@gpt-4o``.
MODEL_SEPARATOR = "@"


@attrs.frozen
class OrgSetting:
    """``parse`` refuses what cannot be; ``doubts(value, catalog)`` names what looks
    wrong against the catalog (a region no line serves): said, not refused."""

    name: str
    parse: Callable[[str], Any]
    help: str = ""
    doubts: Callable[[Any, Catalog], Iterable[str]] | None = None
    #: May also be set on one key (``Principal.key_settings``).
    per_key: bool = False
    #: May also be set for one model, as ``NAME@MODEL``.
    per_model: bool = False


def per_model_name(name: str, model: str) -> str:
    """The stored name of setting ``name`` for ``model``: ``budget@gpt-4o``."""
    return f"{name}{MODEL_SEPARATOR}{model}"


def split_setting_name(stored: str) -> tuple[str, str | None]:
    """``budget@gpt-4o`` → ``("budget", "gpt-4o")``; a plain name → ``(name, None)``."""
    name, sep, model = stored.partition(MODEL_SEPARATOR)
    return (name, model) if sep else (stored, None)


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
