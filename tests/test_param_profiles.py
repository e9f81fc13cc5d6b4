"""Parameter profiles: the merge with a line's own rules, their checks, their registry."""

from __future__ import annotations

from typing import Any

import pluggy
import pytest

from prism_proxy import (
    PARAM_RULE_KEYS,
    Binding,
    CatalogKeys,
    ConfigError,
    ParamProfile,
    Provider,
    ProviderSpec,
    check_param_rules,
    config_from_mapping,
    hookimpl,
    line_params,
    normalise_params,
)
from prism_proxy.catalog import Catalog, load_catalog
from prism_proxy.plugins import make_plugin_manager, param_profiles

REASONING = ParamProfile(
    drop=("temperature", "top_p", "logprobs"),
    rename={"max_tokens": "max_completion_tokens"},
    kinds={"openai"},
)
PROFILES = {"reasoning": REASONING, "anywhere": ParamProfile(drop=("seed",))}


def line(**options: Any) -> Binding:
    return Binding(provider="p", model="m", options=options)


def test_a_family_alone_gets_the_profile():
    assert line_params(line(family="reasoning"), PROFILES) == (
        ("temperature", "top_p", "logprobs"),
        {"max_tokens": "max_completion_tokens"},
    )


def test_without_a_family_or_profiles_only_the_line_applies():
    own = {"drop_params": ["top_k"], "rename_params": {"stop": "stop_sequences"}}
    assert line_params(line(**own), PROFILES) == (("top_k",), {"stop": "stop_sequences"})
    # Without profiles (the old signature) a family adds nothing.
    assert line_params(line(family="reasoning", **own)) == (("top_k",), {"stop": "stop_sequences"})


def test_the_lines_drops_are_added_once():
    drop, rename = line_params(line(family="reasoning", drop_params=["seed", "top_p"]), PROFILES)
    assert drop == ("temperature", "top_p", "logprobs", "seed")
    assert rename == {"max_tokens": "max_completion_tokens"}


def test_the_lines_rename_of_the_same_parameter_wins():
    drop, rename = line_params(
        line(family="reasoning", rename_params={"max_tokens": "max_output_tokens", "n": "k"}),
        PROFILES,
    )
    assert rename == {"max_tokens": "max_output_tokens", "n": "k"}
    assert drop == ("temperature", "top_p", "logprobs")


def test_a_parameter_the_line_renames_is_no_longer_dropped():
    drop, rename = line_params(
        line(family="reasoning", rename_params={"top_p": "nucleus"}), PROFILES
    )
    assert drop == ("temperature", "logprobs")
    body = {"top_p": 0.5, "temperature": 0.1, "max_tokens": 9}
    assert normalise_params(body, drop, rename) == [
        "dropped temperature",
        "renamed max_tokens to max_completion_tokens",
        "renamed top_p to nucleus",
    ]
    assert body == {"nucleus": 0.5, "max_completion_tokens": 9}


def test_a_parameter_the_line_drops_is_no_longer_renamed():
    drop, rename = line_params(line(family="reasoning", drop_params=["max_tokens"]), PROFILES)
    assert "max_tokens" in drop and rename == {}


def test_the_profile_is_not_changed_by_a_merge():
    line_params(line(family="reasoning", rename_params={"max_tokens": "x"}), PROFILES)
    assert REASONING.rename == {"max_tokens": "max_completion_tokens"}


@pytest.mark.parametrize(
    "bad",
    [
        {"drop": "temperature"},
        {"drop": ["temperature", ""]},
        {"drop": [1]},
        {"rename": {"max_tokens": ""}},
        {"rename": {"max_tokens": 3}},
    ],
)
def test_a_malformed_profile_is_refused_when_built(bad):
    with pytest.raises(TypeError):
        ParamProfile(**bad)


def test_a_profile_is_immutable():
    profile = ParamProfile(drop=["a", "a", "b"], rename={"x": "y"}, kinds="openai")
    assert profile.drop == ("a", "b") and profile.kinds == frozenset({"openai"})
    with pytest.raises(TypeError):
        profile.rename["x"] = "z"  # type: ignore[index]


class Adjusting(Provider):
    async def send(self, call, binding, endpoint, body):  # pragma: no cover - never sent
        raise NotImplementedError


def provider(profiles=PROFILES) -> Provider:
    made = Adjusting(ProviderSpec(name="p", kind="openai", options={}, source="<test>"))
    made.param_profiles = profiles
    return made


def test_a_provider_resolves_each_line_once():
    upstream = provider()
    binding = line(family="reasoning", drop_params=["seed"])
    first = upstream.line_params(binding)
    assert upstream.line_params(binding) is first
    assert first[0] == ("temperature", "top_p", "logprobs", "seed")
    # An equal but distinct line is resolved for itself.
    other = line(family="reasoning")
    assert upstream.line_params(other) is not first
    assert upstream.line_params(other)[0] == ("temperature", "top_p", "logprobs")
    body = {"temperature": 1, "seed": 3, "max_tokens": 5, "n": 2}
    assert upstream.adjust(binding, body) == [
        "dropped temperature",
        "dropped seed",
        "renamed max_tokens to max_completion_tokens",
    ]
    assert body == {"max_completion_tokens": 5, "n": 2}


