"""What provider plugins share: their generation's checks and their error model.

A provider plugin (a provider kind, often a wire of its own) keeps its
options on the catalog's provider tables and reads its API's error bodies
with an error model: a function from an ``UpstreamResult`` to a ``Verdict``.
``provider_generation`` is the whole of such a plugin's ``prism_generation``
work that every one of them does alike; ``WireErrors`` is the error model as
the generation's ``prism_classify`` implementation; the verdict helpers give
the verdicts every model gives in the same words and codes, so the attempt
records of all providers read alike.  ``CHAT_CARRIED`` (re-exported from
the wire helpers) are the chat parameters every translation of a chat
request carries over;
``check_options`` refuses a provider table's unknown keys alike for every
kind; ``ResponseWrapper`` and ``HeldResponse`` are the two ways a provider
presents an answer other than as the upstream sent it.
"""

from __future__ import annotations

import functools
from collections.abc import AsyncIterator, Iterable, Mapping
from typing import TYPE_CHECKING, Protocol

import attrs

from .call import Attempt, Call, Outcome, UpstreamResult, Verdict
from .catalog import ProviderSpec
from .classification import find_permanent_marker, marker_code
from .hookimpl import hookimpl
from .providers import HttpProvider, UpstreamResponse, check_param_rules
from .wire.chat_parts import CHAT_CARRIED

if TYPE_CHECKING:
    from .generation import Generation

__all__ = [
    "CHAT_CARRIED",
    "ErrorModel",
    "HeldResponse",
    "ResponseWrapper",
    "WireErrors",
    "check_options",
    "error_model",
    "model_not_found",
    "permanent_marker",
    "provider_generation",
    "refused_credentials",
    "rejected_request",
]

_AUTH = "upstream_auth_failed"
_NOT_FOUND = "upstream_model_not_found"


class ErrorModel(Protocol):
    """A provider's error model: a verdict for an upstream result, or None to let
    the next classifier (in the end the core's default) decide.

    ``extra_markers`` are the generation's permanent markers beyond the core's
    (``permanent_markers`` in the config).
    """

    def __call__(
        self, result: UpstreamResult, extra_markers: tuple[str, ...] = (), /
    ) -> Verdict | None: ...


def error_model(read: ErrorModel) -> ErrorModel:
    """``read`` as an error model that leaves a result with no answer to the default.

    Cancellation, a timeout and a broken connection mean the same on every
    wire, and the core's default tells them apart; ``read`` only ever sees a
    result with a status and a body.
    """

    @functools.wraps(read)
    def model(result: UpstreamResult, extra_markers: tuple[str, ...] = (), /) -> Verdict | None:
        if result.status is None or result.timed_out or result.error is not None:
            return None
        return read(result, extra_markers)

    return model


@attrs.frozen
class WireErrors:
    """An error model as one generation's ``prism_classify`` (``tryfirst``).

    It reads the attempts whose result is in ``wire``; with ``providers``, only
    those on these providers' lines (a wire another kind speaks too, as Azure
    OpenAI speaks OpenAI's).  ``markers`` are the generation's extra permanent
    markers, handed to the model.
    """

    wire: str
    model: ErrorModel
    markers: tuple[str, ...] = ()
    providers: frozenset[str] | None = None

    @hookimpl(tryfirst=True)
    def prism_classify(
        self, call: Call, attempt: Attempt, result: UpstreamResult
    ) -> Verdict | None:
        if result.wire != self.wire:
            return None
        if self.providers is not None and attempt.binding.provider not in self.providers:
            return None
        return self.model(result, self.markers)


def provider_generation(
    generation: Generation,
    plugin: str,
    kinds: Iterable[str],
    errors: WireErrors,
    *,
    own_lines: bool = False,
) -> None:
    """A provider plugin's ``prism_generation``: its checks and its error model.

    The plugin's options live on the catalog's provider tables, so a key in
    its own ``[prism:<plugin>]`` section would be ignored: it is refused.  The
    parameter rules of each kind's lines are checked, and ``errors`` is
    registered as ``<plugin>.errors`` with the generation's permanent markers.
    With ``own_lines``, ``errors`` reads only the lines of the catalog's
    providers of ``kinds``, and is not registered when there are none.
    """
    generation.config.section(plugin).check_keys(())
    kinds = tuple(kinds)
    for kind in kinds:
        check_param_rules(
            generation.catalog, kind, generation.param_profiles, generation.added_lines()
        )
    errors = attrs.evolve(errors, markers=generation.config.permanent_markers)
    if own_lines:
        providers = frozenset(
            name for name, spec in generation.catalog.providers.items() if spec.kind in kinds
        )
        if not providers:
            return
        errors = attrs.evolve(errors, providers=providers)
    generation.register(errors, f"{plugin}.errors")


def permanent_marker(result: UpstreamResult, extra_markers: Iterable[str] = ()) -> Verdict | None:
    """The permanent verdict for a body that names money or credentials, or None."""
    marker = find_permanent_marker(result.text_lower, extra_markers)
    if marker is None:
        return None
    return Verdict(Outcome.PERMANENT, f"marker: {marker}", code=marker_code(marker))


def refused_credentials(said: object) -> Verdict:
    """Credentials or a signature refused (``said``: the status or the API's name
    for it): a broken line, never the caller's fault."""
    return Verdict(Outcome.PERMANENT, f"upstream refused credentials ({said})", code=_AUTH)


def model_not_found(reason: str = "upstream model not found") -> Verdict:
    """The line's model (or deployment) is not there: permanent for the line."""
    return Verdict(Outcome.PERMANENT, reason, code=_NOT_FOUND)


def rejected_request(said: object) -> Verdict:
    """The caller's request refused (``said``: the status or the API's name for it):
    returned to the caller, not failed over."""
    return Verdict(Outcome.REQUEST_ERROR, f"upstream rejected the request ({said})")


def check_options(spec: ProviderSpec, kind: str, options: Iterable[str]) -> None:
    """Refuse a key of the provider table that is neither one of the kind's
    ``options`` nor one every HTTP provider takes, naming the known ones: a
    typo stops start-up instead of being ignored."""
    known = frozenset(options) | HttpProvider.COMMON_OPTIONS
    for key in spec.options:
        if key not in known:
            listed = ", ".join(sorted(known))
            raise spec.error(key, f"unknown option for kind {kind!r} (known: {listed})")


class ResponseWrapper:
    """An ``UpstreamResponse`` that passes another one through: a provider's
    subclass overrides ``read`` or ``iter_chunks`` to present the body otherwise
    (another stream framing as SSE, a mark the answer's translation reads)."""

    def __init__(self, response: UpstreamResponse) -> None:
        self.response = response
        self.status = response.status
        self.headers: Mapping[str, str] = response.headers

    async def read(self) -> bytes:
        return await self.response.read()

    def iter_chunks(self) -> AsyncIterator[bytes]:
        return self.response.iter_chunks()

    def at_eof(self) -> bool:
        return self.response.at_eof()

    def close(self) -> None:
        self.response.close()

    def release(self) -> None:
        self.response.release()


@attrs.define(eq=False)
class HeldResponse:
    """An ``UpstreamResponse`` whose whole body is in memory: an answer made
    without asking the upstream (a refusal said in the API's own error body)."""

    status: int
    headers: Mapping[str, str]
    body: bytes

    async def read(self) -> bytes:
        return self.body

    async def iter_chunks(self) -> AsyncIterator[bytes]:
        yield self.body

    def at_eof(self) -> bool:
        return True

    def close(self) -> None:
        return None

    def release(self) -> None:
        return None
