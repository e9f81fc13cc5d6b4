"""The prism_proxy entry point ``probes``: live probes (``[prism:probes] enabled``) and
``prism preflight``."""

from __future__ import annotations

from prism_proxy import Commands, Generation, hookimpl

from .preflight import add_commands
from .prober import Prober, Spend
from .settings import ProbeSettings

PROBER_NAME = "probes.prober"


@hookimpl
def prism_generation(generation: Generation) -> None:
    settings = ProbeSettings.from_config(generation.config)
    if settings is None:
        return
    spend = generation.keep(("probes.spend",), Spend)
    prober = Prober(settings, generation, spend)
    generation.cleanup_ctx.append(prober.serving)
    generation.register(prober, PROBER_NAME)


@hookimpl
def prism_cli(commands: Commands) -> None:
    add_commands(commands)
