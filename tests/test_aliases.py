"""Aliases and wildcard models: the names callers use, and what the upstream is sent.

``[aliases]`` gives a model another name; ``[models."acme/*"]`` passes any
``acme/<name>`` through, ``{name}`` substituted in its lines' model and the
price picked from a table keyed by glob.  The fake upstream records the model
name it received.
"""

from __future__ import annotations

from decimal import Decimal
from pathlib import Path

import openai
import pytest

from prism_proxy import ConfigError
from prism_proxy.catalog import CatalogKeys, load_catalog

#: What the billing plugin declares: the unit tests load the catalog without it.
PRICED = [CatalogKeys(binding=frozenset({"price"}))]

BIG_PRICE = {"input": 5.0, "output": 15.0}
ANY_PRICE = {"input": 1.0, "output": 2.0}


def catalog(fake) -> dict:
    return {
        "providers": {
            "alpha": {"kind": "openai", "base_url": fake.base_url("al-alpha")},
            "acme": {"kind": "openai", "base_url": fake.base_url("al-acme")},
        },
        "models": {
            "chat-a": {
                "chain": [{"provider": "alpha", "model": "alpha-large", "price": ANY_PRICE}]
            },
            "acme/*": {
                "chain": [
                    {
                        "provider": "acme",
                        "model": "{name}",
                        "price": {"big-*": BIG_PRICE, "*": ANY_PRICE},
                    }
                ]
            },
        },
        "aliases": {"gpt-4o": "chat-a"},
    }


async def test_alias_resolves_like_its_target(prism_fake, prism_gateway):
    gw = await prism_gateway(catalog(prism_fake))
    raw = await gw.openai().chat.completions.with_raw_response.create(
        model="gpt-4o", messages=[{"role": "user", "content": "Hi"}]
    )
    assert raw.parse().choices[0].message.content.startswith("Hello from alpha-large")
    assert raw.headers["x-prism-model-requested"] == "gpt-4o"
    assert raw.headers["x-prism-model"] == "alpha-large"
    assert prism_fake.models("al-alpha") == ["alpha-large"]


async def test_plain_name_has_no_requested_header(prism_fake, prism_gateway):
    gw = await prism_gateway(catalog(prism_fake))
    raw = await gw.openai().chat.completions.with_raw_response.create(
        model="chat-a", messages=[{"role": "user", "content": "Hi"}]
    )
    assert "x-prism-model-requested" not in raw.headers


async def test_alias_is_a_model_for_the_models_endpoint(prism_fake, prism_gateway):
    gw = await prism_gateway(catalog(prism_fake))
    model = await gw.openai().models.retrieve("gpt-4o")
    assert model.id == "gpt-4o"
    listed = [model.id async for model in gw.openai().models.list()]
    assert "gpt-4o" in listed and listed.index("gpt-4o") > listed.index("chat-a")
    assert not any("*" in name for name in listed)


@pytest.mark.parametrize("stream", [False, True], ids=["whole", "stream"])
async def test_wildcard_passes_the_name_through(prism_fake, prism_gateway, stream, tmp_path):
    gw = await prism_gateway(
        catalog(prism_fake), sections={"billing": {"ledger_path": str(tmp_path / "l.db")}}
    )
    raw = await gw.openai().chat.completions.with_raw_response.create(
        model="acme/big-7b",
        messages=[{"role": "user", "content": "Hi there"}],
        stream=stream,
        **({"stream_options": {"include_usage": True}} if stream else {}),
    )
    if stream:
        chunks = [chunk async for chunk in raw.parse()]
        usage = chunks[-1].usage
        assert usage is not None
    else:
        usage = raw.parse().usage
    assert prism_fake.models("al-acme") == ["big-7b"]
    assert raw.headers["x-prism-model"] == "big-7b"
    assert raw.headers["x-prism-provider"] == "acme"
    if stream:
        return  # a stream's headers leave before its cost is known
    # Priced by the first glob that matches the name: "big-*".
    expected = (
        Decimal(usage.prompt_tokens) * Decimal("5") + Decimal(usage.completion_tokens) * 15
    ) / 1_000_000
    assert Decimal(raw.headers["x-prism-cost"]) == expected > 0


async def test_wildcard_other_price(prism_fake, prism_gateway, tmp_path):
    gw = await prism_gateway(
        catalog(prism_fake), sections={"billing": {"ledger_path": str(tmp_path / "l.db")}}
    )
    raw = await gw.openai().chat.completions.with_raw_response.create(
        model="acme/small", messages=[{"role": "user", "content": "Hi"}]
    )
    usage = raw.parse().usage
    assert prism_fake.models("al-acme") == ["small"]
    expected = (Decimal(usage.prompt_tokens) + Decimal(usage.completion_tokens) * 2) / 1_000_000
    assert Decimal(raw.headers["x-prism-cost"]) == expected


