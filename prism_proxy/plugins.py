"""The plugin host: discovery through entry points, blocking, requirements, validation."""

from __future__ import annotations

import importlib.metadata
import inspect
from collections.abc import Iterable
from pathlib import Path

import attrs
import pluggy

from . import hookspecs
from .config import Config
from .defaults import default_plugins
from .errors import ConfigError

__all__ = ["ENTRY_POINT_GROUP", "PluginInfo", "describe_plugins", "make_plugin_manager"]

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
    for name in config.disable:
        pm.set_blocked(name)
    for plugin, name in default_plugins():
        pm.register(plugin, name)
    if load_entrypoints:
        try:
            pm.load_setuptools_entrypoints(ENTRY_POINT_GROUP)
        except pluggy.PluginValidationError as exc:
            raise ConfigError(config.source, f"plugin {_name(exc)}", str(exc)) from None
    for plugin, name in extra_plugins:
        if not pm.is_blocked(name):
            pm.register(plugin, name)
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
    return pm


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
            project, version = "prism-proxy", _version("prism-proxy")
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
