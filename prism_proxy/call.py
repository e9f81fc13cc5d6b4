"""What one call carries through the hooks: the call, its attempts, verdicts and settlement."""

from __future__ import annotations

import enum
import random
import time
from collections.abc import Callable, Mapping
from functools import cached_property
from typing import TYPE_CHECKING, Any, Literal

import attrs
import orjson

from .catalog import Binding, ModelSpec

if TYPE_CHECKING:
    from aiohttp import web

    from .capacity import Slots
    from .generation import Generation

__all__ = [
    "Attempt",
    "Call",
    "Endpoint",
    "Outcome",
    "SERVING_OUTCOMES",
    "Principal",
    "Route",
    "Settlement",
    "Skip",
    "UpstreamResult",
    "Usage",
    "Verdict",
]


# On Python 3.11 a member looked up on its enum class (``Outcome.OK``) goes
# through EnumType's ``__getattr__`` hook, about ten times the cost of a plain
# name: code that runs on every call compares with members bound to module
# names once (``_OK = Outcome.OK``).
class Endpoint(enum.StrEnum):
    """The caller-facing API a call came in on; it fixes the wire format of the answer."""

    CHAT = "chat"
    EMBEDDINGS = "embeddings"
    MESSAGES = "messages"
    #: OpenAI's Responses API (``POST /v1/responses``), served by translation.
    RESPONSES = "responses"
    #: ``GET /v1/models``: authenticated like a call, never dispatched nor settled.
    MODELS = "models"


class Outcome(enum.StrEnum):
    """What one attempt amounted to, as decided by ``prism_classify``."""

    OK = "ok"
    EMPTY = "empty"
    TRANSIENT = "transient"
    RATE_LIMITED = "rate_limited"
    TIMEOUT = "timeout"
    PERMANENT = "permanent"
    REQUEST_ERROR = "request_error"
    CANCELLED = "cancelled"
    BROKEN_STREAM = "broken_stream"
    #: A content filter or safety system refused the prompt or cut the answer
    #: (a finish reason in the provider wire's ``filtered``, or a classifier's say).
    CONTENT_FILTERED = "content_filtered"


#: The outcomes of an attempt whose answer may reach the caller: dispatch stops
#: at the first of them (``empty`` and ``content_filtered`` are served flagged, or
#: fall back if the model says ``empty = "fallback"``; a filtered 200 only: a
#: refused prompt has no answer to serve).
SERVING_OUTCOMES = frozenset({Outcome.OK, Outcome.EMPTY, Outcome.CONTENT_FILTERED})


@attrs.frozen
class Verdict:
    """A classification: the outcome, a short reason (never body text), and Retry-After.

    ``code`` optionally names the caller-facing error code this verdict
    stands for when it is the last one (e.g. ``upstream_auth_failed``).
    """

    outcome: Outcome
    reason: str = ""
    retry_after_s: float | None = None
    code: str | None = None


@attrs.frozen
class Principal:
    """Who is calling, as established by ``prism_authenticate``."""

    key_id: str | None = None
    org: str | None = None
    org_tags: frozenset[str] = frozenset()
    scopes: frozenset[str] = frozenset()
    #: The organisation's settings, parsed (see ``prism_org_settings``).
    settings: Mapping[str, Any] = attrs.field(factory=dict, hash=False)
    #: The key's own settings (declared ``per_key``), parsed; they apply inside
    #: the organisation's.
    key_settings: Mapping[str, Any] = attrs.field(factory=dict, hash=False)

    @property
    def anonymous(self) -> bool:
        return self.key_id is None


ANONYMOUS = Principal()


@attrs.define
class Route:
    """The bindings to try, in order, and why (``name`` is the rule or ``default``).

    ``notes`` end up in the attempt record (for example a breaker standing
    down); ``skipped`` holds bindings left out before dispatch, with reasons.
    ``cross_tier`` false forbids the model's cross-tier fallback for this call
    (a routing rule that pins a region replaces the whole chain, fallbacks
    included).
    """

    bindings: tuple[Binding, ...]
    name: str = "default"
    cross_tier: bool = True
    notes: list[str] = attrs.field(factory=list)
    skipped: list[tuple[Binding, str]] = attrs.field(factory=list)


