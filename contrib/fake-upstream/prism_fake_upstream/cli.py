"""``prism-fake-upstream``: run the fake as a standalone process."""

from __future__ import annotations

import argparse
import asyncio
import importlib
from collections.abc import Sequence

from aiohttp import web

from .recording import MAX_RECORDED
from .server import FakeUpstream

__all__ = ["main"]


def _new_loop() -> asyncio.AbstractEventLoop:
    # uvloop roughly halves the fake's per-request CPU in benchmarks; it is
    # optional (not a dependency), so it is looked up rather than imported.
    try:
        uvloop = importlib.import_module("uvloop")
    except ImportError:
        return asyncio.new_event_loop()
    loop: asyncio.AbstractEventLoop = uvloop.new_event_loop()
    return loop


def main(argv: Sequence[str] | None = None) -> None:
    parser = argparse.ArgumentParser(
        prog="prism-fake-upstream",
        description="Fake OpenAI- and Anthropic-compatible provider; base URLs are "
        "http://HOST:PORT/s/{scenario}/v1 for OpenAI clients and "
        "http://HOST:PORT/s/{scenario} for Anthropic clients (scenarios: ok, errNNN, "
        "stall, slowfirst, dieK, empty, slow, trickle, or any other name for a healthy one).",
    )
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--port", type=int, default=18900)
    parser.add_argument(
        "--backlog",
        type=int,
        default=128,
        help="connections the kernel queues before they are accepted (128; "
        "more for thousands of clients connecting at once)",
    )
    parser.add_argument(
        "--max-recorded",
        type=int,
        default=MAX_RECORDED,
        metavar="N",
        help=f"requests kept per scenario for inspection ({MAX_RECORDED}; counters count "
        "every request). A benchmark passes 0: kept requests make the collector's pauses "
        "long, and such a pause stalls every call in flight through the proxy under test",
    )
    args = parser.parse_args(argv)
    if args.max_recorded < 0:
        parser.error("--max-recorded must be 0 or more")
    web.run_app(
        FakeUpstream(max_recorded=args.max_recorded).app,
        host=args.host,
        port=args.port,
        backlog=args.backlog,
        # Per-request logging would dominate the cost of the cheap ok path.
        access_log=None,
        handler_cancellation=True,
        shutdown_timeout=1.0,
        loop=_new_loop(),
    )


if __name__ == "__main__":
    main()
