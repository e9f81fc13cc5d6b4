"""Plugin discovery, disable, required_plugins and hook validation."""

from __future__ import annotations

import subprocess
import sys

import pytest

from prism_proxy import ConfigError, config_from_mapping, create_app, hookimpl

CATALOG = {
    "providers": {"alpha": {"kind": "openai", "base_url": "http://127.0.0.1:1/v1"}},
    "models": {"m": {"chain": [{"provider": "alpha", "model": "x"}]}},
}


def config(**core: object):
    return config_from_mapping(core, catalog_data=CATALOG, source="prism.ini")


def test_installed_provider_plugin_is_loaded_through_its_entry_point():
    app = create_app(config())
    from prism_proxy import GATEWAY

    generation = app[GATEWAY].current
    assert generation.pm.has_plugin("openai")
    assert type(generation.providers["alpha"]).__name__ == "OpenAIProvider"


def test_disable_blocks_a_plugin_before_it_loads():
    with pytest.raises(ConfigError, match="unknown provider kind 'openai'"):
        create_app(config(disable="openai"))


def test_required_plugin_missing_stops_start_up():
    with pytest.raises(
        ConfigError,
        match=r"required_plugins: plugin 'no-such-plugin' is required but not installed",
    ):
        create_app(config(required_plugins="openai, no-such-plugin"))


def test_required_plugin_that_is_disabled_is_named_as_such():
    with pytest.raises(ConfigError, match="required but disabled"):
        create_app(config(required_plugins="openai", disable="openai"))


class Misspelled:
    @hookimpl
    def prism_setle(self, call):
        return None


def test_hook_implementation_matching_no_spec_is_rejected():
    with pytest.raises(ConfigError, match="prism_setle"):
        create_app(config(), plugins=[(Misspelled(), "typo")])


def test_disable_also_applies_to_directly_registered_plugins():
    create_app(config(disable="typo"), plugins=[(Misspelled(), "typo")])