@attrs.define
class Attempt:
    """One try of one binding."""

    number: int
    binding: Binding
    id: str
    started_at: float
    #: The generation (configuration) the attempt started under: evidence about
    #: ``binding`` as that generation's catalog described it.
    generation: int = 0
    status: int | None = None
    verdict: Verdict | None = None
    #: Time from the attempt's start to its verdict: to the first content of
    #: a stream, to the whole body otherwise.
    elapsed_ms: float = 0.0
    #: A short technical cause such as ``connect: ClientConnectorError``; never body text.
    error: str | None = None
    #: Why a serving attempt's answer ended, as the upstream said (``stop``, ``length``,
    #: ``end_turn``, ``tool_calls``…); None until it did.
    finish_reason: str | None = None
    #: Parameters dropped or renamed for this binding (``x-prism-params-adjusted``).
    params_adjusted: list[str] = attrs.field(factory=list)
    #: How the line got the call when not plainly in the caller's wire
    #: (``native responses``, ``translated to anthropic``), for the attempt record.
    sent_as: str | None = None
    #: Plugins' own per-attempt data, keyed by plugin name.
    extensions: dict[str, Any] = attrs.field(factory=dict)

    @property
    def outcome(self) -> Outcome | None:
        return self.verdict.outcome if self.verdict else None

    @property
    def first_byte_ms(self) -> float | None:
        """First-token latency: the time to the verdict, when an answer arrived at all."""
        return self.elapsed_ms if self.status is not None and not self.error else None


@attrs.frozen
class Skip:
    """A record entry that is not an attempt: a binding skipped or vetoed, or a note.

    ``kind`` is ``skipped`` (left out when the route was walked), ``vetoed``
    (refused by ``prism_admit_attempt`` just before an attempt) or ``note``.
    """

    kind: str
    reason: str
    binding: Binding | None = None


@attrs.define
class UpstreamResult:
    """What ``prism_classify`` looks at: status, headers and body, or the failure.

    ``status`` is None when no response arrived (connection error, timeout).
    For a stream, ``body`` is the error event's payload when the upstream sent
    one before the commit point, and ``stream_broken`` says the connection
    broke before any content was forwarded.
    """

    status: int | None
    headers: Mapping[str, str] = attrs.field(factory=dict)
    body: bytes = b""
    error: BaseException | None = None
    timed_out: bool = False
    stream_broken: bool = False
    streaming: bool = False
    #: The wire format of ``body``: the provider's (``openai``, ``anthropic``).
    wire: str = "openai"
    #: Why a 200 is not an answer in its wire's shape (a body without choices,
    #: a stream event that is not JSON): the core judges such an attempt a
    #: failure itself, before any classifier is asked.
    malformed: str | None = None
    #: For a stream: the wire saw, without parsing it, that the committing event
    #: is a plain chunk of answer text (no error, usage or finish); ``json``
    #: parses it only when asked.
    plain_commit: bool = False

    @cached_property
    def json(self) -> Any:
        """The body parsed as JSON, or None when it is not JSON."""
        if not self.body:
            return None
        try:
            return orjson.loads(self.body)
        except orjson.JSONDecodeError:
            return None

    @cached_property
    def text_lower(self) -> str:
        return self.body.decode("utf-8", "replace").lower()


@attrs.frozen
class Usage:
    """Tokens used by the serving attempt; ``estimated`` when the provider did not report them.

    ``input_tokens`` counts every prompt token, cached or not;
    ``cached_input_tokens`` (read from a cache) and ``cache_creation_tokens``
    (written to one) are the parts of it billed at other rates.
    ``reasoning_tokens`` is the part of ``output_tokens`` spent on reasoning
    the caller never sees.  ``reasoning_unmeasured``: the answer carried
    reasoning (a thinking block, whose text may be a summary or omitted, or
    a redacted one) but the report does not say how much of
    ``output_tokens`` it took, so the delivered text cannot bound them.
    ``suspect`` marks a report that could not be true (a count that is not a
    whole number, or more output than was asked for or delivered): its
    counts were replaced by the estimate.
    """

    input_tokens: int = 0
    output_tokens: int = 0
    cached_input_tokens: int = 0
    cache_creation_tokens: int = 0
    estimated: bool = False
    reasoning_tokens: int = 0
    suspect: bool = False
    reasoning_unmeasured: bool = False


def token_count(value: Any) -> int | None:
    """A reported token count: a whole number >= 0, else None (absent or not a count)."""
    if type(value) is int and value >= 0:
        return value
    return None


@attrs.frozen(kw_only=True)
class Settlement:
    """How a call ended, handed once to ``prism_settle``.

    ``outcome`` is ``ok`` (served in full), ``empty`` (an empty completion
    served flagged, see ``x-prism-outcome``), ``content_filtered`` (a content
    filter refused the prompt or cut the answer: served flagged, or refused
    with code ``content_filtered``), ``error`` (nothing served, or a
    stream that broke after its commit point), ``aborted`` (the client went
    away or the server shut down mid-answer) or ``cached`` (a plugin answered
    from its cache, ``prism_lookup``: no upstream was called; ``served`` is
    the stored answer's line, priced at its cache price).  ``served`` is the
    attempt whose answer reached the caller, if any; only it may be billed.
    ``answer`` is that answer as the caller got it (its body, or its stream's
    events), kept only when a plugin asked (``Call.keep_answer``) and no
    longer than that.
    """

    outcome: Literal["ok", "empty", "content_filtered", "error", "aborted", "cached"]
    status: int
    served: Attempt | None = None
    usage: Usage | None = None
    error_code: str | None = None
    answer: bytes | None = None


