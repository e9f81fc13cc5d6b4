"""``[prism:limits]``: the limits of callers without an organisation, and how the fleet counts."""

from __future__ import annotations

import urllib.parse
from collections.abc import Callable, Mapping
from typing import Any, Literal

import attrs

from prism_proxy import Config, Section, read_settings, setting

from .limits import (
    BUDGET,
    BUDGET_MODE,
    MAX_PARALLEL,
    RPM,
    TPM,
    parse_budget,
    parse_count,
    parse_mode,
)

__all__ = ["SECTION", "LimitsSettings"]

SECTION = "limits"


def _parsed(parse: Callable[[str], Any]) -> Callable[[Section, str, Any], Any]:
    def read(section: Section, key: str, default: Any) -> Any:
        raw = section.values.get(key)
        if isinstance(raw, bool) or not isinstance(raw, str | int | float):
            if raw is None:
                return default
            raise section.error(key, f"expected text or a number, got {raw!r}")
        if not str(raw).strip():
            return default
        try:
            return parse(str(raw))
        except ValueError as exc:
            raise section.error(key, str(exc)) from None

    return read


def _loss(section: Section, key: str, default: str) -> str:
    value = (section.get_str(key, default) or default).strip().lower()
    if value not in ("share", "open", "closed"):
        raise section.error(key, f"expected share, open or closed, got {value[:32]!r}")
    return value


def _alert_url(section: Section, key: str, default: str | None) -> str | None:
    url = section.get_str(key, default) or None
    if url is None:
        return None
    try:
        parts = urllib.parse.urlsplit(url)
        usable = parts.scheme in ("http", "https") and bool(parts.hostname)
        usable = usable and parts.port != 0  # reading the port raises on a bad one
    except ValueError:
        usable = False
    if not usable:
        # Not echoed: a webhook's URL may carry its credentials.
        raise section.error(key, "expected an http:// or https:// URL with a host")
    return url


def _thresholds(section: Section, key: str, default: tuple[int, ...]) -> tuple[int, ...]:
    raw = section.values.get(key)
    if raw is None:
        return default
    items = raw if isinstance(raw, list | tuple) else str(raw).split(",")
    found: set[int] = set()
    for item in items:
        text = str(item).strip().removesuffix("%").strip()
        try:
            value = int(text)
        except ValueError:
            raise section.error(
                key, f"expected whole percentages such as 50, 80, 100, got {text[:32]!r}"
            ) from None
        if not 1 <= value <= 1000:
            raise section.error(key, f"expected percentages from 1 to 1000, got {value}")
        found.add(value)
    if not found:
        raise section.error(key, "expected at least one percentage, such as 50, 80, 100")
    return tuple(sorted(found))


@attrs.frozen
class LimitsSettings:
    """The section's keys; the limit keys apply to callers without an organisation."""

    rpm: int | None = setting(
        None,
        help="requests in any 60 seconds, per caller without an organisation (each key on "
        "its own, anonymous callers together)",
        parse=_parsed(parse_count),
        type_text="whole number",
    )
    tpm: int | None = setting(
        None,
        help="tokens in any 60 seconds, per caller without an organisation",
        parse=_parsed(parse_count),
        type_text="whole number",
    )
    max_parallel: int | None = setting(
        None,
        help="calls in flight at once, per caller without an organisation",
        parse=_parsed(parse_count),
        type_text="whole number",
    )
    budget: Any = setting(
        None,
        help="spend per period per caller without an organisation: `5/day` (hour, day, week, "
        "month, total; calendar periods in UTC), in the catalog's currency",
        parse=_parsed(parse_budget),
        type_text="AMOUNT/PERIOD",
    )
    budget_mode: bool = setting(
        False,
        help="`hard`: a spent budget refuses calls; `soft`: serve and alert",
        parse=_parsed(parse_mode),
        default_text="hard",
        type_text="`hard` or `soft`",
    )
    on_shared_state_loss: Literal["share", "open", "closed"] = setting(
        "share",
        help="with prism-redis, what a gateway does while Redis does not answer: `share` "
        "counts locally at its share of each limit (the limit divided by the gateways it "
        "last saw; a fleet that lost a gateway meanwhile serves a little less than it "
        "could), `open` serves without limits (nothing refused, spend may overshoot), "
        "`closed` refuses limited calls (503 `limits_unavailable`; nothing overshoots)",
        parse=_loss,
        type_text="`share`, `open` or `closed`",
    )
    lease_s: float = setting(
        30.0,
        min=5.0,
        max=3600.0,
        help="how long a call's in-flight slot and budget reservation last in shared state "
        "without renewal: a gateway renews its calls' every third of it, so a dead "
        "gateway's come back after at most this",
    )

    alert_url: str | None = setting(
        None,
        help="where each budget alert is POSTed as JSON (`http://` or `https://`; see *Alerts*); "
        "unset: alerts are WARNING log lines and `prism_budget_used_ratio` only",
        parse=_alert_url,
        type_text="`http://` or `https://` URL",
    )
    alert_thresholds: tuple[int, ...] = setting(
        (50, 80, 100),
        help="the percentages of a budget whose crossing alerts (once each per budget and "
        "period, fleet-wide)",
        parse=_thresholds,
        default_text="`50, 80, 100`",
        type_text="list of percentages, 1 to 1000",
    )

    @classmethod
    def from_config(cls, config: Config) -> LimitsSettings:
        return read_settings(cls, config.section(SECTION))

    def defaults(self) -> Mapping[str, Any]:
        """The limits of callers without an organisation, as organisation settings are."""
        found: dict[str, Any] = {
            name: value
            for name, value in (
                (RPM, self.rpm),
                (TPM, self.tpm),
                (MAX_PARALLEL, self.max_parallel),
                (BUDGET, self.budget),
            )
            if value is not None
        }
        if found:
            found[BUDGET_MODE] = self.budget_mode
        return found