def test_prism_plugins_lists_where_each_plugin_came_from(tmp_path):
    result = subprocess.run(
        [sys.executable, "-m", "prism_proxy.cli", "plugins"],
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert result.returncode == 0, result.stderr
    line = next(line for line in result.stdout.splitlines() if line.startswith("openai "))
    assert "prism-openai" in line
    assert "prism_openai" in line and "plugin.py" in line
    assert any(line.startswith("prism.defaults ") for line in result.stdout.splitlines())


def test_hot_path_hooks_behave_as_pluggy_would_whether_called_directly_or_not():
    import pluggy

    from prism_proxy.hotpath import direct_caller

    spec = pluggy.HookspecMarker("demo")
    impl = pluggy.HookimplMarker("demo")

    class Specs:
        @spec(firstresult=True)
        def pick(self, call, model): ...

        @spec
        def seen(self, call, attempt): ...

    class OnlyCall:  # implementations may take a subset of the arguments
        @impl
        def pick(self, call):
            return f"picked {call}"

        @impl
        def seen(self, attempt):
            return None if attempt == "quiet" else attempt

    class Wrapper:
        @impl(wrapper=True)
        def pick(self, call, model):
            result = yield
            return result.upper()

    pm = pluggy.PluginManager("demo")
    pm.add_hookspecs(Specs)
    assert direct_caller(pm.hook.pick) is None  # nobody implements it: skipped outright
    pm.register(OnlyCall())
    pick, seen = direct_caller(pm.hook.pick), direct_caller(pm.hook.seen)
    assert pick is not pm.hook.pick and seen is not pm.hook.seen
    assert pick(call=1, model=2) == pm.hook.pick(call=1, model=2) == "picked 1"
    assert seen(call=1, attempt="loud") == pm.hook.seen(call=1, attempt="loud") == ["loud"]
    assert seen(call=1, attempt="quiet") == pm.hook.seen(call=1, attempt="quiet") == []
    pm.register(Wrapper())
    pick = direct_caller(pm.hook.pick)
    assert pick is not pm.hook.pick  # a wrapper=True generator is run directly too
    assert pick(call=1, model=2) == pm.hook.pick(call=1, model=2) == "PICKED 1"

    class OldStyle:
        @impl(hookwrapper=True)
        def seen(self, call, attempt):
            yield

    pm.register(OldStyle())
    assert direct_caller(pm.hook.seen) is pm.hook.seen  # an old-style hookwrapper needs pluggy


def test_a_direct_call_passes_every_implementation_its_own_arguments():
    """A hook argument named like a result (``prism_classify``'s ``result``) reaches
    each implementation as the caller sent it, whatever the ones before returned."""
    import pluggy

    from prism_proxy.hotpath import direct_caller

    spec = pluggy.HookspecMarker("demo")
    impl = pluggy.HookimplMarker("demo")

    class Specs:
        @spec(firstresult=True)
        def judge(self, call, attempt, result): ...

        @spec
        def note(self, call, result): ...

    class Late:
        @impl
        def judge(self, result, call):
            return f"late {result} {call}"

        @impl
        def note(self, result):
            return f"late {result}"

    class Early:
        @impl
        def judge(self, attempt):
            return None  # passes

        @impl
        def note(self, call, result):
            return f"early {call} {result}"

    pm = pluggy.PluginManager("demo")
    pm.add_hookspecs(Specs)
    pm.register(Late())
    pm.register(Early())
    judge, note = direct_caller(pm.hook.judge), direct_caller(pm.hook.note)
    assert judge is not pm.hook.judge and note is not pm.hook.note
    kwargs = {"call": 1, "attempt": 2, "result": "r"}
    assert judge(**kwargs) == pm.hook.judge(**kwargs) == "late r 1"
    assert note(call=1, result="r") == pm.hook.note(call=1, result="r") == ["early 1 r", "late r"]


def test_wrappers_called_directly_see_results_and_exceptions_as_under_pluggy():
    import pluggy
    import pytest

    from prism_proxy.hotpath import direct_caller

    spec = pluggy.HookspecMarker("demo")
    impl = pluggy.HookimplMarker("demo")
    log: list[str] = []

    class Specs:
        @spec(firstresult=True)
        def pick(self, call): ...

        @spec
        def seen(self, attempt): ...

    class Plain:
        @impl
        def pick(self, call):
            log.append("plain")
            if call == "boom":
                raise ValueError("boom")
            return call

        @impl
        def seen(self, attempt):
            log.append("plain")
            return attempt

    class Outer:
        @impl(wrapper=True, tryfirst=True)
        def pick(self, call):
            log.append("outer in")
            try:
                result = yield
            except ValueError:
                log.append("outer caught")
                return "rescued"
            log.append("outer out")
            return f"<{result}>"

        @impl(wrapper=True)
        def seen(self, attempt):
            results = yield
            return [*results, "outer"]

    class Inner:
        @impl(wrapper=True)
        def pick(self, call):
            log.append("inner in")
            result = yield
            log.append("inner out")
            if call == "inner-raises":
                raise KeyError("inner")
            return result * 2

    pm = pluggy.PluginManager("demo")
    pm.add_hookspecs(Specs)
    for plugin in (Plain(), Outer(), Inner()):
        pm.register(plugin)
    pick, seen = direct_caller(pm.hook.pick), direct_caller(pm.hook.seen)
    assert pick is not pm.hook.pick and seen is not pm.hook.seen
    for call in ("x", "boom"):
        answers = []
        for caller in (pick, pm.hook.pick):
            log.clear()
            answers.append((caller(call=call), list(log)))
        assert answers[0] == answers[1]
    assert answers[0] == ("rescued", ["outer in", "inner in", "plain", "outer caught"])
    assert pick(call="x") == "<xx>"
    assert seen(attempt=3) == pm.hook.seen(attempt=3) == [3, "outer"]
    for caller in (pick, pm.hook.pick):
        with pytest.raises(KeyError, match="inner"):
            caller(call="inner-raises")  # Outer catches ValueError only: KeyError goes on
    with pytest.raises(TypeError, match="'call'"):
        pick(attempt=1)  # a caller that leaves out an argument an implementation takes
    assert pick(call="y", attempt=1) == "<yy>"  # arguments no implementation takes are ignored

    class NoYield:
        @impl(wrapper=True)
        def seen(self, attempt):
            return
            yield

    pm.register(NoYield())
    with pytest.raises(RuntimeError, match="did not yield"):
        direct_caller(pm.hook.seen)(attempt=1)


def test_several_plain_implementations_are_called_in_pluggys_order():
    import pluggy

    from prism_proxy.hotpath import direct_caller

    spec = pluggy.HookspecMarker("demo")
    impl = pluggy.HookimplMarker("demo")
    calls: list[str] = []

    class Specs:
        @spec(firstresult=True)
        def pick(self, call): ...

        @spec
        def seen(self, attempt): ...

    def plugin(name: str, answer: object, **opts: bool) -> object:
        class Plugin:
            @impl(**opts)
            def pick(self, call):
                calls.append(name)
                return answer

            @impl(**opts)
            def seen(self, attempt):
                calls.append(name)
                return answer

        return Plugin()

    pm = pluggy.PluginManager("demo")
    pm.add_hookspecs(Specs)
    for p in (
        plugin("last", "from last", trylast=True),
        plugin("early", None),
        plugin("late", "from late"),
        plugin("first", None, tryfirst=True),
    ):
        pm.register(p)
    pick, seen = direct_caller(pm.hook.pick), direct_caller(pm.hook.seen)
    for call in (pick, pm.hook.pick):
        calls.clear()
        assert call(call=1) == "from late"
        assert calls == ["first", "late"]  # the first answer stops a firstresult hook
    expected = pm.hook.seen(attempt=1)
    order = list(calls)
    calls.clear()
    assert seen(attempt=1) == expected == ["from late", "from last"]
    assert calls == order[-4:] == ["first", "late", "early", "last"]

    class Boom:
        @impl
        def seen(self, attempt):
            raise RuntimeError("boom")

    pm.register(Boom())
    import pytest

    with pytest.raises(RuntimeError, match="boom"):
        direct_caller(pm.hook.seen)(attempt=1)


def test_wrappers_that_fail_on_the_way_out_end_as_in_pluggy():
    """A teardown that raises or yields twice: the wrappers around it see what pluggy's would."""
    import pluggy
    import pytest

    from prism_proxy.hotpath import direct_caller

    spec = pluggy.HookspecMarker("demo")
    impl = pluggy.HookimplMarker("demo")
    seen: list[str] = []

    class Specs:
        @spec(firstresult=True)
        def pick(self, call): ...

    class Plain:
        @impl
        def pick(self, call):
            return call

    class Outer:
        @impl(wrapper=True, tryfirst=True)
        def pick(self, call):
            try:
                result = yield
            except ValueError as exc:
                seen.append(f"outer caught {exc}")
                return "rescued"
            except RuntimeError as exc:
                seen.append(f"outer caught {exc}")
                raise
            return f"<{result}>"

    class Middle:
        @impl(wrapper=True)
        def pick(self, call):
            result = yield
            if call == "raise":
                raise ValueError("middle failed")
            if call == "twice":
                yield
            return result

    class Inner:
        @impl(wrapper=True, trylast=True)
        def pick(self, call):
            result = yield
            return result * 2

    pm = pluggy.PluginManager("demo")
    pm.add_hookspecs(Specs)
    for plugin in (Plain(), Outer(), Middle(), Inner()):
        pm.register(plugin)
    pick = direct_caller(pm.hook.pick)
    assert pick is not pm.hook.pick
    for caller in (pick, pm.hook.pick):
        seen.clear()
        assert caller(call="ab") == "<abab>"
        assert caller(call="raise") == "rescued"
        assert seen == ["outer caught middle failed"]
        seen.clear()
        with pytest.raises(RuntimeError, match="second yield"):
            caller(call="twice")
        assert seen == []  # raised at once: the wrappers around it are not resumed
