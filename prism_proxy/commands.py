"""The registry plugins add ``prism`` subcommands to (hook ``prism_cli``)."""

from __future__ import annotations

import argparse
from collections.abc import Callable

import attrs

from .config import Config

__all__ = ["Command", "Commands"]

Command = Callable[[argparse.Namespace, Config], int]


@attrs.define(eq=False)
class Commands:
    """Wraps the ``prism`` subparsers; each added command gets ``--config``."""

    subparsers: argparse._SubParsersAction[argparse.ArgumentParser]

    def add(
        self, name: str, help: str, run: Command, *, needs_config: bool = True
    ) -> argparse.ArgumentParser:
        """Add ``prism <name>``; ``run(args, config)`` returns the exit status.

        With ``needs_config=False`` the command also runs where no
        configuration is found (``config`` then holds the defaults).
        """
        parser = self.subparsers.add_parser(name, help=help, description=help)
        parser.add_argument(
            "--config", metavar="PATH", help="config file (default: search upwards)"
        )
        parser.set_defaults(run=run, needs_config=needs_config)
        return parser
