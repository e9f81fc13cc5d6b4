"""Which declaration a stored setting name answers to, on an organisation or on a key.

One rule for the CLI (which refuses a name) and the gateway (which ignores
a stored one): ``NAME`` is parsed by ``NAME``'s declaration, ``NAME@MODEL``
by ``NAME``'s as well when it is declared ``per_model``, and a key's
settings only by declarations that say ``per_key``.  A declaration may
change after a value was stored (a plugin upgraded or removed), so the
gateway meets every case the CLI refuses.
"""

from __future__ import annotations

from collections.abc import Mapping

import attrs

from prism_proxy import OrgSetting, split_setting_name

__all__ = ["NOT_PER_KEY", "NOT_PER_MODEL", "UNDECLARED", "Unusable", "declaration_for"]


@attrs.frozen
class Unusable:
    """Why no declaration parses a stored name: a phrase ("declared by no loaded plugin")."""

    reason: str


UNDECLARED = Unusable("declared by no loaded plugin")
NOT_PER_KEY = Unusable("organisation-only (its declaration does not allow it per key)")
NOT_PER_MODEL = Unusable("not settable per model (its declaration does not allow NAME@MODEL)")


def declaration_for(
    declared: Mapping[str, OrgSetting], stored: str, *, per_key: bool
) -> OrgSetting | Unusable:
    """The declaration whose parser reads the setting stored as ``stored``, or why none does.

    ``per_key``: the setting is stored on a key, not on an organisation.
    """
    name, model = split_setting_name(stored)
    declaration = declared.get(name)
    if declaration is None:
        return UNDECLARED
    if per_key and not declaration.per_key:
        return NOT_PER_KEY
    if model is not None and not declaration.per_model:
        return NOT_PER_MODEL
    return declaration
