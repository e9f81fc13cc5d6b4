"""How Prism reaches itself: its own URL, and the token that marks Prism's own calls.

A plugin that sends traffic of its own through the gateway (probes) calls
``generation.self_link.url`` with ``x-prism-internal-token:
generation.self_link.token`` and ``x-prism-traffic: probe`` (a kind it
registers, ``prism_traffic_kinds``; the header is required): the call skips
authentication (it is no customer's) and is recorded as that traffic.  The
token never leaves the process; ``prism serve --workers N`` gives every worker
the same one (``PRISM_INTERNAL_TOKEN``), since a call to the port may reach
any of them.

Once the gateway drains (``draining``, set before its port closes), a call to
itself may fail for the gateway's own reasons (its port closed, its client
closed): such a plugin sends no more, and takes no failure from then on as
evidence against an upstream.
"""

from __future__ import annotations

import os
import secrets

import attrs

__all__ = ["INTERNAL_HEADER", "INTERNAL_TOKEN_ENV", "SelfLink"]

INTERNAL_HEADER = "x-prism-internal-token"
INTERNAL_TOKEN_ENV = "PRISM_INTERNAL_TOKEN"


def _token() -> str:
    return os.environ.get(INTERNAL_TOKEN_ENV) or secrets.token_urlsafe(24)


@attrs.define(eq=False)
class SelfLink:
    #: ``http://host:port`` once the gateway listens (None before, or when embedded).
    url: str | None = None
    token: str = attrs.field(factory=_token, repr=False)
    #: Set when the gateway starts draining, before its port closes; never cleared.
    draining: bool = False
