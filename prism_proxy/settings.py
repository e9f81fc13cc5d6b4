"""Configuration sections: their typed getters, and each section described once.

A :class:`Section` holds one section's raw values (strings from ini files,
native values from TOML) with getters that fail with a message naming the
file, section and key.

A section's settings are an attrs class whose fields are made with
:func:`setting`: the key's name, type (from the annotation), default, bounds
and help live in one place.  :func:`read_settings` checks the section's keys
against it, reads each value with the getter its type calls for and builds
the object; :func:`settings_table` writes the table the README shows, so a
documented table can be compared with the schema (the repository's tests do).

Supported types: ``int``, ``float``, ``bool``, ``str``, ``Path``, a
``Literal`` of strings (its values are the choices), ``tuple[str, ...]``
and ``frozenset[str]`` (lists), each optionally ``| None`` (absent means
None).  Anything else takes a ``parse`` function.
"""

from __future__ import annotations

import math
import types
import typing
import urllib.parse
import warnings
from collections.abc import Callable, Iterable, Mapping, Sequence
from pathlib import Path
from typing import Any, TypeVar

import attrs

from .errors import ConfigError

__all__ = [
    "Section",
    "Setting",
    "read_settings",
    "redact_url",
    "setting",
    "settings_of",
    "settings_table",
]

T = TypeVar("T")
_META = "prism.setting"
_MISSING: Any = attrs.NOTHING


def redact_url(url: str) -> str:
    """``url`` with its password (if any) replaced by ``***``: safe to log or show."""
    try:
        parts = urllib.parse.urlsplit(url)
        if parts.password is None:
            return url
        userinfo, _, host = parts.netloc.rpartition("@")
        user = userinfo.partition(":")[0]
        return urllib.parse.urlunsplit(parts._replace(netloc=f"{user}:***@{host}"))
    except ValueError:
        # Unparsable (a bad port, say): show no more than the scheme.
        return url.partition("://")[0] + "://***"


@attrs.define
class Section:
    """One configuration section with typed getters that fail with a clear message.

    Values come as strings from ini files and as native values from TOML;
    every getter accepts both.
    """

    source: str
    name: str
    values: dict[str, Any] = attrs.field(factory=dict)
    #: The operator wrote this section (even empty), as opposed to one made up for a
    #: plugin that has none: a section written for a plugin it leaves off is a mistake.
    written: bool = False

    def _where(self, key: str) -> str:
        return f"[{self.name}] {key}"

    def error(self, key: str, problem: str) -> ConfigError:
        return ConfigError(self.source, self._where(key), problem)

    def warning(self, key: str, problem: str) -> str:
        """A WARNING line worded like :meth:`error`'s message (file, key, problem)."""
        return str(self.error(key, problem))

    def check_keys(self, known: Iterable[str]) -> None:
        """Reject keys this section's owner does not know (typos stop start-up)."""
        allowed = set(known)
        for key in self.values:
            if key not in allowed:
                hint = ", ".join(sorted(allowed)) or "none"
                raise self.error(key, f"unknown key (known keys: {hint})")

    def __contains__(self, key: str) -> bool:
        return key in self.values

    def get_str(self, key: str, default: str | None = None) -> str | None:
        value = self.values.get(key, default)
        if value is None:
            return None
        if not isinstance(value, str):
            raise self.error(key, f"expected a string, got {value!r}")
        return value.strip()

    def get_int(
        self, key: str, default: int, *, min: int | None = None, max: int | None = None
    ) -> int:
        value = self.values.get(key, default)
        if isinstance(value, bool):
            raise self.error(key, f"expected a whole number, got {value!r}")
        if isinstance(value, str):
            try:
                value = int(value.strip().replace("_", ""))
            except ValueError:
                raise self.error(key, f"expected a whole number, got {value!r}") from None
        if not isinstance(value, int):
            raise self.error(key, f"expected a whole number, got {value!r}")
        self._bounds(key, value, min, max)
        return value

    def get_float(
        self, key: str, default: float, *, min: float | None = None, max: float | None = None
    ) -> float:
        value = self.values.get(key, default)
        if isinstance(value, bool):
            raise self.error(key, f"expected a number, got {value!r}")
        if isinstance(value, str):
            try:
                value = float(value.strip())
            except ValueError:
                raise self.error(key, f"expected a number, got {value!r}") from None
        if not isinstance(value, (int, float)):
            raise self.error(key, f"expected a number, got {value!r}")
        if not math.isfinite(value):
            # nan passes every bound check (every comparison with it is false).
            raise self.error(key, f"expected a finite number, got {value!r}")
        self._bounds(key, value, min, max)
        return float(value)

    def get_bool(self, key: str, default: bool) -> bool:
        """``true`` or ``false`` (any case), or a TOML boolean; nothing else.

        ``yes``/``on``/``1`` are refused rather than guessed at: ``enabled = 0``
        read as true, or ``on`` read as false, would be a silent misconfiguration.
        """
        value = self.values.get(key, default)
        if isinstance(value, bool):
            return value
        if isinstance(value, str):
            lowered = value.strip().lower()
            if lowered == "true":
                return True
            if lowered == "false":
                return False
        raise self.error(key, f"expected true or false, got {value!r}")

    def get_list(self, key: str, default: Iterable[str] = ()) -> tuple[str, ...]:
        """A list: comma- or newline-separated in ini files, an array in TOML."""
        value = self.values.get(key)
        if value is None:
            return tuple(default)
        if isinstance(value, str):
            items = [item.strip() for line in value.splitlines() for item in line.split(",")]
            return tuple(item for item in items if item)
        if isinstance(value, list) and all(isinstance(item, str) for item in value):
            return tuple(item.strip() for item in value)
        raise self.error(key, f"expected a list of names, got {value!r}")

    def get_url(self, key: str, *, schemes: Sequence[str]) -> str | None:
        """The URL at ``key`` (None when unset or blank), checked to have one of ``schemes``.

        A plugin names the schemes its client speaks (``("postgresql",
        "postgres")``); a URL with another scheme, or a port that is no
        number, is an error naming ``key`` that shows the URL without its
        password.
        """
        url = self.get_str(key)
        return self._check_url(key, url, schemes) if url else None

    def check_postgres_url(self, key: str, url: str) -> str:
        """Deprecated: ``get_url(key, schemes=("postgresql", "postgres"))``.

        Kept for one release for plugins outside this repository.
        """
        warnings.warn(
            "Section.check_postgres_url is deprecated; use "
            'Section.get_url(key, schemes=("postgresql", "postgres"))',
            DeprecationWarning,
            stacklevel=2,
        )
        return self._check_url(key, url, ("postgresql", "postgres"))

    def _check_url(self, key: str, url: str, schemes: Sequence[str]) -> str:
        scheme = url.partition("://")[0].lower() if "://" in url else ""
        if scheme not in schemes:
            wanted = " or ".join(f"{name}://" for name in schemes)
            raise self.error(key, f"expected a {wanted} URL, got {redact_url(url)!r}")
        try:
            urllib.parse.urlsplit(url).port  # noqa: B018 - a bad port raises here, not later
        except ValueError as exc:
            raise self.error(key, f"{redact_url(url)}: {exc}") from None
        return url

    def _bounds(self, key: str, value: float, lo: float | None, hi: float | None) -> None:
        if lo is not None and value < lo:
            raise self.error(key, f"must be at least {lo}, got {value}")
        if hi is not None and value > hi:
            raise self.error(key, f"must be at most {hi}, got {value}")


