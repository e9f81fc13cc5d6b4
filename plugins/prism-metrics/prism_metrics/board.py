"""``GET /prism/board``: the page an on-call engineer opens first, and its live feed.

The page is one HTML file with its script and style inline (nothing fetched
from elsewhere, no build step).  It opens ``/prism/board/events`` with
``EventSource``; the server sends the whole board as one ``board`` event when
the stream opens and again whenever it changes (looked at every
:data:`LOOK_S`), so a transition shows within a second and the page never
polls or reloads.  The board shows what ``/prism/health`` shows; override
owners and reasons only to the admin (the token in ``Authorization``, or in
the ``prism_board_token`` cookie the page sets, since ``EventSource`` cannot
send headers).
"""

from __future__ import annotations

import asyncio
import datetime
import importlib.resources
import math
from typing import Any

import orjson
from aiohttp import web
from aiohttp_sse import sse_response

from prism_proxy import BREAKER, GATEWAY, TELEMETRY, BreakerView, Generation, is_admin

from .exporter import Exporter

__all__ = ["BUDGET_SHOWN", "COOKIE", "LOOK_S", "add_board_routes", "board_snapshot"]

#: How often an open feed looks for a change.
LOOK_S = 0.25
#: The cookie the page keeps the admin token in (read-only use: the board).
COOKIE = "prism_board_token"
NO_REGION = "no region"
#: Organisations whose most used budget is at least this share spent get a banner.
BUDGET_SHOWN = 0.8
#: Banners naming organisations, at most (the rest are counted in one more).
BUDGET_BANNERS = 10


def add_board_routes(app: web.Application) -> None:
    app.router.add_get("/prism/board", page)
    app.router.add_get("/prism/board/events", events)
    app.router.add_get("/prism/board.json", snapshot)


async def page(request: web.Request) -> web.Response:
    html = importlib.resources.files("prism_metrics").joinpath("board.html").read_text()
    return web.Response(
        text=html,
        content_type="text/html",
        headers={
            # Everything is inline; nothing may come from anywhere else.
            "Content-Security-Policy": "default-src 'none'; script-src 'unsafe-inline'; "
            "style-src 'unsafe-inline'; connect-src 'self'; img-src 'self' data:",
            "Cache-Control": "no-store",
        },
    )


async def snapshot(request: web.Request) -> web.Response:
    board = board_snapshot(request.app[GATEWAY].current, with_text=_admin(request))
    return web.Response(body=orjson.dumps(board), content_type="application/json")


async def events(request: web.Request) -> web.StreamResponse:
    with_text = _admin(request)
    gateway = request.app[GATEWAY]
    async with sse_response(request, headers={"Cache-Control": "no-store"}) as stream:
        last = b""
        while stream.is_connected():
            board = orjson.dumps(board_snapshot(gateway.current, with_text=with_text))
            if board != last:
                await stream.send(board.decode(), event="board")
                last = board
            await asyncio.sleep(LOOK_S)
    return stream


def _admin(request: web.Request) -> bool:
    return is_admin(request, cookie=COOKIE)


def board_snapshot(generation: Generation, *, with_text: bool) -> dict[str, Any]:
    """Tiles grouped by region, then model; banners; no wall clock (it changes nothing)."""
    breaker: BreakerView | None = generation.services.get(BREAKER)
    health = breaker.health(with_text=with_text) if breaker is not None else None
    entries = {e["binding"]: e for e in health["bindings"]} if health else {}
    catalog = generation.catalog
    regions: dict[str, dict[str, list[dict[str, Any]]]] = {}
    for model in catalog.models.values():
        for binding in model.chain:
            region = binding.region or NO_REGION
            tile = _tile(binding.id, entries.get(binding.id), breaker is not None)
            regions.setdefault(region, {}).setdefault(model.name, []).append(tile)
    banners: list[dict[str, str]] = []
    if health:
        overrides = {o["id"]: o for o in health["overrides"]}
        for override_id in health["overdue_reviews"]:
            o = overrides.get(override_id, {"kind": "override", "target": "?"})
            banners.append(
                {
                    "kind": "overdue",
                    "text": f"{o['kind']} {override_id} on {o['target']} is past its review time",
                }
            )
        for override_id in health["reviews_due_soon"]:
            o = overrides.get(override_id, {"kind": "override", "target": "?", "review_by": "?"})
            banners.append(
                {
                    "kind": "review",
                    "text": f"{o['kind']} {override_id} on {o['target']} is due for review "
                    f"by {o['review_by']}",
                }
            )
        probes = health.get("probes") or {}
        if probes.get("paused_until"):
            banners.append(
                {
                    "kind": "probes",
                    "text": f"probes paused: the hourly allowance is spent until "
                    f"{probes['paused_until']}",
                }
            )
    capacity = generation.plugin("metrics.capacity")
    if capacity is not None:
        banners.extend(capacity.banners())
    exporter = generation.services.get(TELEMETRY)
    if isinstance(exporter, Exporter):
        banners.extend(_budget_banners(exporter, named=with_text or exporter.org_label))
    return {
        "breaker": breaker is not None,
        "banners": banners,
        "regions": [
            {
                "region": region,
                "models": [
                    {"model": name, "tiles": tiles} for name, tiles in sorted(models.items())
                ],
            }
            for region, models in sorted(
                regions.items(), key=lambda kv: (kv[0] == NO_REGION, kv[0])
            )
        ],
    }


