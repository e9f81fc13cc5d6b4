"""The plugin contract: hook specifications, nothing else.

Every docstring here is binding for plugin authors: when the hook is called,
what each argument is, the result mode, and what an implementation may change.
Implement a hook with ``@prism_proxy.hookimpl`` on a function of the same name
in the module (or object) your ``prism_proxy`` entry point names.  Only the
arguments you list are passed to you.

Decision hooks (``prism_authenticate``, ``prism_model_allowed``,
``prism_select_route``, ``prism_admit_attempt``, ``prism_classify``) are
synchronous: pluggy cannot await, and an ``async def`` implementation would
break ``firstresult``.  Do
I/O in a background task your generation object starts (``prism_generation``)
and read its results from memory.  Effect
hooks (``prism_on_attempt``, ``prism_settle``) may return an awaitable, which
the core awaits as their docstrings say.

The signatures are binding for the core too: the hot path's compiled callers
(``prism_proxy.hotpath.Hooks``) take their arguments and ``firstresult`` from
these specs, and their types from these annotations.
"""

from __future__ import annotations

from collections.abc import Awaitable, Iterable, Mapping
from typing import TYPE_CHECKING, Any

import pluggy

if TYPE_CHECKING:
    from aiohttp import web

    from .answers import Hit
    from .call import Attempt, Call, Principal, Route, Settlement, UpstreamResult, Verdict
    from .catalog import Binding, CatalogKeys, ModelSpec
    from .commands import CheckLine, Commands
    from .config import Config
    from .generation import Generation
    from .orgs import OrgSetting
    from .providers import ParamProfile, ProviderFactory
    from .services import Offer
    from .wire import Translation, Wire

hookspec = pluggy.HookspecMarker("prism_proxy")


@hookspec
def prism_generation(generation: Generation) -> None:
    """Build this plugin's object for a new generation and register it.

    Called once for every generation: at start-up, on every reload, and by
    ``prism check``, after the catalog is loaded and the plugins' catalog
    keys are known.  Read your section (``generation.config.section(name)``)
    and the keys you declared on ``generation.catalog``; raise
    ``ConfigError`` naming the file and key for any mistake.  Then build one
    object holding everything your per-call hooks need and register it with
    ``generation.register(obj, name)`` (its hooks are checked as at start-up:
    a misspelt ``prism_*`` name stops the build).  The per-call hooks are
    methods of that object; they never look state up elsewhere.

    Touch no file and no network here (``prism check`` builds a generation and
    never starts it): open what you need in a ``generation.cleanup_ctx``
    entry, and hold what must survive a reload (stores, writers, rings)
    through ``generation.keep(key, make)``.  Fan-out.
    """


@hookspec
def prism_services(generation: Generation) -> Iterable[Offer[Any]] | None:
    """Offer the services this plugin provides to the others, before anyone consumes one.

    Called for every generation, before any ``prism_generation``.  Return
    ``[provide(SERVICE, make), ...]`` for the services the core declares
    (``prism_proxy.SERVICES``: ``CAPACITY``, ``TELEMETRY``, ``BREAKER_STORE``,
    ``BREAKER``, ``SHARED_STATE``, ``PRICING``, ``SPEND``, ``PRINCIPALS``),
    or None when this configuration leaves the plugin inactive.  ``make()``
    runs at most once per generation, the first time a consumer asks
    (``generation.services.get(SERVICE)``); it may
    ask for other services and use ``generation.keep``, and like
    ``prism_generation`` it touches no file and no network.  Its result must
    be an instance of the service's type.

    Two plugins offering one service stop the build naming both, unless
    ``[prism] services`` chooses one (``services = capacity:redis``).  So no
    plugin needs to be called before another: do not mark this hook
    ``tryfirst`` or ``trylast``.  Fan-out.
    """


@hookspec
def prism_provider_kinds() -> Mapping[str, ProviderFactory] | None:
    """Register provider kinds: return ``{"kind-name": factory}``.

    A catalog table ``[providers.x]`` with ``kind = "kind-name"`` is built by
    calling ``factory(spec)``; the factory validates ``spec.options`` (raise
    ``spec.error(key, problem)``) and returns a ``prism_proxy.Provider``.
    Called once at start-up.  Fan-out; two plugins claiming the same kind is
    a start-up error.
    """


