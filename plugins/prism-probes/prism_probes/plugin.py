"""The prism_proxy entry point ``probes``: live probes (``[prism:probes] enabled``) and
``prism preflight``."""

from __future__ import annotations

from typing import Any

from prism_proxy import CatalogKeys, Commands, ConfigError, Generation, hookimpl

from .fixtures import PROBE_KINDS
from .preflight import add_commands
from .prober import Prober, Spend
from .settings import SECTION, ProbeSettings

PROBER_NAME = "probes.prober"


@hookimpl
def prism_generation(generation: Generation) -> None:
    _check_probe_kinds(generation)
    settings = ProbeSettings.from_config(generation.config)
    if settings is None:
        return
    spend = generation.keep(("probes.spend",), Spend)
    prober = Prober(settings, generation, spend)
    generation.cleanup_ctx.append(prober.serving)
    generation.register(prober, PROBER_NAME)


@hookimpl
def prism_settings() -> dict[str, type[Any]]:
    return {SECTION: ProbeSettings}


@hookimpl
def prism_catalog_keys() -> CatalogKeys:
    # probe = "chat" | "embeddings" | "off" on a chain line: what its probes ask.
    return CatalogKeys(binding=frozenset({"probe"}))


@hookimpl
def prism_traffic_kinds() -> tuple[str, ...]:
    # The prober's calls (internal token) and prism preflight's (admin token).
    return ("probe", "preflight")


@hookimpl
def prism_cli(commands: Commands) -> None:
    add_commands(commands)


def _check_probe_kinds(generation: Generation) -> None:
    catalog = generation.catalog
    for model in catalog.models.values():
        for index, line in enumerate(model.chain):
            kind = line.options.get("probe", "chat")
            if kind not in PROBE_KINDS:
                raise ConfigError(
                    catalog.source,
                    f"models.{model.name}.chain[{index}].probe",
                    f"expected one of {', '.join(PROBE_KINDS)}, got {kind!r}",
                )
