"""The plugin host: discovery through entry points, blocking, requirements, validation."""

from __future__ import annotations

import difflib
import importlib.metadata
import inspect
from collections.abc import Callable, Iterable, Mapping
from pathlib import Path
from typing import Any, cast

import attrs
import pluggy

from . import hookspecs
from .config import Config
from .defaults import DEFAULT_AUTH, default_plugins
from .distribution import DISTRIBUTION
from .errors import ConfigError
from .orgs import OrgSetting, collect_org_settings
from .providers import ParamProfile, ProviderFactory

__all__ = [
    "ENTRY_POINT_GROUP",
    "PluginInfo",
    "authenticating_plugins",
    "describe_plugins",
    "declared_org_settings",
    "disabled_owner",
    "installed_names",
    "make_plugin_manager",
    "org_settings",
    "param_profiles",
    "provider_kinds",
]

ENTRY_POINT_GROUP = "prism_proxy"


def make_plugin_manager(
    config: Config,
    *,
    extra_plugins: Iterable[tuple[object, str]] = (),
    load_entrypoints: bool = True,
) -> pluggy.PluginManager:
    """A plugin manager with the core's defaults and every installed, non-disabled plugin.

    ``disable`` names are blocked before anything is imported, so a broken
    plugin can be switched off.  ``required_plugins`` fail start-up when
    missing, and a hook implementation that matches no spec is an error
    rather than silently never called.
    """
    pm = pluggy.PluginManager(ENTRY_POINT_GROUP)
    pm.add_hookspecs(hookspecs)
    extra_plugins = list(extra_plugins)
    installed = {*installed_names(load_entrypoints), *(name for _, name in extra_plugins)}
    for name in config.disable:
        if name not in installed:
            # A typo (``breakr``) would leave the plugin it meant running.
            raise ConfigError(
                config.source, "[prism] disable", _not_installed(name, repr, installed)
            )
    for name in config.disable:
        pm.set_blocked(name)
    for plugin, name in default_plugins():
        pm.register(plugin, name)
    # Registered first: an installed plugin of the same name (a plugin under test
    # that is also installed) is then the one given here, not loaded twice.
    for plugin, name in extra_plugins:
        if not pm.is_blocked(name):
            pm.register(plugin, name)
    if load_entrypoints:
        try:
            pm.load_setuptools_entrypoints(ENTRY_POINT_GROUP)
        except pluggy.PluginValidationError as exc:
            raise ConfigError(config.source, f"plugin {_name(exc)}", str(exc)) from None
    for name in config.required_plugins:
        if pm.is_blocked(name):
            raise ConfigError(
                config.source,
                "[prism] required_plugins",
                f"plugin {name!r} is required but disabled by [prism] disable",
            )
        if pm.get_plugin(name) is None:
            raise ConfigError(
                config.source,
                "[prism] required_plugins",
                f"plugin {name!r} is required but not installed (see `prism plugins`)",
            )
    try:
        pm.check_pending()
    except pluggy.PluginValidationError as exc:
        raise ConfigError(config.source, f"plugin {_name(exc)}", str(exc)) from None
    for name in config.sections:
        if pm.is_blocked(name):
            raise ConfigError(
                config.source,
                f"[prism:{name}]",
                f"plugin {name!r} is disabled by [prism] disable: remove the section or "
                "the disable",
            )
        if pm.get_plugin(name) is None:
            raise ConfigError(
                config.source,
                f"[prism:{name}]",
                _not_installed(name, lambda close: f"[prism:{close}]", installed),
            )
    return pm


def _not_installed(name: str, spelt: Callable[[str], str], installed: set[str]) -> str:
    """The problem with a plugin name nothing installed has, suggesting the closest one
    (spelt as the operator would write it)."""
    close = difflib.get_close_matches(name, sorted(installed), n=1)
    hint = f"did you mean {spelt(close[0])}? " if close else ""
    return (
        f"no installed plugin is named {name!r} "
        f"({hint}installed: {', '.join(sorted(installed)) or 'none'})"
    )


def authenticating_plugins(pm: pluggy.PluginManager) -> list[str]:
    """The registered names of what authenticates callers; empty: the gateway is open."""
    return sorted(
        {impl.plugin_name for impl in pm.hook.prism_authenticate.get_hookimpls()} - {DEFAULT_AUTH}
    )


def installed_names(load_entrypoints: bool = True) -> set[str]:
    """The names of the installed plugins (entry points), loaded or not."""
    if not load_entrypoints:
        return set()
    return {ep.name for ep in importlib.metadata.entry_points(group=ENTRY_POINT_GROUP)}


def disabled_owner(config: Config) -> Callable[[str, str], str | None]:
    """For error messages: which disabled plugin would have understood a catalog key or kind.

    Only asked on the error path, and only then are disabled plugins imported
    (best effort: one that fails to import is passed over).
    """

    def owner(what: str, name: str) -> str | None:
        for ep in importlib.metadata.entry_points(group=ENTRY_POINT_GROUP):
            if ep.name not in config.disable:
                continue
            try:
                module = ep.load()
            except Exception:
                continue
            if _understands(module, what, name):
                return f"plugin {ep.name!r}, which [prism] disable in {config.source} turned off"
        return None

    return owner


