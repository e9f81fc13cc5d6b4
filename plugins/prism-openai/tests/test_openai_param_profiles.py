"""The ``openai-reasoning`` parameter profile, through the real gateway and the fake upstream.

A line that says ``family = "openai-reasoning"`` gets the family's drops and
renames, named in ``x-prism-params-adjusted``; its own ``drop_params`` and
``rename_params`` override them; a family nobody ships stops start-up.
"""

from __future__ import annotations

from typing import Any

import pytest

from prism_proxy import ConfigError, ParamProfile, hookimpl

PLUGINS = ["openai"]
MESSAGES = [{"role": "user", "content": "Hi"}]
FAMILY = "openai-reasoning"


def catalog(fake, *lines: dict[str, Any]) -> dict[str, Any]:
    """Model ``m`` served by ``p/o3`` lines (the fake's scenario ``reasoning``)."""
    return {
        "providers": {"p": {"kind": "openai", "base_url": fake.base_url("reasoning")}},
        "models": {"m": {"chain": [{"provider": "p", "model": "o3", **line} for line in lines]}},
    }


async def ask(gw, **params: Any):
    return await gw.openai().chat.completions.with_raw_response.create(
        model="m", messages=MESSAGES, **params
    )


async def test_a_family_line_drops_the_sampling_parameters_and_renames_the_cap(
    prism_fake, prism_gateway
):
    gw = await prism_gateway(catalog(prism_fake, {"family": FAMILY}), load_plugins=PLUGINS)
    raw = await ask(
        gw,
        temperature=0.2,
        top_p=0.9,
        presence_penalty=0.1,
        frequency_penalty=0.1,
        logprobs=True,
        top_logprobs=2,
        logit_bias={"50256": -100},
        max_tokens=30,
        seed=7,
    )
    sent = prism_fake.requests("reasoning")[-1].body
    for name in (
        "temperature",
        "top_p",
        "presence_penalty",
        "frequency_penalty",
        "logprobs",
        "top_logprobs",
        "logit_bias",
        "max_tokens",
    ):
        assert name not in sent, name
    assert sent["max_completion_tokens"] == 30
    assert sent["seed"] == 7 and sent["model"] == "o3"
    assert raw.headers["x-prism-params-adjusted"] == (
        "dropped temperature; dropped top_p; dropped presence_penalty; "
        "dropped frequency_penalty; dropped logprobs; dropped top_logprobs; "
        "dropped logit_bias; renamed max_tokens to max_completion_tokens"
    )
    # Only what the request carried is touched and named; the next call
    # (the line's rules are resolved once) gets the same treatment.
    raw = await ask(gw, temperature=1.0, stream=False)
    assert "temperature" not in prism_fake.requests("reasoning")[-1].body
    assert raw.headers["x-prism-params-adjusted"] == "dropped temperature"
    raw = await ask(gw)
    assert "x-prism-params-adjusted" not in raw.headers


async def test_a_family_applies_to_streams(prism_fake, prism_gateway):
    gw = await prism_gateway(catalog(prism_fake, {"family": FAMILY}), load_plugins=PLUGINS)
    raw = await ask(gw, temperature=0.2, max_tokens=30, stream=True)
    async for _ in raw.parse():
        pass
    sent = prism_fake.requests("reasoning")[-1].body
    assert "temperature" not in sent and sent["max_completion_tokens"] == 30
    assert raw.headers["x-prism-params-adjusted"] == (
        "dropped temperature; renamed max_tokens to max_completion_tokens"
    )


async def test_the_lines_own_rules_override_and_extend_the_family(prism_fake, prism_gateway):
    line = {
        "family": FAMILY,
        "drop_params": ["seed"],
        "rename_params": {"max_tokens": "max_output_tokens", "top_p": "nucleus"},
    }
    gw = await prism_gateway(catalog(prism_fake, line), load_plugins=PLUGINS)
    raw = await ask(gw, temperature=0.2, top_p=0.5, max_tokens=30, seed=7)
    sent = prism_fake.requests("reasoning")[-1].body
    assert "temperature" not in sent and "seed" not in sent
    # The line's rename of max_tokens wins; top_p, which the family drops, the
    # line renames, so it goes out under its new name.
    assert sent["max_output_tokens"] == 30 and "max_completion_tokens" not in sent
    assert sent["nucleus"] == 0.5 and "top_p" not in sent
    assert raw.headers["x-prism-params-adjusted"] == (
        "dropped temperature; dropped seed; renamed max_tokens to max_output_tokens; "
        "renamed top_p to nucleus"
    )