async def test_wildcard_unknown_name_is_the_upstreams_404(prism_fake, prism_gateway):
    from prism_fake_upstream import Fault

    gw = await prism_gateway(catalog(prism_fake))
    not_found = {
        "error": {
            "message": "The model `nope` does not exist or you do not have access to it.",
            "type": "invalid_request_error",
            "param": None,
            "code": "model_not_found",
        }
    }
    prism_fake.script("al-acme", [Fault(status=404, body=not_found)])
    with pytest.raises(openai.APIStatusError) as info:
        await gw.openai(max_retries=0).chat.completions.create(
            model="acme/nope", messages=[{"role": "user", "content": "Hi"}]
        )
    assert info.value.code == "upstream_model_not_found"
    assert prism_fake.models("al-acme") == ["nope"]


async def test_names_outside_every_pattern_are_the_catalogs_404(prism_fake, prism_gateway):
    gw = await prism_gateway(catalog(prism_fake))
    for name in ("other/x", "acme/", "acme/bad name"):
        with pytest.raises(openai.NotFoundError) as info:
            await gw.openai(max_retries=0).chat.completions.create(
                model=name, messages=[{"role": "user", "content": "Hi"}]
            )
        assert info.value.code == "model_not_found"
    assert prism_fake.hits("al-acme") == 0


def test_wildcard_lines_keep_one_identity_per_name():
    """Breakers, caches and the price book key a line by identity: one per name."""
    cat = load_catalog(None, data=_data(), extra_keys=PRICED)
    first = cat.resolve("acme/big-1")
    assert first is not None and first is cat.resolve("acme/big-1")
    (line,) = first.chain
    assert (line.id, line.options["price"]) == ("acme/big-1", BIG_PRICE)
    assert cat.resolve("acme/tiny").chain[0].options["price"] == ANY_PRICE


def test_prices_of_wildcard_names_are_kept_within_bounds(monkeypatch):
    """Callers choose wildcard names: the price book keeps only the recent ones' prices."""
    from prism_billing import prices

    assert prices.PriceBook(by_line={})._extra.maxsize == prices.EXTRA_LINES
    monkeypatch.setattr(prices, "EXTRA_LINES", 8)
    cat = load_catalog(None, data=_data(), extra_keys=PRICED)
    book = prices.PriceBook.from_catalog(cat, require=False)
    big = prices.parse_price(BIG_PRICE, "price", "test")
    for index in range(100):
        model = cat.resolve(f"acme/big-{index}")
        assert model is not None and book.price_of(model.chain[0]) == big
    assert len(book._extra) == 8


def _data(**extra: object) -> dict:
    data: dict = {
        "providers": {"acme": {"kind": "openai", "base_url": "http://127.0.0.1:1/v1"}},
        "models": {
            "chat-a": {"chain": [{"provider": "acme", "model": "a"}]},
            "acme/*": {
                "chain": [
                    {
                        "provider": "acme",
                        "model": "{name}",
                        "price": {"big-*": BIG_PRICE, "*": ANY_PRICE},
                    }
                ]
            },
        },
    }
    data.update(extra)
    return data


@pytest.mark.parametrize(
    ("change", "key", "problem"),
    [
        ({"aliases": {"gpt-4o": "missing"}}, "aliases.gpt-4o", "is not a model"),
        ({"aliases": {"chat-a": "chat-a"}}, "aliases.chat-a", "already a model"),
        ({"aliases": ["x"]}, "aliases", "expected a table"),
        (
            {"models": {"a*b": {"chain": [{"provider": "acme", "model": "{name}"}]}}},
            "models.a*b",
            "one * at the end",
        ),
        (
            {"models": {"z/*": {"chain": [{"provider": "acme", "model": "fixed"}]}}},
            "models.z/*.chain[0].model",
            "{name}",
        ),
        (
            {
                "models": {
                    "m": {"chain": [{"provider": "acme", "model": "a"}], "context_fallback": 1}
                }
            },
            "models.m.context_fallback",
            "true or false",
        ),
    ],
)
def test_catalog_mistakes_name_the_key(change, key, problem):
    with pytest.raises(ConfigError) as info:
        load_catalog(Path("cat.toml"), data={**_data(), **change}, extra_keys=PRICED)
    assert info.value.key == key
    assert problem in str(info.value)
