"""The provider adapter contract, and a pooled-HTTP base class for adapters.

A provider plugin registers factories through ``prism_provider_kinds``; a
factory takes a :class:`ProviderSpec` (one ``[providers.<name>]`` table),
validates its options (raising ``ConfigError`` via ``spec.error``) and returns
a :class:`Provider`.  The core starts every provider once at app start-up and
closes it at shutdown, so each holds one pooled client session.
"""

from __future__ import annotations

import abc
import importlib.metadata
import logging
import os
from collections.abc import AsyncIterator, Callable, Iterable, Mapping
from types import MappingProxyType
from typing import Any, ClassVar, Protocol

import attrs
import cachetools

from .call import Call, Endpoint
from .catalog import Binding, Catalog, ProviderSpec
from .distribution import DISTRIBUTION
from .egress import DIRECT, Egress, parse_proxy
from .errors import ConfigError
from .upstream_http import UpstreamClient

__all__ = [
    "PARAM_RULE_KEYS",
    "HttpProvider",
    "ParamProfile",
    "Provider",
    "ProviderFactory",
    "UpstreamResponse",
    "check_param_rules",
    "line_params",
    "normalise_params",
]

log = logging.getLogger("prism")

#: Catalog line keys for per-family parameter normalisation (declared by provider plugins).
PARAM_RULE_KEYS = frozenset({"family", "drop_params", "rename_params"})

#: A line's effective parameter rules: the names to drop, and ``old -> new`` renames.
LineParams = tuple[tuple[str, ...], Mapping[str, str]]

#: The most lines' resolved parameters a provider keeps, the oldest going first (a
#: plugin that builds a new ``Binding`` per call must not grow the cache forever).
_LINE_PARAMS_CACHE = 4096


def _param_names(value: Iterable[str]) -> tuple[str, ...]:
    if isinstance(value, str) or not all(isinstance(name, str) and name for name in value):
        raise TypeError(f"expected a list of parameter names, got {value!r}")
    return tuple(dict.fromkeys(value))


def _param_renames(value: Mapping[str, str]) -> Mapping[str, str]:
    renames = dict(value)
    if not all(isinstance(k, str) and k and isinstance(v, str) and v for k, v in renames.items()):
        raise TypeError(f'expected a table of old = "new" parameter names, got {value!r}')
    return MappingProxyType(renames)


def _kinds(value: Iterable[str]) -> frozenset[str]:
    if isinstance(value, str):
        return frozenset({value})
    return frozenset(value)


@attrs.frozen
class ParamProfile:
    """A model family's known parameter adjustments (hook ``prism_param_profiles``).

    A chain line that says ``family = "<name>"`` gets ``drop`` (parameters
    the family refuses, removed from the body) and ``rename`` (``old`` sent
    as ``new``), as if the line had declared them as ``drop_params`` and
    ``rename_params``; the line's own settings override them
    (:func:`line_params`).  ``kinds``: the provider kinds whose lines may use
    the family (empty: any kind); the names are those of the body in that
    provider's wire format.
    """

    drop: tuple[str, ...] = attrs.field(default=(), converter=_param_names)
    rename: Mapping[str, str] = attrs.field(factory=dict, converter=_param_renames)
    kinds: frozenset[str] = attrs.field(default=frozenset(), converter=_kinds)
    description: str = ""


class UpstreamResponse(Protocol):
    """An upstream answer whose headers have arrived and whose body is still to read."""

    status: int
    headers: Mapping[str, str]

    async def read(self) -> bytes:
        """The whole body."""

    def iter_chunks(self) -> AsyncIterator[bytes]:
        """Body bytes as they arrive (for streams)."""

    def at_eof(self) -> bool:
        """Whether the whole body has arrived and been read (releasing now loses nothing)."""

    def close(self) -> None:
        """Drop the connection at once: the upstream sees the client go away."""

    def release(self) -> None:
        """Done with a fully read body: the connection may return to the pool."""


