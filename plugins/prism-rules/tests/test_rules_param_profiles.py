"""A rule's own chain line may name a parameter profile (``family``), like a catalog line."""

from __future__ import annotations

from typing import Any

import pytest

from prism_proxy import ConfigError

PLUGINS = ["openai", "rules"]


def catalog(fake, rule_line: dict[str, Any]) -> dict[str, Any]:
    """``chat`` is served by ``base/gpt`` unless its catch-all rule sends it to ``r/o3``."""
    return {
        "providers": {
            "base": {"kind": "openai", "base_url": fake.base_url("base")},
            "r": {"kind": "openai", "base_url": fake.base_url("rule-line")},
        },
        "models": {
            "chat": {
                "chain": [{"provider": "base", "model": "gpt"}],
                "rules": [
                    {
                        "name": "think",
                        "chain": [{"provider": "r", "model": "o3", **rule_line}],
                    }
                ],
            }
        },
    }


async def test_a_rule_only_line_with_a_family_gets_its_adjustments(prism_fake, prism_gateway):
    gw = await prism_gateway(
        catalog(prism_fake, {"family": "openai-reasoning", "drop_params": ["seed"]}),
        load_plugins=PLUGINS,
    )
    raw = await gw.openai().chat.completions.with_raw_response.create(
        model="chat",
        messages=[{"role": "user", "content": "Hi"}],
        temperature=0.2,
        max_tokens=30,
        seed=3,
    )
    assert raw.headers["x-prism-route"] == "think"
    sent = prism_fake.requests("rule-line")[-1].body
    assert sent["model"] == "o3"
    assert "temperature" not in sent and "seed" not in sent and "max_tokens" not in sent
    assert sent["max_completion_tokens"] == 30
    assert raw.headers["x-prism-params-adjusted"] == (
        "dropped temperature; dropped seed; renamed max_tokens to max_completion_tokens"
    )
    assert prism_fake.hits("base") == 0


async def test_an_unknown_family_on_a_rule_line_stops_start_up(prism_fake, prism_gateway):
    with pytest.raises(ConfigError) as info:
        await prism_gateway(catalog(prism_fake, {"family": "o-series"}), load_plugins=PLUGINS)
    assert info.value.key == "models.chat.rules[0].chain[0].family"
    assert "unknown family 'o-series'" in info.value.problem
    assert "openai-reasoning" in info.value.problem
