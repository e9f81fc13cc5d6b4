"""Capacity peaks across gateways, through prism-redis when it is configured.

Every gateway writes its minute peaks per line into ``<prefix>:capacity:peaks:<line>``
(field ``<gateway>|<minute>``) and reads the others' back; a line's fleet peak in
a minute is the sum of the gateways' peaks in it (an upper bound: their peaks
need not have been at the same instant).
"""

from __future__ import annotations

from collections import defaultdict

from prism_proxy import SharedState

from .capacity import CapacityRule, minutes_in

__all__ = ["exchange_peaks"]


async def exchange_peaks(shared: SharedState, rule: CapacityRule) -> None:
    if not shared.healthy:
        rule.peaks.others.clear()  # local-only until Redis answers again
        return
    peaks = rule.peaks
    first = peaks.minute() - minutes_in(rule.window_s) + 1
    lines = [b.id for b in rule.catalog.bindings.values() if "max_concurrency" in b.options]
    keys = {line: f"{shared.prefix}:capacity:peaks:{line}" for line in lines}
    ttl = int(rule.window_s) + 120
    with shared.guard("capacity_peaks"):
        async with shared.connect().pipeline(transaction=False) as pipe:
            for line in lines:
                own = peaks.lines.get(line)
                mine = {
                    f"{shared.me}|{m}": v
                    for m, v in (own.minutes if own else {}).items()
                    if m >= first
                }
                if mine:
                    pipe.hset(keys[line], mapping=mine)
                    pipe.expire(keys[line], ttl)
            for line in lines:
                pipe.hgetall(keys[line])
            replies = await pipe.execute()
    stored = replies[-len(lines) :] if lines else []
    others: dict[str, dict[int, int]] = {}
    for line, fields in zip(lines, stored, strict=True):
        sums: dict[int, int] = defaultdict(int)
        for field, count in fields.items():
            who, _, minute = field.rpartition("|")
            if who != shared.me and minute.isdigit() and int(minute) >= first:
                sums[int(minute)] += int(count)
        others[line] = dict(sums)
    peaks.others = others
