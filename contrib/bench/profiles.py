"""The ``full`` profile: Prism as an operator runs it, every bundled plugin on.

keys (the load generator sends a real key), billing (prices, the ledger on
SQLite at ``synchronous = full``), the breaker, regions (an allowed region by
default), 200 routing rules of which none match, metrics and the timeout
header.  ``without`` leaves one plugin out (and the configuration only it
reads), so that full minus that plugin shows what the plugin costs.
"""

from __future__ import annotations

import argparse
import subprocess
import sys
from collections.abc import Sequence
from pathlib import Path

__all__ = ["FULL_PLUGINS", "RULES", "add_profile", "write_full_profile"]

#: The plugins the full profile turns on (the provider kind is always there).
FULL_PLUGINS = ("keys", "billing", "breaker", "regions", "rules", "metrics", "timeout-header")
RULES = 200
MODEL = "bench"


def add_profile(parser: argparse.ArgumentParser, full: str) -> None:
    """``--profile default|full``; ``full`` says what the full profile adds to that script."""
    parser.add_argument(
        "--profile", choices=("default", "full"), default="default", help=f"full: {full}"
    )


def _catalog(upstream_base: str, without: str | None) -> str:
    price = ", price = { input = 1.0, output = 2.0 }" if without != "billing" else ""
    out = [
        "[providers.upstream]",
        'kind = "openai"',
        f'base_url = "{upstream_base}"',
        'region = "eu-west-1"',
        "",
        f"[models.{MODEL}]",
        f'chain = [ {{ provider = "upstream", model = "{MODEL}"{price} }} ]',
    ]
    if without != "rules":
        for i in range(RULES):
            out += [
                f"[[models.{MODEL}.rules]]",
                f'name = "tenant-{i}"',
                f'when = {{ "metadata.tenant" = "t{i}" }}',
                f'chain = [ {{ provider = "upstream", model = "{MODEL}" }} ]',
            ]
    return "\n".join(out) + "\n"


def write_full_profile(
    directory: Path, port: int, upstream_base: str, *, without: str | None = None
) -> tuple[Path, str | None]:
    """The configuration (and the API key the load must send, None without keys)."""
    from run import installed_plugin_names

    directory.mkdir(parents=True, exist_ok=True)
    (directory / "catalog.toml").write_text(_catalog(upstream_base, without))
    keep = {"openai", *FULL_PLUGINS} - {without}
    disable = sorted(set(installed_plugin_names()) - keep)
    sections = {
        "keys": "[prism:keys]\ndb_path = keys.sqlite\n",
        "billing": "[prism:billing]\nledger_path = ledger.sqlite\nsynchronous = full\n",
        "regions": "[prism:regions]\ndefault = eu-west-1\n",
    }
    ini = directory / "prism.ini"
    ini.write_text(
        "[prism]\n"
        f"listen = 127.0.0.1:{port}\n"
        "catalog = catalog.toml\n"
        "log_level = WARNING\n"
        "shutdown_grace_s = 1\n"
        + (f"disable = {', '.join(disable)}\n" if disable else "")
        + "".join(text for name, text in sections.items() if name != without)
    )
    key = None
    if without != "keys":
        key = _create_key(ini)
    return ini, key


def _create_key(ini: Path, argv: Sequence[str] = ()) -> str:
    made = subprocess.run(
        [sys.executable, "-m", "prism_proxy.cli", "keys", "create", "--config", str(ini),
         "--org", "bench", "--scopes", "*", *argv],
        capture_output=True, text=True, check=True, timeout=60,
    )  # fmt: skip
    return made.stdout.strip().splitlines()[-1]
