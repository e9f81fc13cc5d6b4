"""The per-call hooks as the hot path calls them: pluggy's implementations, typed by hookspecs.py.

pluggy's general machinery (argument checks, wrappers, result lists) costs
more than a typical implementation.  A hook nobody implements is None, so
the hot path skips it; any other hook gets a caller compiled from its spec in
``hookspecs.py`` (the spec's arguments are the caller's, its ``firstresult``
is the caller's mode) that calls the implementations pluggy holds, in pluggy's
order, with the same results, exceptions and ``wrapper=True`` protocol.  What
the compiled caller does not reproduce goes through pluggy: an old-style
``hookwrapper``, an implementation or spec argument with a default, a hook
without a spec, and implementations not laid out as pluggy documents in its
source (``HookCaller._hookimpls``: plain ones, then wrappers, each trylast,
plain, tryfirst, called from the end).  ``tests/test_hotpath_pluggy.py``
checks, for random mixes of implementations, that both call the same
functions in the same order and end alike.  ``PRISM_TRACE_HOOKS=1`` sends
every call through pluggy with its call monitoring on, and logs each call
(``prism.hooks``).
"""

from __future__ import annotations

import logging
import types
from collections.abc import Callable, Mapping, Sequence
from typing import Any, Final, Never, NoReturn, ParamSpec, TypeAlias, TypeVar, overload

import pluggy

from . import hookspecs

__all__ = ["TRACE_ENV", "Hooks", "direct_caller", "trace_hooks"]

TRACE_ENV = "PRISM_TRACE_HOOKS"
trace_log = logging.getLogger("prism.hooks")

P = ParamSpec("P")
R = TypeVar("R")
#: How a hook's implementations are called: compiled, or pluggy's own caller (tracing).
Make = Callable[[pluggy.HookCaller], Callable[..., Any] | None]


class Hooks:
    """The hooks a call meets, typed by their specs; None where nobody implements one.

    Each attribute's signature is its spec's in ``hookspecs.py`` (mypy reads it
    from the spec function): a first-result hook returns the spec's answer, a
    fan-out hook the list of its implementations' non-None answers.  Call them
    with keywords, as pluggy requires.  ``classify`` is never None: the core's
    own default always answers.
    """

    __slots__ = (
        "admit_attempt",
        "admit_call",
        "attempt_start",
        "authenticate",
        "call_start",
        "classify",
        "lookup",
        "on_attempt",
        "select_route",
        "settle",
    )

    def __init__(self, pm: pluggy.PluginManager, *, trace: bool = False) -> None:
        make: Make = _traced if trace else direct_caller
        self.authenticate: Final = first_result(pm, hookspecs.prism_authenticate, make)
        self.call_start: Final = fan_out(pm, hookspecs.prism_call_start, make)
        self.select_route: Final = first_result(pm, hookspecs.prism_select_route, make)
        self.admit_call: Final = fan_out(pm, hookspecs.prism_admit_call, make)
        self.lookup: Final = first_result(pm, hookspecs.prism_lookup, make)
        self.admit_attempt: Final = first_result(pm, hookspecs.prism_admit_attempt, make)
        self.attempt_start: Final = fan_out(pm, hookspecs.prism_attempt_start, make)
        self.classify: Final = answered(pm, hookspecs.prism_classify, make)
        self.on_attempt: Final = fan_out(pm, hookspecs.prism_on_attempt, make)
        self.settle: Final = fan_out(pm, hookspecs.prism_settle, make)

    @classmethod
    def of(cls, pm: pluggy.PluginManager, *, trace: bool = False) -> Hooks:
        return cls(pm, trace=trace)


def first_result(
    pm: pluggy.PluginManager, spec: Callable[P, R], make: Make
) -> Callable[P, R] | None:
    """The caller of ``spec``'s hook, a ``firstresult`` one: its first non-None answer."""
    hook: Callable[P, R] | None = _hook(pm, spec, make, firstresult=True)
    return hook


@overload
def fan_out(
    pm: pluggy.PluginManager, spec: Callable[P, None], make: Make
) -> Callable[P, list[Never]] | None: ...


@overload
def fan_out(
    pm: pluggy.PluginManager, spec: Callable[P, R | None], make: Make
) -> Callable[P, list[R]] | None: ...


def fan_out(
    pm: pluggy.PluginManager, spec: Callable[P, R | None], make: Make
) -> Callable[P, list[R]] | None:
    """The caller of ``spec``'s fan-out hook: the list of its non-None answers
    (always empty for a hook whose spec returns None: it only tells)."""
    hook: Callable[P, list[R]] | None = _hook(pm, spec, make, firstresult=False)
    return hook


def answered(
    pm: pluggy.PluginManager, spec: Callable[P, R | None], make: Make
) -> Callable[P, R]:
    """A ``firstresult`` hook whose ``trylast`` default (the core's) always answers."""
    hook: Callable[P, R] | None = _hook(pm, spec, make, firstresult=True)
    if hook is None:
        raise RuntimeError(f"{spec.__name__} has no implementation: the core's default is missing")
    return hook