class Provider(abc.ABC):
    """One configured upstream account.

    ``wire`` names the wire format the upstream speaks (``"openai"`` or
    ``"anthropic"``) and ``endpoints`` what it serves natively.  The core
    translates between wire formats: a chat call can be served by an
    Anthropic provider, a messages call by an OpenAI one.

    ``native_wires`` names the other wires the upstream speaks natively, by
    the caller's endpoint (OpenAI's Responses API beside its chat wire:
    ``{Endpoint.RESPONSES: "responses"}``).  A call on such an endpoint, in
    that wire, is not translated: ``send`` gets it for that endpoint, in the
    caller's wire, and the attempt record says ``native``.  An instance sets
    it when an option decides it.
    """

    wire: ClassVar[str] = "openai"
    endpoints: ClassVar[frozenset[Endpoint]] = frozenset({Endpoint.CHAT, Endpoint.EMBEDDINGS})
    native_wires: Mapping[Endpoint, str] = MappingProxyType({})
    #: ``max_tokens`` to send when a translated request has none and the API needs one.
    default_max_tokens: int = 4096
    #: The generation's parameter profiles (``prism_param_profiles``), by family
    #: name; the core sets them when it builds the generation, before any call.
    param_profiles: Mapping[str, ParamProfile] = MappingProxyType({})

    def __init__(self, spec: ProviderSpec) -> None:
        self.spec = spec
        self.name = spec.name
        # Keyed by the binding itself (hashed by identity), so that a key cannot be
        # the id of a binding gone and reused.
        self._line_params: cachetools.FIFOCache[Binding, LineParams] = cachetools.FIFOCache(
            _LINE_PARAMS_CACHE
        )

    async def start(self) -> None:
        """Open pooled resources; called once, inside the running event loop."""

    async def close(self) -> None:
        """Release pooled resources; called once at shutdown."""

    def adjust(self, binding: Binding, body: dict[str, Any]) -> list[str]:
        """Normalise ``body`` (already in this provider's wire format) for ``binding``.

        Per-family parameter rules belong here, never in call sites.  Mutate
        ``body`` in place and return what was changed, in words (``"dropped
        temperature"``): the caller sees it in ``x-prism-params-adjusted``.
        The default applies the line's ``family`` profile and its own
        ``drop_params``/``rename_params`` (which the provider's plugin
        declares and checks with :func:`check_param_rules`), as resolved once
        per line by :meth:`line_params`; override to add rules of your own.
        """
        return normalise_params(body, *self.line_params(binding))

    def line_params(self, binding: Binding) -> LineParams:
        """``binding``'s effective drops and renames: merged on its first call, then reused."""
        try:
            return self._line_params[binding]
        except KeyError:
            drop, rename = line_params(binding, self.param_profiles)
            params = self._line_params[binding] = (drop, MappingProxyType(rename))
            return params

    @abc.abstractmethod
    async def send(
        self, call: Call, binding: Binding, endpoint: Endpoint, body: dict[str, Any]
    ) -> UpstreamResponse:
        """Send ``body`` to ``binding``'s upstream ``endpoint``; return once headers arrive.

        ``body`` is in this provider's wire format, translated and adjusted;
        set its ``model`` to ``binding.model``.  Raise
        ``aiohttp.ClientError``/``OSError`` for connection failures; the core
        enforces the attempt timeout around this call and the body read.
        """


ProviderFactory = Callable[[ProviderSpec], Provider]


