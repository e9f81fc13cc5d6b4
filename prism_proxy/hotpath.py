"""The per-call hooks as the hot path calls them: typed, and direct where pluggy adds nothing.

pluggy's general machinery (argument checks, wrappers, result lists) costs
more than a typical implementation.  A hook nobody implements is None, so
the hot path skips it; any other hook calls its implementations itself, in
pluggy's order, with the same results, exceptions and ``wrapper=True``
protocol, except a hook with an old-style ``hookwrapper``, which goes through
pluggy.  ``PRISM_TRACE_HOOKS=1`` sends every call through pluggy with its call
monitoring on, and logs each call (``prism.hooks``).
"""

from __future__ import annotations

import logging
import types
from collections.abc import Awaitable, Callable, Mapping, Sequence
from typing import TYPE_CHECKING, Any, Protocol

import attrs
import pluggy

if TYPE_CHECKING:
    from .call import Attempt, Call, Principal, Route, Settlement, UpstreamResult, Verdict
    from .catalog import Binding, ModelSpec

__all__ = ["TRACE_ENV", "Hooks", "direct_caller", "trace_hooks"]

TRACE_ENV = "PRISM_TRACE_HOOKS"
trace_log = logging.getLogger("prism.hooks")


class Authenticate(Protocol):
    def __call__(self, *, call: Call) -> Principal | None: ...


class CallStart(Protocol):
    def __call__(self, *, call: Call) -> list[None]: ...


class SelectRoute(Protocol):
    def __call__(self, *, call: Call, model: ModelSpec) -> Route | None: ...


class AdmitAttempt(Protocol):
    def __call__(self, *, call: Call, binding: Binding) -> str | Awaitable[str | None] | None: ...


class AttemptStart(Protocol):
    def __call__(self, *, call: Call, attempt: Attempt) -> list[None]: ...


class Classify(Protocol):
    def __call__(self, *, call: Call, attempt: Attempt, result: UpstreamResult) -> Verdict: ...


class OnAttempt(Protocol):
    # The awaitables implementations returned: callers drop None, as pluggy does.
    def __call__(self, *, call: Call, attempt: Attempt) -> list[Awaitable[None]]: ...


class Settle(Protocol):
    def __call__(self, *, call: Call, settlement: Settlement) -> list[Awaitable[None]]: ...


@attrs.frozen
class Hooks:
    """The hooks a call meets, with their real signatures; None where nobody implements one.

    ``classify`` is never None: the core's own default always answers.
    """

    authenticate: Authenticate | None
    call_start: CallStart | None
    select_route: SelectRoute | None
    admit_attempt: AdmitAttempt | None
    attempt_start: AttemptStart | None
    classify: Classify
    on_attempt: OnAttempt | None
    settle: Settle | None

    @classmethod
    def of(cls, pm: pluggy.PluginManager, *, trace: bool = False) -> Hooks:
        caller = _traced if trace else direct_caller
        hooks: dict[str, Any] = {
            field.name: caller(getattr(pm.hook, f"prism_{field.name}"))
            for field in attrs.fields(cls)
        }
        return cls(**hooks)


def direct_caller(caller: pluggy.HookCaller) -> Callable[..., Any] | None:
    """How the hot path calls a hook: None when nobody implements it; else the
    implementations themselves, in pluggy's order (wrappers outermost; tryfirst
    first, then the latest registered, trylast last), with pluggy's results
    (first non-None for a firstresult hook, else the list of non-None answers),
    its exceptions and its ``wrapper=True`` protocol.  A hook with an old-style
    ``hookwrapper`` (or keyword-only hook arguments) goes through pluggy's caller.
    pluggy's call tracing does not see direct calls.
    """
    impls = caller.get_hookimpls()
    if not impls:
        return None
    if any(impl.hookwrapper or impl.kwargnames for impl in impls):
        return caller
    firstresult = bool(caller.spec is not None and caller.spec.opts.get("firstresult"))
    # pluggy calls the list it keeps from its end (wrappers, kept last, come
    # first): that is the order to keep.
    ordered = [(impl.function, tuple(impl.argnames), impl.wrapper) for impl in reversed(impls)]
    if any(name.startswith("_") for _, names, _ in ordered for name in names):
        return caller  # such a name could shadow the compiled function's own
    return _compiled(ordered, firstresult)