def _understands(module: object, what: str, name: str) -> bool:
    if what == "kind":
        kinds = getattr(module, "prism_provider_kinds", None)
        return callable(kinds) and name in (kinds() or {})
    keys = getattr(module, "prism_catalog_keys", None)
    declared = keys() if callable(keys) else None
    return declared is not None and name in getattr(declared, what, frozenset())


def provider_kinds(config: Config, pm: pluggy.PluginManager) -> dict[str, ProviderFactory]:
    """Every provider kind the plugins register; two claiming one kind is an error."""
    kinds: dict[str, ProviderFactory] = {}
    for answer in pm.hook.prism_provider_kinds():
        for kind, factory in (answer or {}).items():
            if kind in kinds:
                raise ConfigError(
                    config.source, "plugins", f"two plugins register provider kind {kind!r}"
                )
            kinds[kind] = factory
    return kinds


def described_sections(config: Config, pm: pluggy.PluginManager) -> dict[str, type[Any]]:
    """Every described section, ``prism`` (the core's) first, by section name
    (``prism:breaker``); a section two plugins describe is a configuration error."""
    sections: dict[str, type[Any]] = {"prism": Config}
    for answer in pm.hook.prism_settings():
        for name, schema in (answer or {}).items():
            section = f"prism:{name}"
            if section in sections:
                raise ConfigError(config.source, f"[{section}]", "described by two plugins")
            sections[section] = schema
    return sections


def param_profiles(config: Config, pm: pluggy.PluginManager) -> dict[str, ParamProfile]:
    """Every parameter profile the plugins ship; a family two plugins register is an error.

    Each implementation is asked on its own so that the error names both plugins.
    """
    profiles: dict[str, ParamProfile] = {}
    owners: dict[str, str] = {}
    for impl in pm.hook.prism_param_profiles.get_hookimpls():  # in registration order
        if impl.hookwrapper or impl.wrapper:
            continue
        answer = impl.function()
        if answer is None:
            continue
        if not isinstance(answer, Mapping):
            raise ConfigError(
                config.source,
                f"plugin {impl.plugin_name}",
                f"prism_param_profiles returned {type(answer).__name__}, "
                "expected a mapping of family name to ParamProfile",
            )
        for family, profile in answer.items():
            if not isinstance(family, str) or not family or not isinstance(profile, ParamProfile):
                raise ConfigError(
                    config.source,
                    f"plugin {impl.plugin_name}",
                    f"prism_param_profiles: {family!r} is not a family name with a ParamProfile",
                )
            if family in owners:
                raise ConfigError(
                    config.source,
                    "plugins",
                    f"plugins {owners[family]!r} and {impl.plugin_name!r} both register "
                    f"parameter profile (family) {family!r}",
                )
            owners[family] = impl.plugin_name
            profiles[family] = profile
    return profiles


def org_settings(config: Config, pm: pluggy.PluginManager) -> dict[str, OrgSetting]:
    """Every organisation setting the loaded plugins declare; one name twice is an error."""
    caller = pm.hook.prism_org_settings
    # Asked one implementation at a time, so that a clash names both plugins.
    answers: list[tuple[str, Iterable[OrgSetting] | None]] = []
    for impl in caller.get_hookimpls():  # in registration order
        declared = cast("Iterable[OrgSetting] | None", impl.function())
        answers.append((impl.plugin_name, declared))
    try:
        return collect_org_settings(answers)
    except ValueError as exc:
        raise ConfigError(config.source, "plugins", str(exc)) from None


def declared_org_settings(config: Config) -> dict[str, OrgSetting]:
    """The organisation settings the plugins ``config`` loads declare (for CLI commands)."""
    return org_settings(config, make_plugin_manager(config))


def _name(exc: pluggy.PluginValidationError) -> str:
    return getattr(exc.plugin, "__name__", type(exc.plugin).__name__)


@attrs.frozen
class PluginInfo:
    name: str
    distribution: str
    version: str
    location: str


def describe_plugins(pm: pluggy.PluginManager) -> list[PluginInfo]:
    """Every registered plugin with the distribution it came from and where it lives."""
    dists = {id(plugin): dist for plugin, dist in pm.list_plugin_distinfo()}
    infos = []
    for name, plugin in pm.list_name_plugin():
        if plugin is None:
            continue
        dist = dists.get(id(plugin))
        if dist is not None:
            project, version = dist.project_name, dist.version
        elif name.startswith("prism."):
            project, version = DISTRIBUTION, _version(DISTRIBUTION)
        else:
            project, version = "(registered directly)", "-"
        infos.append(PluginInfo(name, project, version, _location(plugin)))
    return sorted(infos, key=lambda info: info.name)


def _version(dist: str) -> str:
    try:
        return importlib.metadata.version(dist)
    except importlib.metadata.PackageNotFoundError:
        return "unknown"


def _location(plugin: object) -> str:
    target = plugin if inspect.ismodule(plugin) else type(plugin)
    try:
        return str(Path(inspect.getfile(target)))
    except (TypeError, OSError):
        return "?"