@hookspec
def prism_wires() -> Iterable[Wire | Translation] | None:
    """Add wire formats, and translations between them, to the ones the core speaks.

    A provider plugin whose upstream speaks an API of its own returns its
    ``Wire`` (stream inspection, usage, error body, done/error events,
    degraded answer) and the ``Translation`` from each caller wire
    (``openai``, ``anthropic``) to it; its ``Provider.wire`` names the wire.
    The core registers OpenAI chat and Anthropic messages this way itself.
    Called once per generation.  Fan-out; a name or pair registered twice is
    a start-up error.
    """


@hookspec
def prism_org_settings() -> Iterable[OrgSetting] | None:
    """Declare the per-organisation settings this plugin reads from ``Principal.settings``.

    Each ``OrgSetting(name, parse, help)``: ``parse`` turns the stored text
    into the value or raises ``ValueError`` naming the problem.  An auth
    plugin that keeps organisations (prism-keys: ``prism keys org-set ORG
    NAME=VALUE``) refuses names nobody declared and values the parser
    refuses, and hands parsed values to every hook.  Static, asked once per
    generation and by the CLI.  Fan-out; a name declared twice is an error.
    """


@hookspec
def prism_traffic_kinds() -> Iterable[str] | None:
    """Name the kinds of operator traffic this plugin sends (``probe``, ``preflight``).

    A call marked ``x-prism-traffic: KIND`` (with the admin token, or with
    ``generation.self_link.token`` in ``x-prism-internal-token``) is
    recorded as that traffic (``call.traffic``) instead of ``customer``:
    never billed to a customer, never evidence for the breaker.  The core
    accepts only the kinds some loaded plugin names here; any other value,
    or the header when no plugin names any, is refused 400
    ``invalid_traffic`` listing the registered kinds.  A call with the
    internal token must name its kind.  ``customer`` is the core's own and
    cannot be registered.  Static, asked once per generation (the set is
    ``generation.traffic_kinds``).  Fan-out; two plugins naming one kind
    share it (the kind is a label, not an owner's resource).
    """


@hookspec
def prism_settings() -> Mapping[str, type[Any]] | None:
    """Describe this plugin's configuration sections: ``{"breaker": Settings}``.

    Each class declares its keys with ``prism_proxy.setting`` (name, type,
    default, bounds, help) and the plugin reads its section with
    ``read_settings(Settings, config.section("breaker"))``: unknown keys,
    wrong types and out-of-bound values stop start-up with a message naming
    the key.  The same description is what ``prism settings`` prints and what
    the plugin's README shows between ``<!-- settings: prism:breaker -->`` and
    ``<!-- /settings -->`` (``settings_table(Settings)``).  Static.  Fan-out;
    a section described twice is an error.
    """


@hookspec
def prism_catalog_keys() -> CatalogKeys | None:
    """Declare the extra catalog keys this plugin reads on models and chain lines.

    The core rejects unknown keys in the catalog; a plugin that reads, say,
    ``price`` on chain lines returns ``CatalogKeys(binding=frozenset({"price"}))``.
    Called once at start-up, before the catalog is validated.  Fan-out.
    """


@hookspec
def prism_param_profiles() -> Mapping[str, ParamProfile] | None:
    """Ship parameter profiles: return ``{"family-name": ParamProfile(...)}``.

    A chain line that says ``family = "family-name"`` gets the profile's
    known adjustments (parameters dropped, parameters renamed) as if it had
    declared them as ``drop_params``/``rename_params``; the line's own
    settings override the profile's.  ``ParamProfile.kinds`` names the
    provider kinds whose lines may use it.  Called once per generation,
    before ``prism_generation``; the profiles are on
    ``generation.param_profiles``, which a provider plugin passes to
    ``check_param_rules``.  Fan-out; a family name two plugins register is a
    start-up error naming both.
    """


@hookspec
def prism_catalog_lines(generation: Generation) -> Iterable[tuple[str, Binding]] | None:
    """Name the chain lines this plugin adds beyond the models' own chains.

    A routing plugin whose rules carry chain lines of their own (lines no
    model's ``chain`` has) returns each with its catalog address, e.g.
    ``("models.chat.rules[0].chain[1]", binding)``, so that plugins checking
    every line a call could be served by (prices, regions) see them at
    start-up and in ``prism check``.  Lines that are the catalog's own chain
    lines need not be returned.  Called from ``prism_generation`` by the
    plugins that check lines (``generation.catalog`` is loaded); return the
    very ``Binding`` objects your route will carry (``generation.memo``
    builds them once per generation).  Fan-out.
    """