def _budget_banners(exporter: Exporter, *, named: bool) -> list[dict[str, str]]:
    """Organisations at or above 80 % of a budget, most spent first, from the levels
    ``prism_budget_used_ratio`` last had in this process.  Names only where the metrics
    may carry them (``org_label``) or for the admin: the board is as public as /metrics."""
    above = sorted(
        (
            (ratio, org)
            for org, ratio in exporter.by_org("prism_budget_used_ratio").items()
            if ratio >= BUDGET_SHOWN
        ),
        key=lambda found: (-found[0], found[1]),
    )
    if not above:
        return []
    if not named:
        count = len(above)
        return [
            {
                "kind": "budget",
                "text": f"budget: {count} organisation{'s' if count > 1 else ''} at or above "
                f"{BUDGET_SHOWN:.0%} of a budget (names with org_label, or for the admin)",
            }
        ]
    banners = [
        {
            "kind": "budget",
            "text": f"budget: {org} has used {math.floor(ratio * 100)}% of a budget",
        }
        for ratio, org in above[:BUDGET_BANNERS]
    ]
    if len(above) > BUDGET_BANNERS:
        banners.append(
            {
                "kind": "budget",
                "text": f"budget: {len(above) - BUDGET_BANNERS} more organisations at or "
                f"above {BUDGET_SHOWN:.0%} of a budget",
            }
        )
    return banners


def _tile(binding_id: str, entry: dict[str, Any] | None, breaker_on: bool) -> dict[str, Any]:
    if entry is None:
        return {
            "binding": binding_id,
            "colour": "grey",
            "state": "unknown",
            "label": "breaker off" if not breaker_on else "no state yet",
        }
    state = entry["state"]
    quarantine = [o for o in entry["overrides"] if o["kind"] == "quarantine"]
    if quarantine or state == "isolated":
        colour = "red"
    elif state in ("suspect", "trial"):
        colour = "yellow"
    elif entry["assessment"] == "healthy":
        colour = "green"
    else:
        colour = "grey"  # eligible, too little traffic to say
    latency = _latency(entry["first_byte_ms"])
    tile: dict[str, Any] = {
        "binding": binding_id,
        "colour": colour,
        "state": "quarantined" if quarantine else state,
        "assessment": entry["assessment"],
        "cause": entry["cause"],
        "error_rate": entry["window"]["error_rate"],
        "calls": entry["window"]["calls"],
        "window_s": entry["window"]["seconds"],
        "ttft_p50_ms": latency[0],
        "ttft_p95_ms": latency[1],
        "in_flight": entry["in_flight"],
        "overrides": entry["overrides"],
    }
    if state == "isolated" and entry["isolated_until"]:
        tile["until"] = entry["isolated_until"]
        until = datetime.datetime.fromisoformat(entry["isolated_until"].replace("Z", "+00:00"))
        left = (until - datetime.datetime.now(datetime.UTC)).total_seconds()
        tile["left_s"] = max(0, round(left))
    if "trial" in entry:
        tile["trial"] = entry["trial"]
    if "ramp" in entry:
        tile["ramp"] = entry["ramp"]
    if "probe" in entry:
        tile["probe"] = entry["probe"]
    return tile


def _latency(first_byte: dict[str, dict[str, Any]]) -> tuple[float | None, float | None]:
    """p50 and p95 of streamed first tokens, else of whole bodies (whichever has samples)."""
    for kind in ("stream", "body"):
        track = first_byte.get(kind) or {}
        if track.get("samples"):
            return track.get("p50"), track.get("p95")
    return None, None