class HttpProvider(Provider):
    """A provider reached over HTTP through one pool of keep-alive connections.

    The pool is Prism's own lean HTTP/1.1 client (``upstream_http``): it
    raises aiohttp's exceptions, as ``Provider.send`` says.  Options every
    HTTP provider understands: ``max_connections`` (default 256),
    ``connect_timeout_ms`` (default 10000) and ``proxy`` (the egress proxy's
    URL, or ``"none"``: see :mod:`.egress`; without it, the environment's
    ``HTTPS_PROXY``/``HTTP_PROXY``/``NO_PROXY``, read here, once per
    generation, into :attr:`egress`).  ``base_headers`` holds what
    every request should carry (``User-Agent: prism-llm-gateway/<version>`` and a
    JSON ``Content-Type``); a subclass builds its own headers on top of it,
    once, at start-up.
    """

    COMMON_OPTIONS: ClassVar[frozenset[str]] = frozenset(
        {"max_connections", "connect_timeout_ms", "proxy"}
    )

    def __init__(self, spec: ProviderSpec) -> None:
        super().__init__(spec)
        self.max_connections = _positive_int(spec, "max_connections", 256)
        self.connect_timeout_s = _positive_int(spec, "connect_timeout_ms", 10_000) / 1000
        self.egress = _egress(spec)
        self.base_headers: dict[str, str] = {
            "User-Agent": f"{DISTRIBUTION}/{_distribution_version()}",
            "Content-Type": "application/json",
        }
        self._client: UpstreamClient | None = None

    async def start(self) -> None:
        self._client = UpstreamClient(
            limit=self.max_connections, connect_timeout_s=self.connect_timeout_s, egress=self.egress
        )

    async def close(self) -> None:
        if self._client is not None:
            await self._client.close()
            self._client = None

    def option_table(self, key: str) -> dict[str, str]:
        """A ``{ name = "value" }`` option (extra headers, query parameters)."""
        value = self.spec.options.get(key, {})
        if not isinstance(value, dict) or not all(
            isinstance(k, str) and isinstance(v, str) for k, v in value.items()
        ):
            raise self.spec.error(key, "expected a table of string values")
        return dict(value)

    def secret_from_env(self, key: str = "api_key_env") -> str | None:
        """The secret in the environment variable the option ``key`` names.

        Read once, at start-up.  Unset is not fatal (local upstreams take no
        key) but is said loudly; the value itself is never logged.
        """
        name = self.spec.options.get(key)
        if name is None:
            return None
        if not isinstance(name, str) or not name:
            raise self.spec.error(key, "expected the name of an environment variable")
        value = os.environ.get(name, "")
        if not value:
            log.warning(
                "%s: environment variable %s is not set; requests go without a key",
                self.spec.where(key),
                name,
            )
            return None
        return value

    async def post(self, url: str, headers: Mapping[str, str], payload: bytes) -> UpstreamResponse:
        """POST ``payload`` and return once the response headers arrive."""
        if self._client is None:
            raise RuntimeError(f"provider {self.name!r} used before start()")
        return await self._client.post(url, headers, payload)


def _distribution_version() -> str:
    try:
        return importlib.metadata.version(DISTRIBUTION)
    except importlib.metadata.PackageNotFoundError:
        return "unknown"


def _egress(spec: ProviderSpec) -> Egress:
    """The provider's ``proxy`` option, else the environment's proxies."""
    value = spec.options.get("proxy")
    if value is None:
        return Egress.from_environment(os.environ)
    if not isinstance(value, str):
        raise spec.error("proxy", 'expected a proxy URL such as "http://proxy:3128", or "none"')
    if value.strip().lower() in ("", "none"):
        return DIRECT
    try:
        return Egress.through(parse_proxy(value))
    except ValueError as exc:  # its message never repeats the URL's credentials
        raise spec.error("proxy", str(exc)) from None


def _positive_int(spec: ProviderSpec, key: str, default: int) -> int:
    value = spec.options.get(key, default)
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise spec.error(key, f"expected a positive whole number, got {value!r}")
    return value


def normalise_params(
    body: dict[str, Any], drop: tuple[str, ...], rename: Mapping[str, str]
) -> list[str]:
    """Apply a catalog line's ``drop_params`` and ``rename_params`` to ``body``.

    Only parameters actually present are reported.
    """
    adjusted = []
    for name in drop:
        if name in body:
            del body[name]
            adjusted.append(f"dropped {name}")
    for old, new in rename.items():
        if old in body:
            body[new] = body.pop(old)
            adjusted.append(f"renamed {old} to {new}")
    return adjusted


