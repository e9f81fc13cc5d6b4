"""The prism_proxy entry point ``regions``: calls are served only from the regions they allow.

Who may be served from where, per call (:meth:`RegionPolicy.allowed`):

- a caller with an organisation: the organisation's ``regions`` setting
  (absent or empty: unrestricted);
- a caller without one: ``[prism:regions] default`` (absent or empty:
  unrestricted);
- either may narrow, never widen, with ``x-prism-regions``: the call is
  then allowed the intersection (the header alone, when unrestricted);
  an intersection that is empty allows nothing.

Enforced on every path a call can take: a route wrapper (outermost) filters
whatever route was chosen (the model's chain, a rule's, a cross-tier
fallback's, the breaker's stand-down), a veto guards every attempt
(retries included), and a pinned binding outside the allowed regions is
refused with 403 before anything is sent.
"""

from __future__ import annotations

import logging
from collections.abc import Generator
from typing import Any

from prism_proxy import (
    Binding,
    Call,
    Catalog,
    Generation,
    ModelSpec,
    OrgSetting,
    PrismError,
    Route,
    hookimpl,
)

from .settings import (
    PLUGIN_NAME,
    SETTING,
    SETTING_HELP,
    Settings,
    parse_regions,
    regions_of,
    warn_unserved,
)

__all__ = ["HEADER", "POLICY_NAME", "RegionPolicy", "policy_of"]

log = logging.getLogger("prism.regions")

#: The request header a caller narrows its regions with.
HEADER = "x-prism-regions"
#: The name this generation's object is registered under.
POLICY_NAME = f"{PLUGIN_NAME}.policy"
#: ``call.extensions`` key of the call's allowed regions (None: unrestricted).
EXTENSION = PLUGIN_NAME
_UNSET = object()


@hookimpl
def prism_settings() -> dict[str, type[Any]]:
    return {PLUGIN_NAME: Settings}


@hookimpl
def prism_org_settings() -> list[OrgSetting]:
    return [OrgSetting(SETTING, parse_regions, SETTING_HELP, doubts=unserved_regions)]


def unserved_regions(regions: frozenset[str], catalog: Catalog) -> list[str]:
    """An organisation's regions no line of the catalog serves from (a warning, not an error)."""
    served = {binding.region for binding in catalog.bindings.values()}
    return [
        f"no line of {catalog.source} serves from {region}"
        for region in sorted(regions)
        if region not in served
    ]


@hookimpl
def prism_generation(generation: Generation) -> None:
    settings = Settings.from_config(generation.config)
    warn_unserved(generation, settings)
    generation.register(RegionPolicy(settings.default), POLICY_NAME)


def policy_of(generation: Generation) -> RegionPolicy | None:
    """The region policy of ``generation`` (None: the plugin is not loaded)."""
    found = generation.plugin(POLICY_NAME)
    return found if isinstance(found, RegionPolicy) else None


def _listed(allowed: frozenset[str]) -> str:
    return ", ".join(sorted(allowed)) if allowed else "none"


def _nothing_left(allowed: frozenset[str]) -> str:
    if not allowed:
        return "regions: no region allowed (x-prism-regions names none of the caller's regions)"
    return f"regions: no line left in {_listed(allowed)}"


def _reason(binding: Binding) -> str:
    return f"region: {binding.region or 'none'} not allowed"


class RegionPolicy:
    """One generation's region policy and the hooks that enforce it."""

    def __init__(self, default: frozenset[str] | None) -> None:
        #: The regions of callers without an organisation (None: unrestricted).
        self.default = default

    # -- the call's regions ------------------------------------------------------

    def allowed(self, call: Call) -> frozenset[str] | None:
        """The regions ``call`` may be served from (None: anywhere); computed once per call."""
        found = call.extensions.get(EXTENSION, _UNSET)
        if found is _UNSET:
            found = call.extensions[EXTENSION] = self._compute(call)
        assert found is None or isinstance(found, frozenset)
        return found

    def _compute(self, call: Call) -> frozenset[str] | None:
        principal = call.principal
        if principal.org is None:
            base = self.default
        else:
            try:
                base = regions_of(principal.settings.get(SETTING))
            except ValueError as exc:
                # Unreadable must not mean unrestricted: the organisation's calls stop.
                log.error(
                    "organisation %r: its %s setting cannot be read (%s); its calls are refused",
                    principal.org,
                    SETTING,
                    exc,
                )
                raise PrismError(
                    500,
                    "region_setting_invalid",
                    f"the organisation's {SETTING} setting cannot be read; "
                    "the operator must set it again",
                ) from None
        asked = _asked(call)
        if asked is None:
            return base
        return asked if base is None else base & asked

    # -- hooks -----------------------------------------------------------------------

    @hookimpl
    def prism_call_start(self, call: Call) -> None:
        allowed = self.allowed(call)
        if allowed is None:
            return
        model = call.model
        if model is None or not model.pinned:
            return
        (binding,) = model.chain
        if binding.region in allowed:
            return
        where = f"region {binding.region}" if binding.region else "no declared region"
        raise PrismError(
            403,
            "region_not_allowed",
            f"binding '{binding.id}' is served from {where}; this call may be served "
            f"only from: {_listed(allowed)}",
            param="model",
        )

    @hookimpl(wrapper=True, tryfirst=True)  # the contract's policy wrapper: outermost
    def prism_select_route(
        self, call: Call, model: ModelSpec
    ) -> Generator[None, Route | None, Route | None]:
        route = yield
        allowed = call.extensions.get(EXTENSION, _UNSET)
        if allowed is None or route is None:
            return route  # unrestricted: nothing to look at
        if allowed is _UNSET:
            allowed = self.allowed(call)
            if allowed is None:
                return route
        assert isinstance(allowed, frozenset)
        bindings = route.bindings
        keep = tuple(b for b in bindings if b.region in allowed)
        if len(keep) == len(bindings):
            return route
        route.skipped.extend((b, _reason(b)) for b in bindings if b.region not in allowed)
        route.bindings = keep
        if not keep:
            route.notes.append(_nothing_left(allowed))
        return route

    @hookimpl
    def prism_admit_attempt(self, call: Call, binding: Binding) -> str | None:
        allowed = call.extensions.get(EXTENSION, _UNSET)
        if allowed is None:
            return None
        if allowed is _UNSET:
            allowed = self.allowed(call)
            if allowed is None:
                return None
        assert isinstance(allowed, frozenset)
        return None if binding.region in allowed else _reason(binding)


def _asked(call: Call) -> frozenset[str] | None:
    """The regions the caller narrowed the call to with ``x-prism-regions`` (None: not sent).

    Several header lines are one comma list, as HTTP has it.  A name that is
    not a region, or a header that names none, is 400: a caller that meant to
    narrow must not be served anywhere by mistake.
    """
    values = call.request.headers.getall(HEADER, None)
    if values is None:
        return None
    try:
        asked = parse_regions(",".join(values))
    except ValueError as exc:
        raise PrismError(400, "invalid_region_header", f"{HEADER}: {exc}", param=HEADER) from None
    if not asked:
        raise PrismError(
            400,
            "invalid_region_header",
            f"{HEADER} names no region: name the regions this call may be served from "
            "(eu-west-1, eu-central-1), or leave the header out",
            param=HEADER,
        )
    return asked
