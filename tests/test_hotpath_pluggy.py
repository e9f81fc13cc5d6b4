"""The hot path's compiled hook callers are pluggy's, proved on random mixes.

For random sets of implementations (plain, ``tryfirst``, ``trylast``,
``wrapper=True``, old-style ``hookwrapper``; answering, passing with None,
raising; wrappers that rescue, rewrap, re-raise, fail to yield or yield twice),
registered, unregistered and registered again in random orders, on random
specs and on the eight per-call specs of ``hookspecs.py`` as ``Hooks`` calls
them, the compiled caller calls the same implementations with the same
arguments in the same order and ends as ``pm.hook.<name>(**kwargs)`` does:
the same result, or an exception of the same type and arguments.
"""

from __future__ import annotations

import inspect
import types
from collections.abc import Callable, Generator
from typing import Any

import pluggy
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from prism_proxy import hookimpl, hookspecs
from prism_proxy.hotpath import Hooks, direct_caller

#: The per-call hooks the hot path compiles: ``Hooks.x`` calls ``prism_x``.
PER_CALL = [f"prism_{name}" for name in Hooks.__slots__]
ARGS = ("call", "model", "attempt", "result")


class Abort(BaseException):
    """Not an Exception: wrappers catching ``Exception`` must let it through."""


#: What an implementation may raise (StopIteration: PEP 479 turns it into a
#: RuntimeError inside a wrapper's generator, which pluggy unwraps).
RAISED = {"value": ValueError, "lookup": LookupError, "stop": StopIteration, "abort": Abort}

# A plain implementation: what it answers.
plain_acts = st.one_of(
    st.just(("none",)),
    st.just(("answer",)),
    st.tuples(st.just("raise"), st.sampled_from(sorted(RAISED))),
)
# A wrapper=True one: what it does before its yield, then after it.
wrapper_before = st.sampled_from(["yield", "yield", "yield", "raise", "no-yield"])
wrapper_after = st.one_of(
    st.sampled_from(["pass", "rewrap", "rescue", "rescue-value", "second-yield", "reraise"]),
    st.tuples(st.just("raise"), st.sampled_from(sorted(RAISED))),
)
# An old-style hookwrapper: what it does with the outcome.
old_acts = st.sampled_from(["look", "force-result", "force-exception"])


@st.composite
def implementation(draw: st.DrawFn, spec_args: tuple[str, ...]) -> dict[str, Any]:
    kind = draw(st.sampled_from(["plain", "plain", "plain", "wrapper", "wrapper", "hookwrapper"]))
    names = draw(st.permutations(spec_args))
    names = names[: draw(st.integers(0, len(names)))]
    impl: dict[str, Any] = {
        "kind": kind,
        "args": tuple(names),
        # An argument with a default: pluggy passes it by keyword (the compiled path declines).
        "default": bool(names) and draw(st.integers(0, 19)) == 0,
        "order": draw(st.sampled_from(["", "", "tryfirst", "trylast"])),
    }
    if kind == "plain":
        impl["act"] = draw(plain_acts)
    elif kind == "wrapper":
        impl["act"] = (draw(wrapper_before), draw(wrapper_after))
    else:
        impl["act"] = draw(old_acts)
    return impl


@st.composite
def plans(draw: st.DrawFn) -> dict[str, Any]:
    real = draw(st.sampled_from([None, *PER_CALL]))
    if real is None:
        args = tuple(draw(st.permutations(ARGS))[: draw(st.integers(0, len(ARGS)))])
        firstresult = draw(st.booleans())
    else:
        args = tuple(inspect.signature(getattr(hookspecs, real)).parameters)
        firstresult = None
    impls = draw(st.lists(implementation(args), max_size=7))
    if not draw(st.integers(0, 9)):  # now and then, plain ones only
        impls = [impl for impl in impls if impl["kind"] == "plain"] or impls
    # Which to unregister after registering them all, and which of those come back.
    gone = draw(st.lists(st.sampled_from(range(len(impls))), unique=True)) if impls else []
    back = draw(st.lists(st.sampled_from(gone), unique=True)) if gone else []
    values = {arg: draw(st.sampled_from([1, "x", None])) for arg in args}
    return {
        "real": real,
        "args": args,
        "firstresult": firstresult,
        "impls": impls,
        "gone": gone,
        "back": back,
        "kwargs": values,
    }


