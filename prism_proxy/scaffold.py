"""``prism new-plugin NAME --kind provider|policy [--wire openai|custom] [DIR]``: start a plugin.

The files written are shaped like the bundled plugins (``plugins/prism-*``):
a ``pyproject.toml`` with the ``prism_proxy`` entry point, one package, a
README and tests that run the real gateway through ``prism_proxy.testing``
and pass as written.  The templates are package data
(``prism_proxy/scaffold_templates/<kind>/``): real files, readable and
editable as what they become, with ``{{name}}``-style placeholders filled by
plain substitution (no template engine to depend on, nothing to escape in
the Python they contain).
"""

from __future__ import annotations

import argparse
import importlib.metadata
import importlib.resources
import importlib.util
import re
import shlex
import sys
from collections.abc import Iterator, Mapping, Sequence
from importlib.resources.abc import Traversable
from pathlib import Path, PurePosixPath

import attrs

from .commands import Commands
from .config import Config

__all__ = [
    "KINDS",
    "PluginNames",
    "ScaffoldError",
    "add_scaffold_command",
    "name_problem",
    "write_plugin",
]

KINDS = ("policy", "provider")
#: What a provider's upstream speaks: OpenAI's API, or an API of its own (a wire
#: format the plugin registers, with the translation from OpenAI chat).
WIRES = ("openai", "custom")

#: Lowercase words of letters and digits joined by single dashes, starting with
#: a letter: the name is also a package (``prism_<name>``), a class name prefix,
#: a header name and an environment variable part, and must be valid as each.
_NAME = re.compile(r"[a-z][a-z0-9]*(?:-[a-z0-9]+)*")
_PLACEHOLDER = re.compile(r"\{\{(\w+)\}\}")
_TEMPLATE_SUFFIX = ".tmpl"


class ScaffoldError(Exception):
    """Why nothing was written: one line, for stderr."""


@attrs.frozen
class PluginNames:
    """Every name the files use, derived from the entry point name."""

    name: str  # the entry point: `disable =`, `[prism:<name>]`, the provider kind
    distribution: str  # prism-<name>
    package: str  # prism_<name with underscores>
    module: str  # <name with underscores>: the test file's name
    title: str  # CamelCase, for class names
    constant: str  # UPPER_CASE, for environment variable names

    @classmethod
    def from_name(cls, name: str) -> PluginNames:
        problem = name_problem(name)
        if problem is not None:
            raise ScaffoldError(problem)
        module = name.replace("-", "_")
        return cls(
            name=name,
            distribution=f"prism-{name}",
            package=f"prism_{module}",
            module=module,
            title="".join(part.capitalize() for part in name.split("-")),
            constant=module.upper(),
        )

    def placeholders(self) -> dict[str, str]:
        return attrs.asdict(self)


def name_problem(name: str) -> str | None:
    """What is wrong with ``name`` as a plugin name, or None."""
    if name.startswith("prism-"):
        # The prefix is added: `prism new-plugin prism-x` would make prism-prism-x.
        return (
            f"invalid plugin name {name!r}: give the name without 'prism-' "
            f"(the distribution becomes prism-{name.removeprefix('prism-')})"
        )
    if not _NAME.fullmatch(name):
        return (
            f"invalid plugin name {name!r}: use lowercase letters, digits and single "
            "dashes, starting with a letter (e.g. 'team-header')"
        )
    return None


def render(template: str, values: Mapping[str, str], *, where: str) -> str:
    """``template`` with every ``{{key}}`` replaced; an unknown key is a template bug."""

    def substitute(match: re.Match[str]) -> str:
        key = match.group(1)
        if key not in values:
            raise ScaffoldError(f"template {where}: unknown placeholder {{{{{key}}}}}")
        return values[key]

    return _PLACEHOLDER.sub(substitute, template)


def templates(kind: str) -> Iterator[tuple[PurePosixPath, str]]:
    """``(relative path template, text)`` for each file of ``kind``'s distribution."""
    root = importlib.resources.files("prism_proxy") / "scaffold_templates" / kind
    if not root.is_dir():
        raise ScaffoldError(f"unknown plugin kind {kind!r} (known: {', '.join(KINDS)})")
    yield from _walk(root, PurePosixPath())


def _walk(folder: Traversable, relative: PurePosixPath) -> Iterator[tuple[PurePosixPath, str]]:
    # Sorted, so that the listing printed is the same on every run.
    for entry in sorted(folder.iterdir(), key=lambda e: e.name):
        if entry.is_dir():
            yield from _walk(entry, relative / entry.name)
        elif entry.name.endswith(_TEMPLATE_SUFFIX):
            # The suffix keeps templates away from mypy, ruff and pytest, which
            # would choke on the placeholders in a `.py` file.
            name = entry.name.removesuffix(_TEMPLATE_SUFFIX)
            yield relative / name, entry.read_text(encoding="utf-8")