def test_the_cache_is_bounded(monkeypatch):
    import prism_proxy.providers as providers

    monkeypatch.setattr(providers, "_LINE_PARAMS_CACHE", 3)
    upstream = provider()
    lines = [line(family="reasoning") for _ in range(10)]
    for binding in lines:
        upstream.line_params(binding)
    assert len(upstream._line_params) <= 3
    assert upstream.line_params(lines[0])[0] == ("temperature", "top_p", "logprobs")


def catalog(*lines: dict[str, Any], kind: str = "openai") -> Catalog:
    return load_catalog(
        None,
        data={
            "providers": {"p": {"kind": kind}},
            "models": {"m": {"chain": [{"provider": "p", "model": "up", **x} for x in lines]}},
        },
        kinds=[kind],
        extra_keys=[CatalogKeys(binding=PARAM_RULE_KEYS)],
    )


def test_check_accepts_known_families():
    check_param_rules(
        catalog({}, {"family": "reasoning"}, {"family": "anywhere"}), "openai", PROFILES
    )


@pytest.mark.parametrize(
    ("family", "problem"),
    [
        ("reasonning", "unknown family 'reasonning'"),
        (["reasoning"], "expected a family name"),
    ],
)
def test_check_refuses_an_unknown_family_listing_the_known(family, problem):
    with pytest.raises(ConfigError) as info:
        check_param_rules(catalog({}, {"family": family}), "openai", PROFILES)
    assert info.value.key == "models.m.chain[1].family"
    assert problem in info.value.problem
    assert "known families for provider kind 'openai': anywhere, reasoning" in info.value.problem


def test_check_refuses_a_family_of_another_kind():
    with pytest.raises(ConfigError) as info:
        check_param_rules(catalog({"family": "reasoning"}, kind="other"), "other", PROFILES)
    assert info.value.key == "models.m.chain[0].family"
    assert "family 'reasoning' is for provider kind openai, not 'other'" in info.value.problem
    assert "known families for provider kind 'other': anywhere" in info.value.problem


def test_check_without_profiles_knows_none():
    with pytest.raises(ConfigError) as info:
        check_param_rules(catalog({"family": "reasoning"}), "openai")
    assert "known families for provider kind 'openai': none" in info.value.problem


def test_check_covers_the_lines_plugins_add():
    cat = catalog({})
    extra = ("models.m.rules[0].chain[1]", Binding("p", "o3", {"family": "nope"}))
    with pytest.raises(ConfigError) as info:
        check_param_rules(cat, "openai", PROFILES, [extra])
    assert info.value.key == "models.m.rules[0].chain[1].family"
    # Lines of another kind, or of an unknown provider, are not this plugin's to check.
    check_param_rules(cat, "other", PROFILES, [extra])
    check_param_rules(cat, "openai", PROFILES, [("x", Binding("gone", "o3", {"family": 1}))])


class Ships:
    def __init__(self, profiles: Any) -> None:
        self.profiles = profiles

    @hookimpl
    def prism_param_profiles(self):
        return self.profiles


def manager(*plugins: tuple[object, str]) -> tuple[Any, pluggy.PluginManager]:
    config = config_from_mapping({}, source="<test config>", catalog_data={"models": {}})
    return config, make_plugin_manager(config, extra_plugins=plugins, load_entrypoints=False)


def test_profiles_of_several_plugins_are_gathered():
    config, pm = manager(
        (Ships({"a": ParamProfile(drop=("x",))}), "one"),
        (Ships(None), "quiet"),
        (Ships({"b": ParamProfile()}), "two"),
    )
    assert sorted(param_profiles(config, pm)) == ["a", "b"]


def test_one_family_from_two_plugins_is_an_error_naming_both():
    config, pm = manager(
        (Ships({"same": ParamProfile()}), "first-plugin"),
        (Ships({"same": ParamProfile(drop=("x",))}), "second-plugin"),
    )
    with pytest.raises(ConfigError) as info:
        param_profiles(config, pm)
    assert "'first-plugin' and 'second-plugin' both register" in info.value.problem
    assert "'same'" in info.value.problem


@pytest.mark.parametrize(
    "answer", [["a"], {"a": {"drop": ["x"]}}, {"": ParamProfile()}, {1: ParamProfile()}]
)
def test_a_malformed_answer_names_the_plugin(answer):
    config, pm = manager((Ships(answer), "sloppy"))
    with pytest.raises(ConfigError) as info:
        param_profiles(config, pm)
    assert info.value.key == "plugin sloppy"
