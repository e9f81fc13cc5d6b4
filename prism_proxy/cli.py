"""The ``prism`` command: serve, check, plugins, demo."""

from __future__ import annotations

import argparse
import importlib.resources
import logging
import sys
import tempfile
from collections.abc import Sequence
from pathlib import Path

from .app import create_app
from .commands import Command, Commands
from .config import Config, config_from_mapping, load_config
from .errors import ConfigError
from .gateway import GATEWAY
from .plugins import describe_plugins, make_plugin_manager
from .server import Listening, run, serve

__all__ = ["main"]

DEMO_UPSTREAM_PORT = 18900


def main(argv: Sequence[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    try:
        return _main(argv)
    except ConfigError as exc:
        print(f"prism: configuration error: {exc}", file=sys.stderr)
        return 2


def _main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(prog="prism", description="Prism, a pluggable LLM gateway.")
    commands = Commands(parser.add_subparsers(dest="command", required=True, metavar="COMMAND"))
    commands.add("serve", "run the gateway", lambda args, config: _serve(config))
    commands.add(
        "check", "validate the configuration and the catalog, then exit", lambda a, c: _check(c)
    )
    commands.add(
        "plugins",
        "list loaded plugins, their versions and where each came from",
        _plugins,
        needs_config=False,
    )
    demo = commands.subparsers.add_parser(
        "demo", help="run a fake upstream and the gateway on the embedded demo configuration"
    )
    demo.add_argument("--listen", default=None, help="HOST:PORT for the gateway")
    # Plugins add their own commands; which plugins load depends on the config.
    config, config_error = _preload(argv)
    make_plugin_manager(config).hook.prism_cli(commands=commands)
    args = parser.parse_args(argv)
    if args.command == "demo":
        return _demo(args.listen)
    if config_error is not None and (args.needs_config or args.config):
        raise config_error
    run: Command = args.run
    return run(args, config)


def _preload(argv: list[str]) -> tuple[Config, ConfigError | None]:
    """The config named by ``--config`` (or found), or defaults and the error to report."""
    pre = argparse.ArgumentParser(add_help=False)
    pre.add_argument("--config")
    known, _ = pre.parse_known_args(argv)
    try:
        return load_config(known.config), None
    except ConfigError as exc:
        fallback = config_from_mapping({}, catalog_data={}, source="(no configuration found)")
        return fallback, exc


def _logging(config: Config) -> None:
    logging.basicConfig(
        level=config.log_level,
        format="%(asctime)s %(levelname)s %(name)s: %(message)s",
        stream=sys.stderr,
    )


def _serve(config: Config) -> int:
    _logging(config)
    app = create_app(config)
    run(serve(app, config))
    return 0


def _check(config: Config) -> int:
    app = create_app(config)
    gw = app[GATEWAY]
    plugins = ", ".join(sorted(name for name, _ in gw.pm.list_name_plugin()))
    print(f"{config.source}: ok")
    print(
        f"catalog {gw.catalog.source}: {len(gw.catalog.providers)} providers, "
        f"{len(gw.catalog.models)} models"
    )
    print(f"plugins: {plugins}")
    return 0


def _plugins(args: argparse.Namespace, config: Config) -> int:
    pm = make_plugin_manager(config)
    rows = [(i.name, i.distribution, i.version, i.location) for i in describe_plugins(pm)]
    header = ("plugin", "distribution", "version", "location")
    widths = [max(len(row[col]) for row in [header, *rows]) for col in range(3)]
    for row in [header, *rows]:
        print(
            "  ".join(cell.ljust(width) for cell, width in zip(row, widths, strict=False)), row[3]
        )
    for name in config.disable:
        print(f"{name}: disabled by [prism] disable in {config.source}")
    return 0


def _demo(listen: str | None) -> int:
    try:
        from prism_fake_upstream import FakeUpstream
    except ImportError:
        print(
            "prism demo needs the fake upstream: pip install -e contrib/fake-upstream",
            file=sys.stderr,
        )
        return 2
    # The embedded files are copied to a scratch directory: plugins that keep
    # state next to the config (breaker, ledger) must not write into the package.
    with tempfile.TemporaryDirectory(prefix="prism-demo-") as scratch:
        directory = Path(scratch)
        for name in ("prism.ini", "catalog.toml"):
            source = importlib.resources.files("prism_proxy") / "demo" / name
            (directory / name).write_text(source.read_text(encoding="utf-8"), encoding="utf-8")
        config = load_config(directory / "prism.ini")
        if listen:
            config = config_from_mapping(
                {"listen": listen, "catalog": "catalog.toml"},
                source=config.source,
                base_dir=directory,
            )
        _logging(config)
        fake = FakeUpstream()

        async def main() -> None:
            await fake.start(host="127.0.0.1", port=DEMO_UPSTREAM_PORT)
            try:
                await serve(create_app(config), config, started=_demo_banner)
            finally:
                await fake.stop()

        run(main())
    return 0


async def _demo_banner(listening: Listening) -> None:
    print(
        f"\nPrism demo on {listening.url} (fake upstream on 127.0.0.1:{DEMO_UPSTREAM_PORT}).\n"
        f"Try:\n  curl -s {listening.url}/v1/chat/completions -H 'content-type: application/json' "
        '-d \'{"model": "chat-a", "messages": [{"role": "user", "content": "hi"}]}\' -i\n'
        "Press Ctrl-C to stop.\n",
        flush=True,
    )


if __name__ == "__main__":
    raise SystemExit(main())
