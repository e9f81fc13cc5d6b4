"""The registry plugins add ``prism`` subcommands to (hook ``prism_cli``), and the lines
plugins add to ``prism check`` (hook ``prism_check``)."""

from __future__ import annotations

import argparse
import asyncio
import inspect
import urllib.parse
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

import attrs

from .config import Config

if TYPE_CHECKING:
    from .generation import Generation

__all__ = ["CHECK_TIMEOUT_S", "CheckLine", "Command", "Commands", "run_checks"]

Command = Callable[[argparse.Namespace, Config], int]

#: The longest one plugin's ``prism_check`` may take before it is reported as failed.
CHECK_TIMEOUT_S = 30.0
#: How much of an error's message a check line quotes.
_QUOTE = 200


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


@attrs.frozen
class CheckLine:
    """One line of ``prism check``: ``<subject>: <text>``.

    ``subject`` is what an operator asks about (``billing``, ``keys``,
    ``shared state``); ``text`` says whether it is on, where, and what was
    found.  ``ok=False`` makes ``prism check`` exit 1.
    """

    subject: str
    text: str
    ok: bool = True

    @classmethod
    def unreachable(cls, subject: str, what: str, exc: BaseException, url: str) -> CheckLine:
        """``what`` (``on, ledger postgresql://…``) did not answer: a failed line naming
        the error, ``url``'s password never shown wherever the error quoted it."""
        message = str(exc)
        for secret in _secrets(url):
            message = message.replace(secret, "***")
        reason = f"{type(exc).__name__}: {message}" if message else type(exc).__name__
        return cls(subject, f"{what}: NOT REACHABLE ({reason[:_QUOTE]})", ok=False)


def _secrets(url: str) -> list[str]:
    """The passwords in ``url`` (user info, ``?password=``), as written and decoded."""
    try:
        parts = urllib.parse.urlsplit(url)
        found = [parts.password or "", *urllib.parse.parse_qs(parts.query).get("password", ())]
    except ValueError:
        return []
    secrets = {secret for raw in found if raw for secret in (raw, urllib.parse.unquote(raw))}
    return sorted(secrets, key=len, reverse=True)


async def run_checks(
    generation: Generation, *, offline: bool, timeout_s: float | None = None
) -> list[CheckLine]:
    """Every plugin's ``prism_check`` lines, the checks run side by side.

    Each implementation is asked on its own, so that one that raises, overruns
    ``timeout_s`` (default :data:`CHECK_TIMEOUT_S`) or answers something other
    than lines is reported as a failed line naming its plugin (its error's
    type only: the message might carry a secret), and the others still report.
    """
    limit = CHECK_TIMEOUT_S if timeout_s is None else timeout_s
    arguments: dict[str, Any] = {"generation": generation, "offline": offline}

    async def one(impl: Any) -> list[CheckLine]:
        name = impl.plugin_name
        try:
            answer = impl.function(*(arguments[arg] for arg in impl.argnames))
            if inspect.isawaitable(answer):
                answer = await asyncio.wait_for(answer, limit)
            lines = list(answer or ())
        except TimeoutError:
            return [CheckLine(name, f"its check did not finish within {limit:g} s", False)]
        except Exception as exc:
            return [CheckLine(name, f"its check failed ({type(exc).__name__})", False)]
        if not all(isinstance(line, CheckLine) for line in lines):
            return [CheckLine(name, "its check answered something other than CheckLines", False)]
        return lines

    impls = [
        impl
        for impl in generation.pm.hook.prism_check.get_hookimpls()
        if not (impl.hookwrapper or impl.wrapper)
    ]
    answers = await asyncio.gather(*(one(impl) for impl in impls))
    return [line for answer in answers for line in answer]