def new_id(prefix: str) -> str:
    """A fresh identifier: ``prefix``, the time in milliseconds and 64 random bits, in hex.

    Identifiers need to be unique, not secret; ``random`` draws them without
    a system call per id (and reseeds itself in a forked child).  Leading with
    the time keeps identifiers made close together close in order, so a
    ledger's index on them grows at its end: a commit of many calls' rows
    rewrites a page or two of it instead of one page per row.
    """
    return f"{prefix}{time.time_ns() // 1_000_000:012x}{random.getrandbits(64):016x}"


@attrs.define(eq=False)
class Call:
    """One caller request, from validation to settlement.

    Plugins may read everything and may write: ``principal`` (authenticate),
    ``attempt_timeout_s`` and ``timeout_retry`` (call_start), ``metadata``,
    ``response_headers`` (extra headers for the caller) and ``extensions``
    (a plugin's own per-call scratch space, keyed by plugin name; the core
    keeps its own state in typed fields, never there).  How the call ended
    is not on it: ``prism_settle`` is handed the settlement.
    """

    request_id: str
    endpoint: Endpoint
    received_at: float
    request: web.Request
    generation: Generation
    #: ``customer`` for callers; ``probe``/``preflight`` for traffic Prism or a
    #: plugin makes itself, which never reaches a customer's bill.
    traffic: str = "customer"
    body: dict[str, Any] = attrs.field(factory=dict)
    model_name: str = ""
    model: ModelSpec | None = None
    stream: bool = False
    include_usage: bool = False
    principal: Principal = ANONYMOUS
    metadata: dict[str, Any] = attrs.field(factory=dict)
    #: Fields plugins add to the call's access log line (billing: ``cost``); bounded
    #: values only, never a key or prompt text.
    access: dict[str, Any] = attrs.field(factory=dict)
    #: Timeout to first content for each attempt; None disables it.
    attempt_timeout_s: float | None = 60.0
    #: Whether a first-byte timeout may be retried once on the same binding.
    timeout_retry: bool = True
    route: Route | None = None
    attempts: list[Attempt] = attrs.field(factory=list)
    #: Everything dispatch did, in order: attempts, skips, vetoes and notes.
    record: list[Attempt | Skip] = attrs.field(factory=list)
    served: Attempt | None = None
    response_headers: dict[str, str] = attrs.field(factory=dict)
    #: Plugins' own per-call data, keyed by plugin name.
    extensions: dict[str, Any] = attrs.field(factory=dict)
    #: The capacity slot the serving attempt holds until the answer ends (the
    #: endpoint gives it back).
    slot: Slots | None = None
    #: What the request uses of a line's ``capabilities`` and its prompt's
    #: estimated size: worked out once, when a line first asks (``prism_proxy.gate``).
    capabilities: tuple[str, ...] | None = None
    prompt_tokens: int | None = None
    #: Callbacks waiting for the settlement to be recorded (see :meth:`when_settled`).
    settled_callbacks: list[Callable[[bool], None]] | None = None
    #: The most bytes of the served answer a plugin wants in ``Settlement.answer``
    #: (0, the default: none are kept); a longer answer is not kept at all.
    keep_answer: int = 0

    def when_settled(self, callback: Callable[[bool], None]) -> None:
        """Call ``callback(recorded)`` once every ``prism_settle`` awaitable has finished.

        ``recorded`` is False when one of them failed (a ledger that could not
        commit: the call was not billed).  For work that must follow what the
        others record, without the caller waiting for it: a shared counter
        counted only once the ledger holds the call's row, so that a gateway
        killed in between never counts a cost the ledger will not have.  The
        callback runs on the event loop before the answer completes and must
        not block; it schedules its own work.
        """
        if self.settled_callbacks is None:
            self.settled_callbacks = [callback]
        else:
            self.settled_callbacks.append(callback)

    def new_attempt(self, binding: Binding, now: float) -> Attempt:
        attempt = Attempt(
            number=len(self.attempts) + 1,
            binding=binding,
            id=new_id("att_"),
            started_at=now,
            generation=self.generation.number,
        )
        self.attempts.append(attempt)
        self.record.append(attempt)
        return attempt
