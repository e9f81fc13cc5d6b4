"""The floor for "a Python aiohttp proxy doing nothing": forward and stream back.

POST /v1/chat/completions is forwarded to ``UPSTREAM/chat/completions`` with
one pooled ClientSession, and the upstream body is streamed back chunk by
chunk through a StreamResponse.  No parsing, no routing, no retries.
GET /healthz answers 200 for readiness polling.  Runs on uvloop, one process,
no access log, and with the garbage collector tuned as ``prism serve`` tunes it
(start-up heap frozen, young-generation threshold raised) -- the same serving
setup, so the comparison measures the proxying, not the process settings.

    python contrib/bench/bare_proxy.py --port 18950 --upstream http://127.0.0.1:18900/s/ok/v1
"""

from __future__ import annotations

import argparse
import asyncio
import gc
from collections.abc import AsyncIterator, Sequence

import aiohttp
import uvloop
from aiohttp import web

SESSION = web.AppKey("session", aiohttp.ClientSession)
UPSTREAM = web.AppKey("upstream", str)


async def chat_completions(request: web.Request) -> web.StreamResponse:
    body = await request.read()
    session = request.app[SESSION]
    url = request.app[UPSTREAM] + "/chat/completions"
    headers = {"Content-Type": request.headers.get("Content-Type", "application/json")}
    async with session.post(url, data=body, headers=headers) as upstream:
        response = web.StreamResponse(status=upstream.status)
        content_type = upstream.headers.get("Content-Type")
        if content_type is not None:
            response.headers["Content-Type"] = content_type
        try:
            await response.prepare(request)
            async for chunk in upstream.content.iter_any():
                await response.write(chunk)
            await response.write_eof()
        except ConnectionResetError:
            pass  # the client hung up (wrk stops mid-request at the end of a run)
        return response


async def settle_heap(app: web.Application) -> None:
    """What ``prism serve`` does once it is listening (prism_proxy.server)."""
    gc.collect()
    gc.freeze()
    _, middle, old = gc.get_threshold()
    gc.set_threshold(10_000, middle, old)


async def healthz(request: web.Request) -> web.Response:
    return web.json_response({"status": "alive"})


def make_app(upstream: str) -> web.Application:
    app = web.Application()
    app[UPSTREAM] = upstream.rstrip("/")

    async def session_ctx(app: web.Application) -> AsyncIterator[None]:
        connector = aiohttp.TCPConnector(limit=0, keepalive_timeout=60)
        async with aiohttp.ClientSession(connector=connector, auto_decompress=False) as session:
            app[SESSION] = session
            yield

    app.cleanup_ctx.append(session_ctx)
    app.on_startup.append(settle_heap)
    app.router.add_post("/v1/chat/completions", chat_completions)
    app.router.add_get("/healthz", healthz)
    return app


def main(argv: Sequence[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--port", type=int, required=True)
    parser.add_argument("--upstream", required=True, help="base URL ending in /v1")
    args = parser.parse_args(argv)
    loop: asyncio.AbstractEventLoop = uvloop.new_event_loop()
    web.run_app(
        make_app(args.upstream),
        host=args.host,
        port=args.port,
        access_log=None,
        handler_cancellation=True,
        shutdown_timeout=1.0,
        backlog=1024,  # as prism serve: a burst of new connections waits alike
        print=None,
        loop=loop,
    )


if __name__ == "__main__":
    main()