@attrs.frozen
class Setting:
    """What :func:`setting` records about one key (read it with :func:`settings_of`)."""

    name: str
    key: str
    type: Any
    default: Any
    help: str
    min: float | None = None
    max: float | None = None
    #: ``parse(section, key, default)``: the value, or ``section.error(key, ...)``.
    parse: Callable[[Section, str, Any], Any] | None = None
    #: How the README shows a default computed at read time ("the longest call budget").
    default_text: str | None = None
    #: How the README shows the type when the annotation does not say it (a ``parse``).
    type_text: str | None = None

    @property
    def choices(self) -> tuple[str, ...] | None:
        inner = _optional_inner(self.type)
        if typing.get_origin(inner) is typing.Literal:
            return tuple(str(choice) for choice in typing.get_args(inner))
        return None


def setting(
    default: Any = _MISSING,
    *,
    help: str,
    min: float | None = None,
    max: float | None = None,
    key: str | None = None,
    parse: Callable[[Section, str, Any], Any] | None = None,
    default_text: str | None = None,
    type_text: str | None = None,
) -> Any:
    """An attrs field that is a configuration key (``key`` when it is spelt otherwise)."""
    meta = {
        _META: {
            "help": help,
            "min": min,
            "max": max,
            "key": key,
            "parse": parse,
            "default_text": default_text,
            "type_text": type_text,
        }
    }
    if isinstance(default, (list, dict, set)):
        raise TypeError("a setting's default must be immutable (a tuple or frozenset)")
    return attrs.field(default=default, metadata=meta)


def settings_of(cls: type[Any]) -> Mapping[str, Setting]:
    """The settings ``cls`` declares, by key, in declaration order."""
    attrs.resolve_types(cls)
    found: dict[str, Setting] = {}
    for field in attrs.fields(cls):
        meta = field.metadata.get(_META)
        if meta is None:
            continue
        key = meta["key"] or field.name
        found[key] = Setting(
            name=field.name,
            key=key,
            type=field.type,
            default=field.default,
            help=meta["help"],
            min=meta["min"],
            max=meta["max"],
            parse=meta["parse"],
            default_text=meta["default_text"],
            type_text=meta["type_text"],
        )
    return found


