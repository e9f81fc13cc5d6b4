"""Region lists: the organisation setting ``regions``, ``[prism:regions]``, the caller's header.

A region list is a set of region names as the catalog spells them
(``eu-west-1``, ``europe-west4``): lowercase letters, digits and single
dashes, checked with :func:`prism_proxy.is_region`.  ``None`` stands for
"unrestricted" everywhere in this plugin; an empty frozenset is "nothing
allowed" (an intersection that came out empty), never "anything".
"""

from __future__ import annotations

import logging
from collections.abc import Collection, Iterable

import attrs

from prism_proxy import Config, Generation, Section, is_region, read_settings, setting

__all__ = [
    "DEFAULT_KEY",
    "PLUGIN_NAME",
    "SETTING",
    "SETTING_HELP",
    "Settings",
    "parse_regions",
    "regions_of",
    "served_regions",
    "unserved",
    "warn_unserved",
]

log = logging.getLogger("prism.regions")

PLUGIN_NAME = "regions"
#: The organisation setting (``prism keys org-set ORG regions=eu-west-1,eu-central-1``).
SETTING = "regions"
SETTING_HELP = (
    "comma-separated regions this organisation's calls may be served from "
    "(eu-west-1,eu-central-1); empty: anywhere"
)
DEFAULT_KEY = "default"
#: How much of a name that is not a region an error message quotes.
_QUOTE = 64


def _checked(names: Iterable[str]) -> frozenset[str]:
    """The names as a set; a name that is not a region raises ValueError naming it."""
    found = frozenset(names)
    for name in found:
        if not is_region(name):
            raise ValueError(
                f"{name[:_QUOTE]!r} is not a region name "
                "(lowercase letters, digits and single dashes: eu-west-1, europe-west4)"
            )
    return found


def parse_regions(text: str) -> frozenset[str]:
    """``"eu-west-1, eu-central-1"`` -> ``frozenset({"eu-west-1", "eu-central-1"})``.

    The parser of the organisation setting ``regions``.  Blanks around
    names and empty items are ignored; empty text is the empty set, which
    as a setting means *unrestricted*.  A name that is not a region raises
    ``ValueError`` naming it.
    """
    return _checked(item.strip() for item in text.split(",") if item.strip())


def regions_of(value: object) -> frozenset[str] | None:
    """An organisation's ``regions`` setting as handed over on ``Principal.settings``.

    None (absent) or empty: unrestricted (None).  The parsed value is a
    frozenset; text an auth plugin left unparsed is parsed here.  Anything
    else, or a name that is not a region, raises ``ValueError``: a setting
    that cannot be read must not leave the organisation unrestricted.
    """
    if value is None:
        return None
    if isinstance(value, str):
        found = parse_regions(value)
    elif isinstance(value, Collection) and all(isinstance(item, str) for item in value):
        found = _checked(value)
    else:
        raise ValueError(f"expected a set of region names, got {type(value).__name__}")
    return found or None


def _default_regions(section: Section, key: str, default: None) -> frozenset[str] | None:
    try:
        found = _checked(section.get_list(key))
    except ValueError as exc:
        raise section.error(key, str(exc)) from None
    # Empty (``default =``, ``default = []``) is unrestricted, as an absent key is.
    return found or default


@attrs.frozen
class Settings:
    """``[prism:regions]``: ``default``, the regions of callers without an organisation.

    None: unrestricted (no ``default``, or an empty one).
    """

    default: frozenset[str] | None = setting(
        None,
        help="the regions callers without an organisation may be served from (comma list, "
        "a TOML array in `pyproject.toml`; region names as the catalog spells them: "
        "`eu-west-1`, `europe-west4`); unset or empty: anywhere",
        parse=_default_regions,
        type_text="list of region names",
    )

    @classmethod
    def from_config(cls, config: Config) -> Settings:
        return read_settings(cls, config.section(PLUGIN_NAME))


def served_regions(generation: Generation) -> frozenset[str]:
    """Every region some line a route can carry serves from: chains and plugins' lines."""
    regions = {
        binding.region
        for model in generation.catalog.models.values()
        for binding in model.chain
        if binding.region is not None
    }
    regions.update(
        binding.region for _, binding in generation.added_lines() if binding.region is not None
    )
    return frozenset(regions)


def unserved(generation: Generation, settings: Settings) -> list[str]:
    """The ``default`` regions no line of the catalog serves from, sorted."""
    if settings.default is None:
        return []
    return sorted(settings.default - served_regions(generation))


def warn_unserved(generation: Generation, settings: Settings) -> None:
    """A WARNING (not an error) for ``default`` regions nothing serves from."""
    missing = unserved(generation, settings)
    if not missing:
        return
    left = sorted(settings.default - set(missing)) if settings.default else []
    log.warning(
        "%s: [prism:%s] %s names %s, which no chain line of the catalog serves from%s",
        generation.config.source,
        PLUGIN_NAME,
        DEFAULT_KEY,
        ", ".join(missing),
        (
            f" (callers without an organisation are served from {', '.join(left)} only)"
            if left
            else ": callers without an organisation get 503 for every model"
        ),
    )
