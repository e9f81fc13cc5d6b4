"""An Anthropic binding behind Prism's translation, and the catalog keys the plugin declares.

``drop_params`` / ``rename_params`` on a line of an ``anthropic`` provider
apply to the body as sent upstream (after translation), are named in
``x-prism-params-adjusted``, and a bad value stops start-up naming the key.
"""

from __future__ import annotations

from typing import Any

import pytest
from prism_fake_upstream import Fault

from prism_proxy import ConfigError, hookimpl

PLUGINS = ["anthropic"]


def catalog(fake, *lines: dict[str, Any]) -> dict[str, Any]:
    """Model ``m`` served by anthropic bindings ``p/<model>`` (the fake's scenario ``claude``)."""
    return {
        "providers": {"p": {"kind": "anthropic", "base_url": fake.base_url("claude")}},
        "models": {
            "m": {"chain": [{"provider": "p", "model": "claude-up", **line} for line in lines]}
        },
    }


class Settled:
    """Records each call's settlement (what billing would see)."""

    def __init__(self) -> None:
        self.settlements: list[Any] = []

    @hookimpl
    def prism_settle(self, call, settlement):
        self.settlements.append(settlement)


async def test_an_openai_chat_caller_is_served_by_an_anthropic_binding(prism_fake, prism_gateway):
    prism_fake.script(
        "claude", [Fault(usage={"cache_read_input_tokens": 7, "cache_creation_input_tokens": 2})]
    )
    settled = Settled()
    gw = await prism_gateway(
        catalog(prism_fake, {}), plugins=[(settled, "settled")], load_plugins=PLUGINS
    )
    raw = await gw.openai().chat.completions.with_raw_response.create(
        model="m",
        messages=[{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Hello"}],
        temperature=0.2,
    )
    completion = raw.parse()
    assert completion.object == "chat.completion"
    assert (
        completion.choices[0].message.content
        == "Hello from claude-up. This is the fake upstream answering."
    )
    assert completion.choices[0].finish_reason == "stop"
    # Prism's prompt count is the whole prompt: 3 fresh + 7 read from cache + 2 written.
    assert completion.usage.prompt_tokens == 12
    assert completion.usage.prompt_tokens_details.cached_tokens == 7
    assert completion.usage.completion_tokens == 9
    assert raw.headers["x-prism-provider"] == "p"
    assert raw.headers["x-prism-attempt-log"].startswith("p/claude-up ok 200 ")
    assert raw.headers["x-prism-params-adjusted"] == "max_tokens defaulted to 4096"

    [sent] = prism_fake.requests("claude")
    assert sent.path == "messages"
    assert sent.body == {
        "model": "claude-up",
        "system": "Be brief.",
        "messages": [{"role": "user", "content": [{"type": "text", "text": "Hello"}]}],
        "max_tokens": 4096,
        "temperature": 0.2,
    }
    assert sent.headers["anthropic-version"] == "2023-06-01"

    # Billing sees cache reads and writes apart, inside the whole prompt.
    [settlement] = settled.settlements
    assert settlement.outcome == "ok"
    usage = settlement.usage
    assert (usage.input_tokens, usage.cached_input_tokens, usage.cache_creation_tokens) == (
        12,
        7,
        2,
    )
    assert usage.output_tokens == 9 and not usage.estimated


async def test_rules_apply_after_translation(prism_fake, prism_gateway):
    gw = await prism_gateway(
        catalog(
            prism_fake,
            {"drop_params": ["top_p"], "rename_params": {"stop_sequences": "stop_words"}},
        ),
        load_plugins=PLUGINS,
    )
    raw = await gw.openai().chat.completions.with_raw_response.create(
        model="m", messages=[{"role": "user", "content": "Hello"}], top_p=0.5, stop=["END"]
    )
    assert raw.parse().choices[0].message.content.startswith("Hello from claude-up")
    # The caller said "stop"; the rule names the Anthropic field it became.
    assert raw.headers["x-prism-params-adjusted"] == (
        "max_tokens defaulted to 4096; dropped top_p; renamed stop_sequences to stop_words"
    )
    [sent] = prism_fake.requests("claude")
    assert "top_p" not in sent.body
    assert "stop_sequences" not in sent.body
    assert sent.body["stop_words"] == ["END"]


async def test_rules_apply_to_native_messages(prism_fake, prism_gateway):
    gw = await prism_gateway(
        catalog(prism_fake, {"drop_params": ["top_p"], "rename_params": {"metadata": "meta"}}),
        load_plugins=PLUGINS,
    )
    raw = await gw.anthropic().messages.with_raw_response.create(
        model="m",
        max_tokens=20,
        messages=[{"role": "user", "content": "Hello"}],
        metadata={"user_id": "u-1"},
        extra_body={"top_p": 0.5},  # this SDK version has no top_p argument
    )
    assert (await raw.parse()).content[0].text.startswith("Hello from claude-up")
    assert raw.headers["x-prism-params-adjusted"] == "dropped top_p; renamed metadata to meta"
    [sent] = prism_fake.requests("claude")
    assert "top_p" not in sent.body and "metadata" not in sent.body
    assert sent.body["meta"] == {"user_id": "u-1"}
    # Only parameters actually present are reported.
    raw = await gw.anthropic().messages.with_raw_response.create(
        model="m", max_tokens=20, messages=[{"role": "user", "content": "Hello"}]
    )
    assert "x-prism-params-adjusted" not in raw.headers


@pytest.mark.parametrize(
    ("line", "key", "problem"),
    [
        ({"drop_params": "top_p"}, "drop_params", "expected a list of names"),
        ({"drop_params": ["top_p", 3]}, "drop_params", "expected a list of names"),
        ({"drop_params": {"top_p": True}}, "drop_params", "expected a list of names"),
        ({"rename_params": ["stop", "stop_sequences"]}, "rename_params", 'old = "new"'),
        ({"rename_params": {"stop": 1}}, "rename_params", 'old = "new"'),
        ({"rename_params": {"stop": ""}}, "rename_params", 'old = "new"'),
    ],
)
async def test_a_bad_rule_stops_start_up_naming_the_key(
    prism_fake, prism_gateway, line, key, problem
):
    # The bad rule is on the second line, so the index in the key is checked too.
    with pytest.raises(ConfigError) as info:
        await prism_gateway(catalog(prism_fake, {}, line), load_plugins=PLUGINS)
    assert info.value.key == f"models.m.chain[1].{key}"
    assert problem in info.value.problem
    assert f"models.m.chain[1].{key}" in str(info.value)


async def test_the_rule_keys_belong_to_the_plugin(prism_fake, prism_gateway):
    # Loaded, the plugin declares the keys; a key no plugin declares is refused.
    gw = await prism_gateway(catalog(prism_fake, {"drop_params": []}), load_plugins=PLUGINS)
    assert "anthropic" in gw.gateway.current.loaded()
    with pytest.raises(ConfigError) as info:
        await prism_gateway(
            catalog(prism_fake, {"drop_parameters": ["top_p"]}), load_plugins=PLUGINS
        )
    assert info.value.key == "models.m.chain[0].drop_parameters"
