"""Calendar periods in UTC: when the one holding a moment began and when it ends."""

from __future__ import annotations

import datetime

import attrs

from .limits import Period

__all__ = ["Window", "window"]

_UTC = datetime.UTC


@attrs.frozen
class Window:
    """One period: ``[start, end)`` in POSIX seconds (``end`` None: never, for ``total``)."""

    start: int
    end: int | None
    #: Part of the counter's name: the period's start, so a new period counts afresh.
    name: str = attrs.field(
        default=attrs.Factory(lambda self: str(self.start), takes_self=True), eq=False
    )

    def since(self) -> datetime.datetime | None:
        return None if self.end is None else datetime.datetime.fromtimestamp(self.start, _UTC)


def window(period: Period, now: float) -> Window:
    """The period of kind ``period`` holding ``now`` (POSIX seconds)."""
    if period is Period.TOTAL:
        return Window(0, None)
    moment = datetime.datetime.fromtimestamp(now, _UTC)
    if period is Period.HOUR:
        start = moment.replace(minute=0, second=0, microsecond=0)
        end = start + datetime.timedelta(hours=1)
    elif period is Period.DAY:
        start = moment.replace(hour=0, minute=0, second=0, microsecond=0)
        end = start + datetime.timedelta(days=1)
    elif period is Period.WEEK:
        day = moment.replace(hour=0, minute=0, second=0, microsecond=0)
        start = day - datetime.timedelta(days=day.weekday())
        end = start + datetime.timedelta(days=7)
    else:
        start = moment.replace(day=1, hour=0, minute=0, second=0, microsecond=0)
        end = (start + datetime.timedelta(days=32)).replace(day=1)
    return Window(int(start.timestamp()), int(end.timestamp()))