def _compiled(
    ordered: Sequence[tuple[Callable[..., Any], tuple[str, ...], bool]], first: bool
) -> Callable[..., Any]:
    """One function that calls each implementation with its own arguments, in order.

    Written out as source (as attrs and namedtuple do) so that a call costs
    what the implementations cost: no argument lists built per implementation.
    Argument names are the implementations' parameters, so valid identifiers;
    the function's own names start with ``_``, and a hook with such an
    argument goes through pluggy instead.  ``wrapper=True`` generators run
    first and are resumed with the result (or the exception) last, as
    pluggy's multicall does (:func:`_unwind`).
    """
    namespace: dict[str, Any] = {"_unwind": _unwind, "_second_yield": _second_yield}
    used = list(dict.fromkeys(name for _, names, _ in ordered for name in names))
    # Required keywords: Python itself names one a caller left out, at no cost per call.
    params = ", ".join([*used, "**_others"])
    lines = [f"def hook(*, {params}):"]
    wrappers = [(i, names) for i, (_, names, wrapper) in enumerate(ordered) if wrapper]
    plain = [(i, names) for i, (_, names, wrapper) in enumerate(ordered) if not wrapper]
    for index, (function, _, _) in enumerate(ordered):
        namespace[f"_f{index}"] = function
    body = []
    for index, names in wrappers:
        body += [
            f"_w{index} = _f{index}({', '.join(names)})",
            "try:",
            f"    next(_w{index})",
            "except StopIteration:",
            f"    raise RuntimeError('wrapper ' + _f{index}.__qualname__ + ' did not yield')"
            " from None",
            f"_teardowns.append(_w{index})",
        ]
    if first:
        # The first answer that is not None; later implementations are not called.
        body.append("_result = None")
        for index, names in plain:
            body.append(f"if _result is None: _result = _f{index}({', '.join(names)})")
    else:
        body.append("_result = []")
        for index, names in plain:
            body.append(f"_r = _f{index}({', '.join(names)})")
            body.append("if _r is not None: _result.append(_r)")
    if wrappers:
        lines.append("    _teardowns = []")
        lines.append("    try:")
        lines += [f"        {line}" for line in body]
        lines.append("    except BaseException as _exc:")
        lines.append("        return _unwind(_teardowns, None, _exc)")
        # Resumed innermost first, written out: :func:`_unwind` is only for what
        # goes wrong (its loop and a call cost as much as the resuming).
        for outer, (index, _) in reversed(list(enumerate(wrappers))):
            lines += [
                "    try:",
                f"        _w{index}.send(_result)",
                "    except StopIteration as _stop:",
                "        _result = _stop.value",
                "    except BaseException as _exc:",
                f"        return _unwind(_teardowns[:{outer}], None, _exc)",
                "    else:",
                f"        return _second_yield(_teardowns[:{outer}], _w{index})",
            ]
        lines.append("    return _result")
    else:
        lines += [f"    {line}" for line in body]
        lines.append("    return _result")
    exec("\n".join(lines), namespace)
    hook: Callable[..., Any] = namespace["hook"]
    return hook


def _unwind(
    teardowns: list[types.GeneratorType[None, Any, Any]],
    result: Any,
    exception: BaseException | None,
) -> Any:
    """Resume the ``wrapper=True`` generators, innermost first, as pluggy does."""
    for position in range(len(teardowns) - 1, -1, -1):
        teardown = teardowns[position]
        try:
            if exception is not None:
                teardown.throw(exception)
            else:
                teardown.send(result)
        except StopIteration as stop:
            result, exception = stop.value, None
            continue
        except BaseException as exc:
            exception = exc
            continue
        return _second_yield(teardowns[:position], teardown)
    if exception is not None:
        raise exception
    return result


def _second_yield(
    outer: list[types.GeneratorType[None, Any, Any]], teardown: types.GeneratorType[None, Any, Any]
) -> Any:
    """A wrapper yielded again: pluggy closes it and raises at once (the wrappers
    around it are not resumed), unless closing it raised: that goes on to them."""
    try:
        teardown.close()
    except BaseException as exc:
        return _unwind(outer, None, exc)
    raise RuntimeError(f"wrapper {teardown.__qualname__} has a second yield")


def _traced(caller: pluggy.HookCaller) -> Callable[..., Any] | None:
    return caller if caller.get_hookimpls() else None


def trace_hooks(pm: pluggy.PluginManager) -> None:
    """Log every hook call, its implementations and its outcome (``PRISM_TRACE_HOOKS=1``)."""

    def before(name: str, impls: Sequence[pluggy.HookImpl], kwargs: Mapping[str, Any]) -> None:
        trace_log.info("%s -> %s", name, ", ".join(impl.plugin_name for impl in impls))

    def after(
        outcome: pluggy.Result[Any],
        name: str,
        impls: Sequence[pluggy.HookImpl],
        kwargs: Mapping[str, Any],
    ) -> None:
        if outcome.exception is not None:
            trace_log.info("%s raised %s", name, type(outcome.exception).__name__)
        else:
            trace_log.info("%s returned %s", name, type(outcome.get_result()).__name__)

    pm.add_hookcall_monitoring(before, after)
