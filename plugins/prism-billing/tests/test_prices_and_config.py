"""Price arithmetic and the start-up checks an operator meets."""

from __future__ import annotations

from decimal import Decimal
from pathlib import Path
from typing import Any

import pytest
from prism_billing import Price, format_nanos, parse_price

from prism_proxy import ConfigError, Usage, config_from_mapping, create_app


def price(**fields: float) -> Price:
    return parse_price(fields, "models.m.chain[0].price", "catalog.toml")


def test_cost_counts_each_kind_of_token_at_its_own_rate():
    p = price(input=3.0, output=15.0, cached_input=0.3, cache_write=3.75, request=0.001)
    usage = Usage(
        input_tokens=1000, cached_input_tokens=200, cache_creation_tokens=100, output_tokens=500
    )
    # (700 x 3 + 200 x 0.3 + 100 x 3.75 + 500 x 15) / 1e6 + 0.001
    assert format_nanos(p.cost_nanos(usage)) == "0.011035"


def test_cost_has_no_float_drift():
    # 0.1 + 0.2 != 0.3 in floats; in the ledger it is.
    tenth, fifth = price(input=0.1, output=0), price(input=0.2, output=0)
    one_token = Usage(input_tokens=1)
    total = tenth.cost_nanos(one_token) + fifth.cost_nanos(one_token)
    assert total == price(input=0.3, output=0).cost_nanos(one_token) == 300
    million = Usage(input_tokens=1_000_000, output_tokens=3_000_000)
    assert price(input=0.1, output=0.7).cost_nanos(million) == 2_200_000_000
    assert format_nanos(2_200_000_000) == "2.2"


def test_whole_nano_prices_cost_exactly_what_decimal_arithmetic_says():
    """Prices with up to three decimals are costed in integers; any others in
    Decimal. Both must agree with the exact sum rounded once, half to even."""
    import random
    from decimal import ROUND_HALF_EVEN

    rng = random.Random(17)
    paths = set()
    for _ in range(500):
        places = rng.choice([0, 1, 2, 3, 4, 6])
        fields = {
            name: round(rng.uniform(0, 100), places)
            for name in ("input", "output", "cached_input", "cache_write")
        }
        fields["request"] = round(rng.uniform(0, 0.01), rng.choice([0, 3, 6, 9, 10]))
        p = price(**fields)
        rates = (p.input, p.output, p.cached_input, p.cache_write)
        whole = all(r.as_tuple().exponent >= -3 for r in rates)
        whole = whole and p.request.as_tuple().exponent >= -9
        assert (p.whole_nanos is not None) == whole
        paths.add(whole)
        cached, written = rng.randrange(0, 5000), rng.randrange(0, 5000)
        usage = Usage(
            input_tokens=rng.randrange(0, 200_000),
            cached_input_tokens=cached,
            cache_creation_tokens=written,
            output_tokens=rng.randrange(0, 50_000),
        )
        fresh = max(usage.input_tokens - cached - written, 0)
        exact = (
            fresh * p.input
            + cached * p.cached_input
            + written * p.cache_write
            + usage.output_tokens * p.output
        ) / Decimal(1_000_000) + p.request
        expected = int((exact * 10**9).quantize(Decimal(1), rounding=ROUND_HALF_EVEN))
        assert p.cost_nanos(usage) == expected, fields
        assert p.cost_nanos(None) == int(
            (p.request * 10**9).quantize(Decimal(1), rounding=ROUND_HALF_EVEN)
        )
    assert paths == {True, False}  # both the integer and the Decimal path were tested


def test_cost_rounds_once_to_the_nano_half_to_even():
    half_nano = price(input=0.0005, output=0)  # 5e-10 per token
    assert half_nano.cost_nanos(Usage(input_tokens=1)) == 0
    assert half_nano.cost_nanos(Usage(input_tokens=3)) == 2
    assert half_nano.cost_nanos(Usage(input_tokens=5)) == 2
    assert half_nano.cost_nanos(Usage(input_tokens=7)) == 4


def test_cached_prices_default_to_the_input_price():
    p = price(input=2.0, output=4.0)
    assert p.cached_input == p.cache_write == Decimal("2.0")
    assert p.request == 0
    assert p.cost_nanos(None) == 0  # served with no usage: only a fee could apply


def test_absurd_token_counts_cannot_overflow_the_ledger():
    p = price(input=1_000_000, output=1_000_000, request=1_000_000)
    usage = Usage(input_tokens=10**30, output_tokens=10**30, cached_input_tokens=10**30)
    assert p.cost_nanos(usage) < 2**63


def catalog(price_value: Any = None, second: Any = None) -> dict[str, Any]:
    line: dict[str, Any] = {"provider": "p", "model": "a"}
    if price_value is not None:
        line["price"] = price_value
    other: dict[str, Any] = {"provider": "p", "model": "b"}
    if second is not None:
        other["price"] = second
    return {
        "providers": {"p": {"kind": "openai", "base_url": "http://127.0.0.1:9/v1"}},
        "models": {"m": {"chain": [line, other]}},
    }


def start(cat: dict[str, Any], billing: dict[str, Any] | None = None, base: Path | None = None):
    config = config_from_mapping(
        {},
        {"billing": billing} if billing is not None else None,
        source="prism.ini",
        base_dir=base,
        catalog_data=cat,
    )
    return create_app(config)


GOOD = {"input": 1.0, "output": 2.0}