@hookspec
def prism_workers(generation: Generation, count: int) -> str | None:
    """May this plugin's state be split across ``count`` processes of ``prism serve``?

    Asked once, before ``prism serve --workers N`` (N > 1) starts its workers,
    with a generation built from the configuration (not started).  Return
    None when every worker keeping its own copy is sound (a key ring each
    worker reads, a ledger each worker writes into), or a sentence saying why
    it is not (a breaker's health and trial slots kept in one process):
    start-up then stops with it.  Fan-out.
    """


@hookspec
def prism_check(
    generation: Generation, offline: bool
) -> Iterable[CheckLine] | Awaitable[Iterable[CheckLine]] | None:
    """Tell ``prism check`` whether this plugin is on, and whether what it needs answers.

    Called once by ``prism check`` (never by ``prism serve``), after the
    configuration, catalog and every plugin's ``prism_generation`` checked
    out, with that generation (built, never started: nothing of yours is
    open).  Return ``CheckLine(subject, text, ok=True)`` lines, or an
    awaitable resolving to them: ``subject`` is what an operator asks about
    (``billing``, ``keys``, ``shared state``), ``text`` says whether it is on
    and why, where, and what was found (``off: no [prism:billing] section``,
    ``on, ledger postgresql://prism:***@db/prism: reachable, table ledger
    present``).

    Unless ``offline``, reach every database or service your configuration
    names, as ``prism serve`` would, with a connection of your own opened
    and closed here, a timeout of a few seconds, and **read-only**: never
    create a table, write a key or take a lock (``prism check`` runs against
    production).  A service that does not answer is a line with
    ``ok=False`` (``CheckLine.unreachable`` words it and hides the URL's
    password); any line with ``ok=False`` makes ``prism check`` exit 1.
    With ``offline`` touch no network: say what is configured.

    Never put a password, key or prompt in a line (``redact_url``).  An
    implementation that raises, or whose awaitable takes more than 30 s, is
    reported as a failed line naming the plugin.  Fan-out; the awaitables
    run side by side.
    """


@hookspec
def prism_readyz(generation: Generation) -> Mapping[str, object] | None:
    """Facts this plugin adds to ``GET /readyz`` (e.g. ``{"shared_state": "degraded"}``).

    Called on every readiness probe with the generation serving now; answer
    from memory (no I/O: probes come often and must not hang on the thing
    they report).  Readiness stays 200: a plugin that can keep serving in a
    degraded way says so here rather than taking the replica out of the
    load balancer.  Keys must not collide with the core's (``status``,
    ``pid``, ``generation``, ``plugins``, ``disabled``, ``models``); a
    collision is dropped.  Fan-out; the mappings are merged.
    """


@hookspec
def prism_cli(commands: Commands) -> None:
    """Add subcommands to the ``prism`` command line (``prism breaker ...``).

    Called once when ``prism`` starts, with the plugins the configuration
    enables (``--config`` is pre-read for that).  Call
    ``commands.add(name, help, run)``: it returns the ``argparse`` parser to
    add arguments to; ``run(args, config) -> int`` is called with the parsed
    arguments and the loaded ``Config`` and returns the exit status.  Raise
    ``ConfigError`` for configuration mistakes.  Fan-out.
    """


@hookspec
def prism_app_setup(app: web.Application, config: Config) -> None:
    """Add routes (admin endpoints, pages) to the gateway app.

    Called once per process while the app is built, with the first
    generation's configuration; routes are fixed for the life of the process
    (a reload does not add or remove them).  A handler finds this plugin's
    object for the generation serving now with
    ``request.app[GATEWAY].current.plugin(name)``.  State and background
    work belong to the generation (``prism_generation``), not here.
    Fan-out; the result is ignored.
    """