def line_params(
    binding: Binding, profiles: Mapping[str, ParamProfile] | None = None
) -> tuple[tuple[str, ...], dict[str, str]]:
    """A catalog line's effective drops and renames (checked at start-up).

    The line's ``family`` profile (looked up in ``profiles``) comes first;
    the line's own ``drop_params`` and ``rename_params`` override it: its
    drops are added, its renames replace the profile's for the same
    parameter, a parameter it renames is no longer dropped (it goes out
    under the new name) and one it drops is no longer renamed.  A family
    missing from ``profiles`` adds nothing (:func:`check_param_rules`
    refuses it at start-up).  A provider resolves each line once
    (:meth:`Provider.line_params`).
    """
    own_drop = tuple(binding.options.get("drop_params", ()))
    own_rename = dict(binding.options.get("rename_params", {}))
    family = binding.options.get("family")
    profile = profiles.get(family) if profiles is not None and isinstance(family, str) else None
    if profile is None:
        return own_drop, own_rename
    drop = [name for name in profile.drop if name not in own_rename]
    drop += [name for name in own_drop if name not in drop]
    rename = {**profile.rename, **own_rename}
    for name in own_drop:
        rename.pop(name, None)
    return tuple(drop), rename


def check_param_rules(
    catalog: Catalog,
    kind: str,
    profiles: Mapping[str, ParamProfile] | None = None,
    lines: Iterable[tuple[str, Binding]] = (),
) -> None:
    """Validate ``family``/``drop_params``/``rename_params`` on the lines of ``kind``.

    The lines checked are the catalog's chain lines and ``lines``, those
    plugins add with their catalog addresses (``prism_catalog_lines``: a
    routing rule's own lines).  ``profiles`` are the generation's parameter
    profiles (``generation.param_profiles``); a ``family`` not among them,
    or meant for other provider kinds, is an error listing the known ones.
    """
    own = [
        (f"models.{name}.chain[{index}]", binding)
        for name, model in catalog.models.items()
        for index, binding in enumerate(model.chain)
    ]
    for where, binding in [*own, *lines]:
        spec = catalog.providers.get(binding.provider)
        if spec is None or spec.kind != kind:
            continue
        family = binding.options.get("family")
        if family is not None:
            _check_family(catalog, f"{where}.family", family, kind, profiles or {})
        drop = binding.options.get("drop_params", [])
        if not isinstance(drop, list) or not all(isinstance(p, str) for p in drop):
            raise ConfigError(catalog.source, f"{where}.drop_params", "expected a list of names")
        rename = binding.options.get("rename_params", {})
        if not isinstance(rename, dict) or not all(
            isinstance(k, str) and isinstance(v, str) and v for k, v in rename.items()
        ):
            raise ConfigError(
                catalog.source,
                f"{where}.rename_params",
                'expected a table of old = "new" names',
            )


def _check_family(
    catalog: Catalog, key: str, family: Any, kind: str, profiles: Mapping[str, ParamProfile]
) -> None:
    usable = sorted(name for name, p in profiles.items() if not p.kinds or kind in p.kinds)
    known = f"known families for provider kind {kind!r}: {', '.join(usable) or 'none'}"
    if not isinstance(family, str):
        raise ConfigError(catalog.source, key, f"expected a family name ({known})")
    profile = profiles.get(family)
    if profile is None:
        raise ConfigError(catalog.source, key, f"unknown family {family!r} ({known})")
    if profile.kinds and kind not in profile.kinds:
        raise ConfigError(
            catalog.source,
            key,
            f"family {family!r} is for provider kind {', '.join(sorted(profile.kinds))}, "
            f"not {kind!r} ({known})",
        )