@pytest.mark.parametrize(
    ("bad", "where", "problem"),
    [
        (3.0, "models.m.chain[0].price", "expected a table"),
        ({"input": 1.0}, "models.m.chain[0].price.output", "missing"),
        ({**GOOD, "outptu": 2.0}, "models.m.chain[0].price.outptu", "unknown price field"),
        ({**GOOD, "output": -1}, "models.m.chain[0].price.output", "expected a number >= 0"),
        ({**GOOD, "input": "3"}, "models.m.chain[0].price.input", "expected a number"),
        ({**GOOD, "request": True}, "models.m.chain[0].price.request", "expected a number"),
        ({**GOOD, "cached_input": float("nan")}, "models.m.chain[0].price.cached_input", ">= 0"),
        ({**GOOD, "output": 2e6}, "models.m.chain[0].price.output", "at most 1000000"),
    ],
)
def test_a_bad_price_stops_start_up_naming_the_field(bad, where, problem):
    # Checked even with billing off: a mistyped price is a mistake either way.
    with pytest.raises(ConfigError) as info:
        start(catalog(bad, GOOD))
    assert info.value.key == where
    assert problem in info.value.problem


def test_billing_on_refuses_an_unpriced_line(tmp_path):
    with pytest.raises(ConfigError) as info:
        start(catalog(GOOD), {"ledger_path": "ledger.sqlite"}, tmp_path)
    assert info.value.key == "models.m.chain[1].price"
    assert "require_prices = false" in info.value.problem
    assert not (tmp_path / "ledger.sqlite").exists()


def test_billing_off_accepts_unpriced_lines_and_writes_nothing(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    start(catalog())
    assert list(tmp_path.iterdir()) == []


@pytest.mark.parametrize(
    ("section", "key", "problem"),
    [
        ({"ledger_path": "nowhere/ledger.sqlite"}, "[prism:billing] ledger_path", "does not exist"),
        ({"ledger_pth": "x"}, "[prism:billing] ledger_pth", "unknown key"),
        ({"synchronous": "off"}, "[prism:billing] synchronous", "expected full or normal"),
        ({"require_prices": "maybe"}, "[prism:billing] require_prices", "true or false"),
        ({"currency": "US dollars"}, "[prism:billing] currency", "short code"),
    ],
)
def test_a_bad_billing_setting_stops_start_up(tmp_path, section, key, problem):
    with pytest.raises(ConfigError) as info:
        start(catalog(GOOD, GOOD), section, tmp_path)
    assert info.value.key == key
    assert problem in info.value.problem


def ruled(rule_line: dict[str, Any]) -> dict[str, Any]:
    """Model ``m`` priced on its chain, with one rule whose chain names a line of its own."""
    cat = catalog(GOOD, GOOD)
    cat["models"]["m"]["rules"] = [
        {"name": "eu", "when": {"metadata.region": "eu"}, "chain": [rule_line]}
    ]
    return cat


def test_billing_on_refuses_an_unpriced_rule_line(tmp_path):
    # Served only to callers whose metadata selects the rule: it would have been free.
    with pytest.raises(ConfigError) as info:
        start(ruled({"provider": "p", "model": "eu-only"}), {"ledger_path": "l.sqlite"}, tmp_path)
    assert info.value.key == "models.m.rules[0].chain[0].price"
    assert "require_prices = false" in info.value.problem


def test_a_bad_price_on_a_rule_line_stops_start_up_with_billing_off():
    with pytest.raises(ConfigError) as info:
        start(ruled({"provider": "p", "model": "eu-only", "price": {"input": 1.0}}))
    assert info.value.key == "models.m.rules[0].chain[0].price.output"


def test_prism_check_refuses_an_unpriced_rule_line(tmp_path, capsys):
    (tmp_path / "catalog.toml").write_text(
        '[providers.p]\nkind = "openai"\nbase_url = "http://127.0.0.1:9/v1"\n'
        "[models.m]\n"
        'chain = [{ provider = "p", model = "a", price = { input = 1.0, output = 2.0 } }]\n'
        "[[models.m.rules]]\n"
        'name = "eu"\nwhen = { "metadata.region" = "eu" }\n'
        'chain = [{ provider = "p", model = "eu-only" }]\n',
        encoding="utf-8",
    )
    (tmp_path / "prism.ini").write_text(
        "[prism]\ncatalog = catalog.toml\n[prism:billing]\nledger_path = ledger.sqlite\n",
        encoding="utf-8",
    )
    from prism_proxy.cli import main

    assert main(["check", "--config", str(tmp_path / "prism.ini")]) == 2
    err = capsys.readouterr().err
    assert "models.m.rules[0].chain[0].price" in err
    assert not (tmp_path / "ledger.sqlite").exists()


def test_row_timestamps_read_as_datetime_would_write_them():
    import datetime
    import random

    from prism_billing.rows import utc_day

    rng = random.Random(5)
    stamps = [rng.uniform(0, 4e9) for _ in range(2000)]
    stamps += [1e9 + 0.9999996, 1e9 + 0.0000004, 1_700_000_000.5, 1e9 - 0.0000004, 0.0]
    for stamp in stamps:
        moment = datetime.datetime.fromtimestamp(stamp, datetime.UTC)
        ts = moment.isoformat(timespec="milliseconds").replace("+00:00", "Z")
        assert utc_day(stamp) == (ts, moment.date().isoformat()), stamp