def _hook(
    pm: pluggy.PluginManager, spec: Callable[..., Any], make: Make, *, firstresult: bool
) -> Any:
    # The mode the caller's type promises must be the spec's: a mismatch would
    # hand a list where one answer is typed (or the reverse).
    name = spec.__name__
    caller: pluggy.HookCaller = getattr(pm.hook, name)
    if caller.spec is None or caller.spec.function is not spec:
        raise RuntimeError(f"{name}: the plugin manager's spec is not prism_proxy.hookspecs'")
    if bool(caller.spec.opts.get("firstresult")) != firstresult:
        raise RuntimeError(f"{name} is {'not ' if firstresult else ''}firstresult in hookspecs.py")
    return make(caller)


def direct_caller(caller: pluggy.HookCaller) -> Callable[..., Any] | None:
    """How the hot path calls a hook: None when nobody implements it; else the
    implementations themselves, in pluggy's order (wrappers outermost; tryfirst
    first, then the latest registered, trylast last), with pluggy's results
    (first non-None for a firstresult hook, else the list of non-None answers),
    its exceptions and its ``wrapper=True`` protocol; or, where that cannot be
    reproduced (see the module's docstring), pluggy's own caller.  The compiled
    caller's arguments are the spec's.  pluggy's call tracing does not see
    direct calls.
    """
    impls = caller.get_hookimpls()
    if not impls:
        return None
    spec = caller.spec
    if (
        spec is None
        or spec.kwargnames
        or any(impl.hookwrapper or impl.kwargnames for impl in impls)
        or not _pluggys_layout(impls)
        or any(name.startswith("_") for name in spec.argnames)  # would shadow ours
    ):
        return caller
    firstresult = bool(spec.opts.get("firstresult"))
    # pluggy calls the list from its end (wrappers, kept last, come first).
    ordered = [(impl.function, tuple(impl.argnames), impl.wrapper) for impl in reversed(impls)]
    return _compiled(tuple(spec.argnames), ordered, firstresult)


def _pluggys_layout(impls: Sequence[pluggy.HookImpl]) -> bool:
    """Whether ``impls`` is laid out as pluggy's ``HookCaller`` says it keeps them.

    pluggy's API documents the call order (latest registered first, tryfirst
    before, trylast after, wrappers around the rest) but not the list's; its
    source does: plain implementations then wrappers, each trylast, plain,
    tryfirst, called from the end.  A list in another shape is left to pluggy.
    """
    rank = [
        (impl.wrapper, 0 if impl.trylast else 2 if impl.tryfirst else 1) for impl in impls
    ]
    return rank == sorted(rank)


def _compiled(
    params: tuple[str, ...],
    ordered: Sequence[tuple[Callable[..., Any], tuple[str, ...], bool]],
    first: bool,
) -> Callable[..., Any]:
    """One function that calls each implementation with its own arguments, in order.

    Written out as source (as attrs and namedtuple do) so that a call costs
    what the implementations cost: no argument lists built per implementation.
    Its parameters are the spec's (valid identifiers, none starting with
    ``_``, which the function's own names do); arguments the spec does not
    name are ignored, as pluggy does.  ``wrapper=True`` generators run first
    and are resumed with the result (or the exception) last, as pluggy's
    multicall does (:func:`_unwind`).
    """
    namespace: dict[str, Any] = {
        "_unwind": _unwind,
        "_second_yield": _second_yield,
        "_wrapfail": _wrapfail,
    }
    # Required keywords: Python itself names one a caller left out, at no cost per call.
    # (A bare ``*`` needs a name after it: a spec without arguments has none.)
    signature = ", ".join(["*", *params, "**_others"] if params else ["**_others"])
    lines = [f"def hook({signature}):"]
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
            f"    _wrapfail(_w{index}, 'did not yield')",
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


# A string: the generator type cannot be subscripted at run time.
Teardown: TypeAlias = "types.GeneratorType[None, Any, Any]"


def _unwind(teardowns: list[Teardown], result: Any, exception: BaseException | None) -> Any:
    """Resume the ``wrapper=True`` generators, innermost first, as pluggy does."""
    for position in range(len(teardowns) - 1, -1, -1):
        teardown = teardowns[position]
        try:
            if exception is not None:
                try:
                    teardown.throw(exception)
                except RuntimeError as error:
                    # A StopIteration thrown into a generator comes out as a
                    # RuntimeError (PEP 479): pluggy closes that wrapper and
                    # goes on with the StopIteration itself.
                    if isinstance(exception, StopIteration) and error.__cause__ is exception:
                        teardown.close()
                        continue
                    raise
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


def _second_yield(outer: list[Teardown], teardown: Teardown) -> Any:
    """A wrapper yielded again: pluggy closes it and raises at once (the wrappers
    around it are not resumed), unless closing it raised: that goes on to them."""
    try:
        teardown.close()
    except BaseException as exc:
        return _unwind(outer, None, exc)
    _wrapfail(teardown, "has second yield")


def _wrapfail(teardown: Teardown, problem: str) -> NoReturn:
    # pluggy's words, so that a misbehaving wrapper reads alike either way.
    code = teardown.gi_code
    raise RuntimeError(
        f"wrap_controller at {code.co_name!r} {code.co_filename}:{code.co_firstlineno} {problem}"
    )


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