def write_plugin(name: str, kind: str, directory: Path, wire: str = "openai") -> list[Path]:
    """Write the ``kind`` plugin ``name`` into ``directory``; return the files written.

    ``wire = "custom"`` (providers only) writes a provider for an API of its
    own: its wire format, the translation from OpenAI chat, its error model.

    Raises :class:`ScaffoldError` before writing anything if the name or kind
    is wrong or ``directory`` exists and is not an empty directory: nothing an
    author already has is ever overwritten.
    """
    names = PluginNames.from_name(name)
    if kind not in KINDS:
        raise ScaffoldError(f"unknown plugin kind {kind!r} (known: {', '.join(KINDS)})")
    if wire not in WIRES:
        raise ScaffoldError(f"unknown wire {wire!r} (known: {', '.join(WIRES)})")
    if wire != "openai" and kind != "provider":
        raise ScaffoldError("--wire is for provider plugins (--kind provider)")
    if directory.exists() and not directory.is_dir():
        raise ScaffoldError(f"{directory} exists and is not a directory")
    if directory.is_dir() and any(directory.iterdir()):
        raise ScaffoldError(f"{directory} exists and is not empty; choose another DIR")
    values = names.placeholders()
    source = kind if wire == "openai" else f"{kind}-{wire}"
    # Everything is rendered before the first file is written, so that a
    # template mistake leaves no half-written distribution behind.
    files = [
        (
            directory.joinpath(*render(str(path), values, where=f"{source}/{path}").split("/")),
            render(text, values, where=f"{source}/{path}"),
        )
        for path, text in templates(source)
    ]
    written = []
    for target, text in files:
        target.parent.mkdir(parents=True, exist_ok=True)
        target.write_text(text, encoding="utf-8")
        written.append(target)
    return written


def _clash(names: PluginNames) -> str | None:
    """An installed plugin or package the new one would be confused with, if any."""
    for entry_point in importlib.metadata.entry_points(group="prism_proxy"):
        if entry_point.name == names.name:
            return f"an installed plugin is already named {names.name!r} ({entry_point.value})"
    if importlib.util.find_spec(names.package) is not None:
        return f"a package named {names.package} is already importable"
    return None


def _new_plugin(args: argparse.Namespace, config: Config) -> int:
    directory: Path = args.directory or Path(f"prism-{args.name}")
    # Looked for before writing: once written, the new package itself may be
    # importable from the current directory and would look like a clash.
    clash = None if name_problem(args.name) else _clash(PluginNames.from_name(args.name))
    try:
        written = write_plugin(args.name, args.kind, directory, args.wire)
    except ScaffoldError as exc:
        print(f"prism new-plugin: {exc}", file=sys.stderr)
        return 2
    except OSError as exc:
        print(f"prism new-plugin: cannot write {directory}: {exc}", file=sys.stderr)
        return 1
    names = PluginNames.from_name(args.name)
    if clash is not None:
        # Written all the same (the author may be rewriting it), but the
        # generated tests would load the installed one: say so now.
        print(f"prism new-plugin: warning: {clash}; rename to avoid a clash", file=sys.stderr)
    what = f"{args.kind} plugin" if args.wire == "openai" else f"{args.kind} plugin of its own wire"
    print(f"wrote {names.distribution}, a {what} named {names.name!r}:")
    for path in written:
        print(f"  {path}")
    where = shlex.quote(str(directory))
    print("next:")
    print(f"  pip install -e {where}")
    print(f"  pytest {where}")
    return 0


def add_scaffold_command(commands: Commands) -> None:
    """Add ``prism new-plugin``; it runs with or without a configuration."""
    parser = commands.add(
        "new-plugin",
        "write a new plugin distribution (pyproject, package, README, passing tests)",
        _new_plugin,
        needs_config=False,
    )
    parser.add_argument(
        "name",
        metavar="NAME",
        help="the plugin's entry point name, e.g. team-header (distribution prism-NAME)",
    )
    parser.add_argument(
        "--kind",
        choices=KINDS,
        required=True,
        help="provider: a provider kind for the catalog; policy: per-call hooks",
    )
    parser.add_argument(
        "--wire",
        choices=WIRES,
        default="openai",
        help="a provider's upstream API: openai (OpenAI-compatible, the default) or custom "
        "(an API of its own: its wire format and the translation from OpenAI chat)",
    )
    parser.add_argument(
        "directory",
        metavar="DIR",
        nargs="?",
        type=Path,
        help="where to write it; must not exist or be empty (default: ./prism-NAME)",
    )
    _accept_directory_after_options(parser)


def _accept_directory_after_options(parser: argparse.ArgumentParser) -> None:
    """Make ``prism new-plugin NAME --kind KIND DIR`` work on Python 3.11 too.

    Older argparse binds the optional positional DIR (to nothing) while it
    matches NAME, before it reaches ``--kind``; a DIR written after ``--kind``
    then comes back unrecognised and ``prism`` fails.  The one leftover
    argument is taken as DIR here; where argparse already did it, this does
    nothing.
    """
    parse = parser.parse_known_args

    def parse_known_args(
        args: Sequence[str] | None = None, namespace: argparse.Namespace | None = None
    ) -> tuple[argparse.Namespace, list[str]]:
        parsed, extras = parse(args, namespace)
        if parsed.directory is None and len(extras) == 1 and not extras[0].startswith("-"):
            parsed.directory = Path(extras[0])
            extras = []
        return parsed, extras

    # The `prism` parser calls this on the subcommand's parser (argparse's
    # subparsers action does); an instance attribute is the one hook for it
    # that needs no change to cli.py.
    parser.parse_known_args = parse_known_args  # type: ignore[method-assign, assignment]