@hookspec(firstresult=True)
def prism_authenticate(call: Call) -> Principal | None:
    """Establish who is calling (``call.request`` has the headers).

    Called for every call after its body is parsed and validated, before the
    model is resolved, and for ``GET /v1/models`` (``call.endpoint`` is
    ``models``; such a call is never dispatched nor settled).  Return a
    ``Principal`` to accept, raise ``PrismError(401, ...)`` or
    ``PrismError(403, ...)`` to refuse, or return None to let the next
    implementation decide.  The built-in default
    (``trylast``) accepts everyone as anonymous.  First result wins.  Must not
    log or echo the credential.
    """


@hookspec
def prism_model_allowed(call: Call, model: ModelSpec) -> bool | None:
    """May the caller of ``call`` use ``model``?  Return False to say no.

    Asked by ``GET /v1/models`` for every catalog model, after
    ``prism_authenticate`` accepted the caller (``call.endpoint`` is
    ``models``; ``call.principal`` and what authentication put in
    ``call.extensions`` are there), and by ``GET /v1/models/{id}``: a model
    some implementation says False for is left out of the list and answered
    404 ``model_not_found``, so a caller sees only what it may call.  Return
    None (or True) to leave it to the others.  A plugin that refuses calls
    on a model (in ``prism_call_start``) answers here with the same rule, so
    the list and the calls agree.  Synchronous and cheap.  Fan-out: listed
    only when no implementation says False.
    """


@hookspec
def prism_call_start(call: Call) -> None:
    """Set per-call policy once the caller and model are known.

    Called for every authenticated call before its route is chosen.  May set
    ``call.attempt_timeout_s``, ``call.timeout_retry``, ``call.metadata``,
    ``call.extensions[...]`` and add ``call.response_headers``; may raise
    ``PrismError`` to refuse the call with a 4xx.  Fan-out.

    Order: an implementation that refuses on what the caller may do at all
    (prism-keys: a key without the model's scope) is ``tryfirst``, so such a
    caller always sees that refusal, never another plugin's.  Every other
    implementation must not depend on the order: a call refused here is
    still settled, so what an implementation reserved it gives back in
    ``prism_settle``.
    """


@hookspec(firstresult=True)
def prism_select_route(call: Call, model: ModelSpec) -> Route | None:
    """Choose the chain of bindings to try for ``call`` on ``model``.

    Called once per call with ``model`` = ``call.model`` (the resolved
    ``ModelSpec``, or a pinned one-binding spec), and again for each
    cross-tier fallback model when the operator enabled cross-tier fallback.
    Return a ``Route`` to decide, or None to let the next implementation
    decide; the built-in default (``trylast``) returns ``model.chain``.  A wrapper
    (``hookwrapper=True`` or ``wrapper=True``) may filter or reorder the
    chosen route, e.g. a breaker skipping open bindings; record what you
    left out in ``route.skipped`` and why in ``route.notes``.  Synchronous and
    cheap: no I/O.  First result wins.

    Order: plain wrappers (breaker, scoring, billing) reorder or skip and
    must not depend on each other's order.  A wrapper that enforces a policy
    no other choice may undo (prism-regions: where a call may be served) is
    ``tryfirst``: the outermost wrapper, it sees every other wrapper's route.
    One such policy wrapper per deployment.
    """


@hookspec
def prism_admit_call(call: Call) -> Awaitable[None] | None:
    """May this call go ahead at all?  Raise ``PrismError`` to refuse it.

    Called once per call, after ``prism_select_route`` chose its route
    (``call.route``) and before its first attempt: for policy that needs the
    whole call (who calls, which model, which lines may serve it), such as a
    rate limit or a budget reserving the dearest line's worst case.  A
    refusal reaches no upstream; put what the caller should know in
    ``call.response_headers`` (``Retry-After``) before raising.

    Where the answer needs a round trip to shared state, return an
    awaitable: the core awaits every implementation's together, and the call
    is refused when any of them raises (the first ``PrismError`` is the
    answer).  Keep it to one round trip.  Whatever an implementation
    reserved here it settles or gives back in ``prism_settle``, which every
    call reaches, refused ones included.  Fan-out; no order.
    """


