"""Who an organisation or a key id is, for operator tools: the type of the ``principals`` service.

An auth plugin that keeps organisations and keys (prism-keys) provides it,
so that another plugin's operator command can show what applies to an
organisation or a key without importing the auth plugin: ``prism limits show
acme`` reads the organisation's limits through it, ``prism limits show
KEY_ID`` the key's and its organisation's.  The answers are the
:class:`~prism_proxy.Principal` a call with such a key would carry, with the
settings parsed by the declarations (``prism_org_settings``) of the
generation that provides the service, exactly as the gateway parses them.

Read-only, and usable from a generation nobody started (a command line
builds one from the configuration and never serves with it): a provider
reads its store when asked if it has nothing loaded yet, and releases what
it opened for that.
"""

from __future__ import annotations

from typing import Protocol, runtime_checkable

from .call import Principal

__all__ = ["Principals"]


@runtime_checkable
class Principals(Protocol):
    """Organisations and keys as calls see them (settings parsed, secrets never included)."""

    async def organisation(self, org: str) -> Principal | None:
        """``org`` as its keys' calls carry it: ``org``, ``org_tags`` and ``settings``
        (parsed; a stored value that no longer parses is left out, as for calls);
        ``key_id`` None, no ``scopes``, no ``key_settings``.  None: no such organisation.

        Raises the store's error when it cannot be read.
        """
        ...

    async def key(self, key_id: str) -> Principal | None:
        """The principal a call with the key ``key_id`` carries: ``key_id``, ``org``,
        ``org_tags``, ``scopes``, the organisation's ``settings`` and the key's own
        ``key_settings``, parsed.  None: no such key, or a revoked one (its settings
        apply to nothing).  ``key_id`` is the id the auth plugin shows, never key text.

        Raises the store's error when it cannot be read.
        """
        ...
