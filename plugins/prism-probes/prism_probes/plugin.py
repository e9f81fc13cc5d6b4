"""The prism_proxy entry point ``probes``: ``prism preflight`` (probes of live lines follow)."""

from __future__ import annotations

from prism_proxy import Commands, hookimpl

from .preflight import add_commands


@hookimpl
def prism_cli(commands: Commands) -> None:
    add_commands(commands)
