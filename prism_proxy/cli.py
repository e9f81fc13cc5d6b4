"""The ``prism`` command: serve, check, plugins, demo."""

from __future__ import annotations

import argparse
import asyncio
import importlib.metadata
import importlib.resources
import logging
import socket
import sys
import tempfile
from collections.abc import Sequence
from pathlib import Path

from .app import create_app
from .commands import Command, Commands, run_checks
from .config import (
    Config,
    Listen,
    admin_token_unset,
    config_from_mapping,
    listen_address,
    load_config,
    worker_count,
)
from .distribution import DISTRIBUTION
from .errors import ConfigError
from .gateway import GATEWAY
from .logs import configure_logging
from .plugins import describe_plugins, described_sections, make_plugin_manager
from .scaffold import add_scaffold_command
from .server import LISTEN_SOCKETS, CannotListen, Listening, bind, close_sockets, run, serve
from .settings import settings_table
from .workers import Supervisor

__all__ = ["main"]

log = logging.getLogger("prism")

#: The fake upstream's port in the demo catalog (``prism demo --upstream-port`` moves it).
DEMO_UPSTREAM_PORT = 18900


def main(argv: Sequence[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    try:
        return _main(argv)
    except ConfigError as exc:
        print(f"prism: configuration error: {exc}", file=sys.stderr)
        return 2
    except CannotListen as exc:
        print(f"prism: {exc}", file=sys.stderr)
        return 1


def _version() -> str:
    try:
        return importlib.metadata.version(DISTRIBUTION)
    except importlib.metadata.PackageNotFoundError:
        return "unknown (not installed)"


def _listen_arg(value: str) -> Listen:
    """``--listen HOST:PORT``, checked like ``[prism] listen``."""
    try:
        return listen_address(value)
    except ValueError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None


def _port_arg(value: str) -> int:
    try:
        port = int(value)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a port number, got {value!r}") from None
    if not 1 <= port <= 65535:
        raise argparse.ArgumentTypeError(f"port out of range (1-65535): {port}")
    return port


def _main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(prog="prism", description="Prism, a pluggable LLM gateway.")
    parser.add_argument("--version", action="version", version=f"prism {_version()}")
    commands = Commands(parser.add_subparsers(dest="command", required=True, metavar="COMMAND"))
    serve_parser = commands.add("serve", "run the gateway", _serve)
    serve_parser.add_argument(
        "--listen",
        type=_listen_arg,
        metavar="HOST:PORT",
        help="listen here instead of [prism] listen",
    )
    serve_parser.add_argument(
        "--workers",
        metavar="N",
        help="run N gateway processes on the port (auto: one per CPU); [prism] workers",
    )
    # A worker of `--workers`: the listening sockets it inherits from its supervisor.
    serve_parser.add_argument("--worker-fds", help=argparse.SUPPRESS)
    check = commands.add(
        "check",
        "validate the configuration and the catalog, and reach the databases and services "
        "it names (read-only), then exit",
        _check,
    )
    check.add_argument(
        "--offline", action="store_true", help="validate only: contact no database or service"
    )
    commands.add(
        "plugins",
        "list loaded plugins, their versions and where each came from",
        _plugins,
        needs_config=False,
    )
    settings = commands.add(
        "settings",
        "print every loaded plugin's settings (keys, types, defaults, meaning) as Markdown",
        _settings,
        needs_config=False,
    )
    settings.add_argument("section", nargs="?", help="only this section (prism, prism:breaker)")
    add_scaffold_command(commands)
    demo = commands.subparsers.add_parser(
        "demo", help="run a fake upstream and the gateway on the embedded demo configuration"
    )
    demo.add_argument(
        "--listen",
        type=_listen_arg,
        metavar="HOST:PORT",
        help="for the gateway (default: 127.0.0.1:8400)",
    )
    demo.add_argument(
        "--upstream-port",
        type=_port_arg,
        default=DEMO_UPSTREAM_PORT,
        metavar="PORT",
        help=f"the fake upstream's port on 127.0.0.1 (default: {DEMO_UPSTREAM_PORT})",
    )
    # Plugins add their own commands; which plugins load depends on the config.
    config, config_error = _preload(argv)
    make_plugin_manager(config).hook.prism_cli(commands=commands)
    if not argv:
        parser.print_help()
        return 0
    args = parser.parse_args(argv)
    if args.command == "demo":
        return _demo(args.listen, args.upstream_port)
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
    configure_logging(config.log_level, config.log_format)


def _serve(args: argparse.Namespace, config: Config) -> int:
    if args.listen is not None:
        config.listen = args.listen
    if args.workers is not None:
        try:
            config.workers = worker_count(args.workers)
        except ValueError as exc:
            print(f"prism serve: --workers: {exc}", file=sys.stderr)
            return 2
    _logging(config)
    if args.worker_fds:
        sockets = [socket.socket(fileno=int(fd)) for fd in args.worker_fds.split(",")]
    else:
        # The port first: a busy one stops here, before any plugin opens a file or a pool.
        sockets = bind(config.listen.host, config.listen.port, backlog=config.backlog)
        if config.workers > 1:
            return _supervise(args, config, sockets)
    try:
        warning = admin_token_unset(config)
        if warning is not None:
            log.warning("%s", warning)
        app = create_app(config)
        app[LISTEN_SOCKETS] = sockets
    except BaseException:
        close_sockets(sockets)
        raise
    run(serve(app, config))
    return 0


def _supervise(args: argparse.Namespace, config: Config, sockets: list[socket.socket]) -> int:
    """Start ``config.workers`` workers on ``sockets``, once every plugin says it is sound."""
    try:
        generation = create_app(config)[GATEWAY].current
        refusals = [
            reason
            for reason in generation.pm.hook.prism_workers(
                generation=generation, count=config.workers
            )
            if reason
        ]
        if refusals:
            raise ConfigError(config.source, "[prism] workers", "; ".join(refusals))
        listen = f"{config.listen.host}:{config.listen.port}" if args.listen else None
        supervisor = Supervisor(config, config.workers, sockets, listen=listen)
        status = 0

        async def main() -> None:
            nonlocal status
            status = await supervisor.run()

        run(main())
        return status
    finally:
        close_sockets(sockets)


def _check(args: argparse.Namespace, config: Config) -> int:
    app = create_app(config)
    generation = app[GATEWAY].current
    catalog = generation.catalog
    plugins = ", ".join(generation.loaded())
    print(f"{config.source}: ok")
    print(
        f"catalog {catalog.source}: {len(catalog.providers)} providers, "
        f"{len(catalog.models)} models"
    )
    print(f"plugins: {plugins}")
    print(
        "services: "
        + ", ".join(f"{service.name}: {who}" for service, who in generation.services.listing())
    )
    for name in sorted(config.disable):
        print(f"{name}: disabled by [prism] disable in {config.source}")
    # What the plugins depend on (their databases, Redis): a valid file that names
    # a database nobody can reach is not a configuration that works.
    lines = asyncio.run(run_checks(generation, offline=args.offline))
    for line in sorted(lines, key=lambda line: line.subject):
        print(f"{line.subject}: {line.text}")
    failed = sorted({line.subject for line in lines if not line.ok})
    if failed:
        print(
            f"prism check: the configuration is valid, but not ready: {', '.join(failed)}",
            file=sys.stderr,
        )
        return 1
    return 0


def _settings(args: argparse.Namespace, config: Config) -> int:
    sections = described_sections(config, make_plugin_manager(config))
    wanted = args.section
    if wanted is not None and wanted not in sections:
        print(
            f"prism settings: no loaded plugin describes [{wanted}] "
            f"(described: {', '.join(sections)})",
            file=sys.stderr,
        )
        return 2
    for name, schema in sections.items():
        if wanted in (None, name):
            print(f"## [{name}]\n\n{settings_table(schema)}\n")
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


def _demo(listen: Listen | None, upstream_port: int) -> int:
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
            text = source.read_text(encoding="utf-8")
            if name == "catalog.toml":
                # The catalog's base_url lines name the fake upstream's port.
                text = text.replace(
                    f"127.0.0.1:{DEMO_UPSTREAM_PORT}/", f"127.0.0.1:{upstream_port}/"
                )
            (directory / name).write_text(text, encoding="utf-8")
        config = load_config(directory / "prism.ini")
        if listen is not None:
            config.listen = listen
        _logging(config)
        fake = FakeUpstream()

        async def banner(listening: Listening) -> None:
            await _demo_banner(listening, upstream_port)

        async def main() -> None:
            try:
                await fake.start(host="127.0.0.1", port=upstream_port)
            except OSError as exc:
                raise CannotListen.from_error("127.0.0.1", upstream_port, exc) from None
            try:
                await serve(create_app(config), config, started=banner)
            finally:
                await fake.stop()

        run(main())
    return 0


async def _demo_banner(listening: Listening, upstream_port: int) -> None:
    print(
        f"\nPrism demo on {listening.url} (fake upstream on 127.0.0.1:{upstream_port}).\n"
        f"Try:\n  curl -s {listening.url}/v1/chat/completions -H 'content-type: application/json' "
        '-d \'{"model": "chat-a", "messages": [{"role": "user", "content": "hi"}]}\' -i\n'
        "Press Ctrl-C to stop.\n",
        flush=True,
    )


if __name__ == "__main__":
    raise SystemExit(main())
