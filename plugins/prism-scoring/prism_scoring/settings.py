"""``[prism:scoring]`` and the chain-line keys ``group`` and ``weight``: read and checked."""

from __future__ import annotations

import math
import re
from collections.abc import Mapping
from typing import Any

import attrs

from prism_proxy import (
    Binding,
    Catalog,
    Config,
    ConfigError,
    Generation,
    Section,
    read_settings,
    setting,
    settings_of,
)

__all__ = [
    "GROUP_KEY",
    "PLUGIN_NAME",
    "WEIGHT_KEY",
    "Line",
    "Settings",
    "read_lines",
]

PLUGIN_NAME = "scoring"
GROUP_KEY = "group"
WEIGHT_KEY = "weight"
#: Group names go into the attempt record (a response header): header-safe tokens.
_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]{0,63}")


@attrs.frozen
class Settings:
    """How scores are kept and compared (the *Settings* of the README say why these defaults)."""

    half_life_s: float = setting(
        60.0,
        min=1.0,
        max=86_400.0,
        help="a sample's influence halves every this many seconds of the gateway clock",
    )
    error_penalty_ms: float = setting(
        2000.0,
        min=0.0,
        max=600_000.0,
        help="the latency one unit of error rate is worth: a line failing every attempt scores "
        "this much worse than an equally fast one that never fails (`0`: errors do not count)",
    )

    @classmethod
    def from_config(cls, config: Config) -> Settings:
        return read_settings(cls, config.section(PLUGIN_NAME))

    def check(self, section: Section) -> None:
        # NaN passes every bound (each comparison is false) and would poison every score.
        for key, spec in settings_of(Settings).items():
            value = getattr(self, spec.name)
            if not math.isfinite(value):
                raise section.error(key, f"expected a finite number, got {value!r}")


@attrs.frozen
class Line:
    """What a grouped chain line declared."""

    group: str
    weight: float = 1.0


def read_lines(generation: Generation) -> dict[Binding, Line]:
    """Every grouped line a route can carry, by ``Binding`` (identity); raises ``ConfigError``.

    The catalog's chains are checked whole: values, ``weight`` only with a
    ``group``, and a group's lines consecutive.  Lines a plugin adds beyond
    the chains (``prism_catalog_lines``, e.g. prism-rules' rule-only lines)
    have their values checked; their chains are not visible here, so a
    route that splits a group is ordered run by run, never across.
    """
    catalog = generation.catalog
    lines: dict[Binding, Line] = {}
    for name, model in catalog.models.items():
        closed: dict[str, int] = {}  # group -> index of the line that ended it
        current: str | None = None
        for index, binding in enumerate(model.chain):
            where = f"models.{name}.chain[{index}]"
            line = _line(catalog, where, binding.options)
            group = line.group if line is not None else None
            if group != current:
                if current is not None:
                    closed[current] = index
                if group is not None and group in closed:
                    raise ConfigError(
                        catalog.source,
                        f"{where}.{GROUP_KEY}",
                        f"group {group!r} is interrupted at chain[{closed[group]}]: "
                        "a group's lines must be consecutive in a chain",
                    )
                current = group
            if line is not None:
                lines[binding] = line
    for where, binding in generation.added_lines():
        line = _line(catalog, where, binding.options)
        if line is not None:
            lines[binding] = line
    return lines


def _line(catalog: Catalog, where: str, options: Mapping[str, Any]) -> Line | None:
    group = options.get(GROUP_KEY)
    weight = options.get(WEIGHT_KEY)
    if group is None:
        if weight is not None:
            raise ConfigError(
                catalog.source,
                f"{where}.{WEIGHT_KEY}",
                "weight without a group: a weight only means something among a group's "
                'lines (add group = "<name>")',
            )
        return None
    if not isinstance(group, str) or not _NAME.fullmatch(group):
        raise ConfigError(
            catalog.source,
            f"{where}.{GROUP_KEY}",
            f"expected a name of 1-64 letters, digits, '.', '_', '-', got {group!r}",
        )
    if weight is None:
        return Line(group)
    if (
        isinstance(weight, bool)
        or not isinstance(weight, int | float)
        or not math.isfinite(weight)
        or weight <= 0
    ):
        raise ConfigError(
            catalog.source,
            f"{where}.{WEIGHT_KEY}",
            f"expected a positive number, got {weight!r}",
        )
    return Line(group, float(weight))