def _manager(real: str | None, args: tuple[str, ...], firstresult: bool) -> pluggy.PluginManager:
    if real is not None:
        pm = pluggy.PluginManager("prism_proxy")
        pm.add_hookspecs(hookspecs)
        return pm
    marker = pluggy.HookspecMarker("demo")
    specs = types.ModuleType("demo_specs")
    specs.demo = marker(firstresult=firstresult)(_function("demo", args, "pass"))
    pm = pluggy.PluginManager("demo")
    pm.add_hookspecs(specs)
    return pm


def _function(
    name: str, args: tuple[str, ...], body: str, default: bool = False, **env: Any
) -> Any:
    """A function with exactly these parameters (pluggy reads them off its code)."""
    params = [*args[:-1], f"{args[-1]}=None"] if default else list(args)
    namespace = dict(env)
    exec(f"def {name}({', '.join(params)}):\n    {body}", namespace)
    return namespace[name]


def _exc(exc: BaseException | None) -> tuple[Any, ...] | None:
    return None if exc is None else (type(exc), exc.args)


def _build(index: int, impl: dict[str, Any], hook: str, log: list[Any], marker: Any) -> Any:
    """One plugin (a module) whose only hook does what ``impl`` says, logging it."""
    tag = f"impl{index}"
    act = impl["act"]

    def raised(what: str) -> BaseException:
        return RAISED[what](f"{tag} {what}")

    def plain(**kwargs: Any) -> Any:
        log.append((tag, "called", sorted(kwargs.items())))
        if act[0] == "raise":
            raise raised(act[1])
        return (tag, "answer") if act[0] == "answer" else None

    def wrapper(**kwargs: Any) -> Generator[None, Any, Any]:
        log.append((tag, "in", sorted(kwargs.items())))
        before, after = act
        if before == "raise":
            raise raised("value")
        if before == "no-yield":
            return None
        try:
            result = yield
        except GeneratorExit:
            # Closed unresumed (a wrapper inside it yielded twice), whenever the
            # garbage collector gets to it: no trace in this call's log.
            raise
        except BaseException as exc:
            log.append((tag, "saw", _exc(exc)))
            if after == "rescue":
                return (tag, "rescued")
            if after == "rescue-value" and isinstance(exc, ValueError):
                return (tag, "rescued value")
            if after == "second-yield":
                yield
            if isinstance(after, tuple):
                raise raised(after[1]) from exc
            raise
        log.append((tag, "out", result))
        if after == "second-yield":
            yield
        if isinstance(after, tuple):
            raise raised(after[1])
        return (tag, result) if after == "rewrap" else result

    def old_style(**kwargs: Any) -> Generator[None, Any, None]:
        log.append((tag, "in", sorted(kwargs.items())))
        outcome = yield
        if isinstance(outcome.exception, GeneratorExit):
            return  # closed unresumed, as above
        log.append((tag, "saw", _exc(outcome.exception)))
        if act == "force-result":
            outcome.force_result((tag, "forced"))
        elif act == "force-exception":
            outcome.force_exception(LookupError(f"{tag} forced"))

    kwargs = ", ".join(f"{name}={name}" for name in impl["args"])
    if impl["kind"] == "plain":
        function = _function(
            "hook", impl["args"], f"return _run({kwargs})", impl["default"], _run=plain
        )
    else:
        run = wrapper if impl["kind"] == "wrapper" else old_style
        function = _function(
            "hook", impl["args"], f"return (yield from _run({kwargs}))", impl["default"], _run=run
        )
    opts = {impl["order"]: True} if impl["order"] else {}
    if impl["kind"] != "plain":
        opts[impl["kind"]] = True
    plugin = types.ModuleType(tag)
    setattr(plugin, hook, marker(**opts)(function))
    return plugin


def _outcome(call: Callable[[], Any]) -> tuple[str, Any]:
    try:
        return ("returned", call())
    except BaseException as exc:  # every ending is compared
        return ("raised", _exc(exc))