async def test_a_line_without_a_family_is_untouched(prism_fake, prism_gateway):
    gw = await prism_gateway(catalog(prism_fake, {"drop_params": ["seed"]}), load_plugins=PLUGINS)
    raw = await ask(gw, temperature=0.2, max_tokens=30, seed=7)
    sent = prism_fake.requests("reasoning")[-1].body
    assert sent["temperature"] == 0.2 and sent["max_tokens"] == 30 and "seed" not in sent
    assert raw.headers["x-prism-params-adjusted"] == "dropped seed"


@pytest.mark.parametrize(
    ("family", "problem"),
    [
        ("openai-reasonning", "unknown family 'openai-reasonning'"),
        (["openai-reasoning"], "expected a family name"),
    ],
)
async def test_an_unknown_family_stops_start_up_naming_the_key_and_the_known(
    prism_fake, prism_gateway, family, problem
):
    with pytest.raises(ConfigError) as info:
        await prism_gateway(catalog(prism_fake, {}, {"family": family}), load_plugins=PLUGINS)
    assert info.value.key == "models.m.chain[1].family"
    assert problem in info.value.problem
    assert "known families for provider kind 'openai': openai-reasoning" in info.value.problem


class Ships:
    """A plugin shipping parameter profiles of its own."""

    def __init__(self, profiles: dict[str, ParamProfile]) -> None:
        self.profiles = profiles

    @hookimpl
    def prism_param_profiles(self):
        return self.profiles


async def test_two_plugins_registering_one_family_stop_start_up(prism_fake, prism_gateway):
    again = Ships({FAMILY: ParamProfile(drop=("temperature",))})
    with pytest.raises(ConfigError) as info:
        await prism_gateway(
            catalog(prism_fake, {}), plugins=[(again, "copycat")], load_plugins=PLUGINS
        )
    # Test plugins are registered before installed ones: named in that order.
    assert "plugins 'copycat' and 'openai' both register" in info.value.problem
    assert repr(FAMILY) in info.value.problem


async def test_another_plugins_family_for_openai_lines_is_usable(prism_fake, prism_gateway):
    extra = Ships(
        {
            "local-quirks": ParamProfile(drop=("seed",), kinds=frozenset({"openai"})),
            "elsewhere": ParamProfile(drop=("seed",), kinds=frozenset({"anthropic"})),
        }
    )
    gw = await prism_gateway(
        catalog(prism_fake, {"family": "local-quirks"}),
        plugins=[(extra, "quirks")],
        load_plugins=PLUGINS,
    )
    raw = await ask(gw, seed=1, temperature=0.3)
    assert raw.headers["x-prism-params-adjusted"] == "dropped seed"
    # A family meant for another provider kind is refused on an openai line.
    with pytest.raises(ConfigError) as info:
        await prism_gateway(
            catalog(prism_fake, {"family": "elsewhere"}),
            plugins=[(extra, "quirks")],
            load_plugins=PLUGINS,
        )
    assert info.value.key == "models.m.chain[0].family"
    assert "is for provider kind anthropic, not 'openai'" in info.value.problem
    assert "local-quirks, openai-reasoning" in info.value.problem


async def test_openai_reasoning_is_refused_on_an_anthropic_line(prism_fake, prism_gateway):
    cat = {
        "providers": {"c": {"kind": "anthropic", "base_url": prism_fake.base_url("claude")}},
        "models": {"m": {"chain": [{"provider": "c", "model": "claude-up", "family": FAMILY}]}},
    }
    with pytest.raises(ConfigError) as info:
        await prism_gateway(cat, load_plugins=["openai", "anthropic"])
    assert info.value.key == "models.m.chain[0].family"
    assert "family 'openai-reasoning' is for provider kind openai, not 'anthropic'" in (
        info.value.problem
    )