def read_settings(
    cls: type[T],
    section: Section,
    *,
    defaults: Mapping[str, Any] | None = None,
    **given: Any,
) -> T:
    """Read ``section`` into ``cls``: unknown keys refused, every value checked.

    ``defaults`` replaces the declared default of some keys (a default
    computed from elsewhere in the configuration); ``given`` fills the
    fields that are not settings.  After building, ``cls.check(self,
    section)`` runs when defined: the checks that tie two keys together.
    """
    declared = settings_of(cls)
    section.check_keys(declared)
    values: dict[str, Any] = {}
    for key, spec in declared.items():
        default = (defaults or {}).get(key, spec.default)
        values[spec.name] = read_value(section, spec, default)
    built = cls(**values, **given)
    check = getattr(built, "check", None)
    if check is not None:
        check(section)
    return built


def read_value(section: Section, spec: Setting, default: Any) -> Any:
    """One key's value, checked as its declaration says."""
    key = spec.key
    if spec.parse is not None:
        return spec.parse(section, key, default)
    inner = _optional_inner(spec.type)
    optional = inner is not spec.type
    if optional and section.values.get(key) in (None, ""):
        return default if default is not _MISSING else None
    if default is _MISSING and key not in section:
        raise section.error(key, "missing")
    if inner is bool:
        return section.get_bool(key, default)
    if inner is int:
        return section.get_int(key, default, min=_int(spec.min), max=_int(spec.max))
    if inner is float:
        return section.get_float(key, default, min=spec.min, max=spec.max)
    if inner is str or inner is Path:
        text = section.get_str(key, default if default is None else str(default))
        return Path(text) if inner is Path and text is not None else text
    origin = typing.get_origin(inner)
    if origin is typing.Literal:
        return _choice(section, key, default, spec.choices or ())
    if origin in (tuple, frozenset):
        items = section.get_list(key, default)
        return frozenset(items) if origin is frozenset else items
    raise TypeError(f"{spec.name}: no reader for {spec.type!r}; give the setting a parse")


def _choice(section: Section, key: str, default: Any, choices: tuple[str, ...]) -> str:
    value = section.get_str(key, default)
    for choice in choices:
        if value is not None and value.lower() == choice.lower():
            return choice
    raise section.error(key, f"expected {_either(choices)}, got {value!r}")


def _either(choices: tuple[str, ...]) -> str:
    return ", ".join(choices[:-1]) + f" or {choices[-1]}" if len(choices) > 1 else choices[0]


def _int(bound: float | None) -> int | None:
    return None if bound is None else int(bound)


def _optional_inner(annotation: Any) -> Any:
    """``X`` for ``X | None``; the annotation itself otherwise."""
    if typing.get_origin(annotation) in (typing.Union, types.UnionType):
        args = [arg for arg in typing.get_args(annotation) if arg is not type(None)]
        if len(args) == 1:
            return args[0]
    return annotation


def settings_table(cls: type[Any]) -> str:
    """The Markdown table of ``cls``'s settings, as READMEs show it."""
    rows = ["| key | type | default | what it does |", "| --- | --- | --- | --- |"]
    for spec in settings_of(cls).values():
        cells = (f"`{spec.key}`", _type_text(spec), _default_text(spec), spec.help)
        rows.append("| " + " | ".join(cell.replace("|", "\\|") for cell in cells) + " |")
    return "\n".join(rows)


def _type_text(spec: Setting) -> str:
    inner = _optional_inner(spec.type)
    if spec.type_text is not None:
        text = spec.type_text
    elif spec.choices:
        text = " or ".join(f"`{choice}`" for choice in spec.choices)
    elif inner is bool:
        text = "`true` or `false`"
    elif inner is int:
        text = "whole number"
    elif inner is float:
        text = "number"
    elif typing.get_origin(inner) in (tuple, frozenset):
        text = "list"
    else:
        text = "text"
    low, high = _number(spec.min), _number(spec.max)
    if low is not None and high is not None:
        text += f", {low} to {high}"
    elif low is not None:
        text += f", at least {low}"
    elif high is not None:
        text += f", at most {high}"
    return text


def _number(bound: float | None) -> str | None:
    """A bound as an operator would write it: ``1099511627776``, not ``1.09951e+12``."""
    if bound is None:
        return None
    return str(int(bound)) if float(bound).is_integer() else repr(float(bound))


def _default_text(spec: Setting) -> str:
    if spec.default_text is not None:
        return spec.default_text
    default = spec.default
    if default is _MISSING:
        return "required"
    if default is None:
        return "unset"
    if isinstance(default, bool):
        return f"`{str(default).lower()}`"
    if isinstance(default, (tuple, frozenset)):
        return ", ".join(f"`{item}`" for item in sorted(default)) if default else "none"
    if isinstance(default, float):
        return f"`{default:g}`"
    return f"`{default}`"


def documented_table(readme: str, section: str) -> str | None:
    """The table a README shows between ``<!-- settings: SECTION -->`` and
    ``<!-- /settings -->`` (None: the README shows none for ``section``)."""
    start = f"<!-- settings: {section} -->"
    if start not in readme:
        return None
    body = readme.split(start, 1)[1].split("<!-- /settings -->", 1)[0]
    return body.strip()