@settings(
    max_examples=600,
    deadline=None,
    derandomize=True,
    database=None,
    suppress_health_check=[HealthCheck.too_slow],
)
@given(plan=plans())
def test_compiled_callers_call_what_pluggy_calls_in_its_order_and_end_alike(plan):
    real, impls = plan["real"], plan["impls"]
    name = real or "demo"
    pm = _manager(real, plan["args"], bool(plan["firstresult"]))
    marker = hookimpl if real else pluggy.HookimplMarker("demo")
    log: list[Any] = []
    plugins = [_build(index, impl, name, log, marker) for index, impl in enumerate(impls)]
    for index, plugin in enumerate(plugins):
        pm.register(plugin, f"impl{index}")
    for index in plan["gone"]:
        pm.unregister(name=f"impl{index}")
    for index in plan["back"]:
        pm.register(plugins[index], f"impl{index}")
    present = [impl for i, impl in enumerate(impls) if i not in plan["gone"] or i in plan["back"]]
    caller = getattr(pm.hook, name)
    if real is None:
        compiled = direct_caller(caller)
    elif real == "prism_classify" and not present:
        with pytest.raises(RuntimeError, match="no implementation"):
            Hooks.of(pm)  # the core's default classifier is missing
        return
    else:
        if real != "prism_classify":
            # Hooks needs an answering classify (the core's); a plugin stands in.
            classify = types.ModuleType("classify")
            classify.prism_classify = hookimpl(trylast=True)(lambda: "verdict")
            pm.register(classify, "classify")
        compiled = getattr(Hooks.of(pm), real.removeprefix("prism_"))
    if not present:
        assert compiled is None  # a hook nobody implements is skipped outright
        return
    declines = any(impl["kind"] == "hookwrapper" or impl["default"] for impl in present)
    # The compiled path is taken unless pluggy's own caller is needed: this test
    # does not pass by comparing pluggy with itself.
    assert (compiled is caller) == declines
    expected = _outcome(lambda: caller(**plan["kwargs"]))
    through_pluggy = list(log)
    log.clear()
    got = _outcome(lambda: compiled(**plan["kwargs"]))
    assert (got, log) == (expected, through_pluggy)


class Tally:
    """A plugin whose per-call hooks take no arguments: counting needs none."""

    def __init__(self) -> None:
        self.seen: list[str] = []

    @hookimpl
    def prism_call_start(self):
        self.seen.append("call")

    @hookimpl
    def prism_attempt_start(self):
        self.seen.append("attempt")

    @hookimpl
    def prism_settle(self):
        self.seen.append("settled")


async def test_hooks_implemented_without_arguments_are_called_on_every_call(
    prism_gateway, prism_fake
):
    catalog = {
        "providers": {"up": {"kind": "openai", "base_url": prism_fake.base_url("ok")}},
        "models": {"m": {"chain": [{"provider": "up", "model": "up-m"}]}},
    }
    tally = Tally()
    gw = await prism_gateway(catalog, plugins=[(tally, "tally")], load_plugins=["openai"])
    client = gw.openai()
    for _ in range(2):
        answer = await client.chat.completions.create(
            model="m", messages=[{"role": "user", "content": "hi"}]
        )
        assert answer.choices[0].message.content
    assert tally.seen == ["call", "attempt", "settled"] * 2


def test_a_list_not_laid_out_as_pluggy_keeps_it_goes_through_pluggy():
    """The compiled order reads pluggy's list from its end, as pluggy's source says
    it keeps it; a pluggy keeping it otherwise gets its own caller back."""
    spec = pluggy.HookspecMarker("demo")
    impl = pluggy.HookimplMarker("demo")
    specs = types.ModuleType("demo_specs")
    specs.demo = spec(_function("demo", ("call",), "pass"))
    pm = pluggy.PluginManager("demo")
    pm.add_hookspecs(specs)
    for index, opts in enumerate([{}, {"wrapper": True}, {"tryfirst": True}]):
        plugin = types.ModuleType(f"p{index}")
        body = "return (yield call)" if opts.get("wrapper") else "return call"
        plugin.demo = impl(**opts)(_function("hook", ("call",), body))
        pm.register(plugin)
    caller = pm.hook.demo
    as_kept = types.SimpleNamespace(spec=caller.spec, get_hookimpls=caller.get_hookimpls)
    assert direct_caller(as_kept) is not as_kept
    for shuffled in ([1, 0, 2], [2, 0, 1], [0, 2, 1]):
        impls = caller.get_hookimpls()
        odd = types.SimpleNamespace(
            spec=caller.spec, get_hookimpls=lambda impls=impls, s=shuffled: [impls[i] for i in s]
        )
        assert direct_caller(odd) is odd


def test_a_caller_typed_in_another_mode_than_its_spec_is_refused():
    """Hooks types each hook from its spec; a first-result caller over a fan-out
    spec (or the reverse) would hand a list where one answer is typed."""
    from prism_proxy.hotpath import fan_out, first_result

    pm = pluggy.PluginManager("prism_proxy")
    pm.add_hookspecs(hookspecs)
    with pytest.raises(RuntimeError, match="prism_settle is not firstresult"):
        first_result(pm, hookspecs.prism_settle, direct_caller)
    with pytest.raises(RuntimeError, match="prism_classify is firstresult"):
        fan_out(pm, hookspecs.prism_classify, direct_caller)
    assert first_result(pm, hookspecs.prism_classify, direct_caller) is None  # none implement it