@hookspec(firstresult=True)
def prism_lookup(call: Call) -> Hit | Awaitable[Hit | None] | None:
    """Answer ``call`` from a store instead of dispatching it: return a ``Hit``, or None.

    Called once per call, after ``prism_admit_call`` admitted it and before
    its first attempt (``call.route`` is chosen; ``call.attempts`` is
    empty).  A ``Hit`` is the answer: no upstream is called, the core sets
    ``call.served`` to ``hit.settlement.served`` and settles the call with
    ``hit.settlement`` (``outcome="cached"``) as any other.  None lets the
    call be dispatched.  Where the store needs a round trip, return an
    awaitable resolving to a ``Hit`` or None; it must not raise (a store
    that does not answer is a miss).

    A plugin that wants to store the answer the call is about to get sets
    ``call.keep_answer`` to the most bytes it will keep: the settlement
    handed to ``prism_settle`` then carries the answer as the caller got it
    (``settlement.answer``).  When nobody implements this hook the core
    skips it entirely.  First result wins.
    """


@hookspec(firstresult=True)
def prism_admit_attempt(call: Call, binding: Binding) -> str | Awaitable[str | None] | None:
    """May ``binding`` be tried now?  Return None to go ahead, or a reason to veto.

    Called before every attempt: each binding's first try and each retry,
    after ``prism_select_route`` chose the route, so it sees what happened
    since (a breaker isolating a binding the previous try just killed, an
    in-flight cap filled by concurrent calls).  A veto moves the dispatch to
    the next binding without an attempt; the reason (a few words, no caller
    data) goes into the attempt record.  Synchronous and cheap.  First
    result wins.

    Where the answer needs one round trip to shared state (a fleet-wide trial
    slot), return an awaitable resolving to the same None-or-reason: the
    dispatch awaits it before the attempt.  An awaitable is an answer, so
    the implementations after it are not asked: mark such an implementation
    ``trylast`` so the cheap, synchronous ones decide first, and re-check in
    it whatever concurrent calls may change while it waits.
    """


@hookspec
def prism_attempt_start(call: Call, attempt: Attempt) -> None:
    """An attempt is about to be sent upstream.

    Called synchronously right before each attempt (every retry and every
    binding).  Observers may tag the attempt in ``attempt.extensions`` (e.g.
    the state revision it started under) and count it in flight; they must
    not block.  Every attempt that starts is later shown to
    ``prism_on_attempt``.  Fan-out.
    """


@hookspec(firstresult=True)
def prism_classify(call: Call, attempt: Attempt, result: UpstreamResult) -> Verdict | None:
    """Classify one attempt's upstream result into a ``Verdict``.

    Called once per attempt, when the attempt's fate is known: a complete
    non-streaming body, a stream reaching its first content (commit point),
    an error status with its body, a connection error, a timeout, or the
    client going away.  Look at the status AND the body.  Return None to defer
    to the next implementation; the built-in default is ``trylast``, so a
    provider plugin overrides it with ``tryfirst`` for its own error model.
    Must not mutate ``result``.  Synchronous and cheap.  First result wins.
    """


@hookspec
def prism_on_attempt(call: Call, attempt: Attempt) -> Awaitable[None] | None:
    """Observe a classified attempt (breakers, health, latency statistics, metrics).

    Called once per attempt right after ``prism_classify``; ``attempt.verdict``
    is set.  Observers must not change the attempt.  An implementation may
    return an awaitable; the core awaits all of them before deciding what to
    do next, so keep it short.  Fan-out.
    """


@hookspec
def prism_settle(call: Call, settlement: Settlement) -> Awaitable[None] | None:
    """Account for a finished call: exactly once per call, whatever happened.

    Called for every call, including those refused for bad input.
    ``settlement.served`` is the attempt whose answer reached the caller (the
    only one that may be billed) and ``settlement.usage`` its usage.  An
    implementation may return an awaitable; the core awaits all of them
    before the response completes: for a non-streaming call before the body
    is sent, for a stream before its final event.  If an awaitable raises
    (a ledger that cannot commit), the failure is logged and the caller does
    not get an answer that was not accounted for: a non-streaming call gets
    503 ``settlement_failed`` instead of the body, a stream an error event
    instead of its final event.  Fan-out.

    Work that must follow what the others record (count a cost in a shared
    engine only once the ledger holds its row) registers
    ``call.when_settled(callback)``: it runs after every awaitable finished,
    told whether all succeeded, and the caller does not wait for what it
    schedules.
    """
