"""Limit values, the section's mistakes, and the workers a limit would multiply with."""

from __future__ import annotations

import asyncio
import sys
from decimal import Decimal

import pytest
from prism_limits.limits import Budget, Period, applying, parse_budget, parse_count, parse_mode
from prism_limits.periods import window

from prism_proxy import ConfigError, config_from_mapping, create_app
from prism_proxy.testing import free_port, installed_plugins


@pytest.mark.parametrize(
    ("text", "nanos", "period"),
    [
        ("250/month", 250 * 10**9, Period.MONTH),
        (" 0.5 / hour ", 5 * 10**8, Period.HOUR),
        ("0.000000001/day", 1, Period.DAY),
        ("90/total", 90 * 10**9, Period.TOTAL),
    ],
)
def test_a_budget_is_an_exact_amount_per_period(text, nanos, period):
    assert parse_budget(text) == Budget(nanos, period)


@pytest.mark.parametrize(
    ("text", "problem"),
    [
        ("250", "expected AMOUNT/PERIOD"),
        ("250/fortnight", "expected a period from hour, day, week, month, total"),
        ("lots/day", "expected an amount"),
        ("-1/day", "from 0 to"),
        ("NaN/day", "from 0 to"),
        ("0.0000000001/day", "at most 9 decimals"),
    ],
)
def test_a_bad_budget_says_what_is_wrong(text, problem):
    with pytest.raises(ValueError, match=problem):
        parse_budget(text)


def test_counts_and_modes():
    assert parse_count(" 600 ") == 600
    with pytest.raises(ValueError, match="whole number"):
        parse_count("6.5")
    with pytest.raises(ValueError, match="from 0 to"):
        parse_count("-1")
    assert parse_mode("SOFT") is True and parse_mode("hard") is False
    with pytest.raises(ValueError, match="hard or soft"):
        parse_mode("gentle")


def test_calendar_periods_are_utc():
    # 2026-12-03 (a Thursday) 15:42:10 UTC.
    now = 1796312530.0
    day = window(Period.DAY, now)
    assert (day.start, day.end) == (1796256000, 1796342400)
    week = window(Period.WEEK, now)
    assert week.start == 1796256000 - 3 * 86400  # Monday
    month = window(Period.MONTH, now)
    assert (month.start, month.end) == (1796083200, 1798761600)  # Dec 1 to Jan 1
    assert window(Period.HOUR, now).start == 1796310000
    assert window(Period.TOTAL, now).end is None


def test_every_limit_that_applies_is_found_and_others_not():
    org = {"rpm": 10, "rpm@m": 2, "rpm@other": 1, "budget": parse_budget("5/day")}
    key = {"tpm": 100, "budget_mode": True, "budget": parse_budget("1/hour")}
    found = {limit.describe() for limit in applying("acme", "k1", org, key, {}, "m")}
    assert found == {
        "organisation acme rpm 10",
        "organisation acme rpm@m 2",
        "organisation acme budget 5/day",
        "key k1 tpm 100",
        "key k1 budget 1/hour",
    }
    soft = [limit for limit in applying("acme", "k1", org, key, {}, "m") if limit.soft]
    assert [limit.describe() for limit in soft] == ["key k1 budget 1/hour"]
    # Defaults apply only to callers without an organisation.
    defaults = {"rpm": 5}
    assert applying("acme", "k1", {}, {}, defaults, "m") == []
    assert [limit.describe() for limit in applying(None, None, {}, {}, defaults, "m")] == [
        "default anonymous rpm 5"
    ]


def _config(**limits: object):
    catalog = {
        "providers": {"p": {"kind": "openai", "base_url": "http://127.0.0.1:9/v1"}},
        "models": {"m": {"chain": [{"provider": "p", "model": "up"}]}},
    }
    return config_from_mapping(
        {"disable": sorted(set(installed_plugins()) - {"openai", "limits"})},
        {"limits": limits},
        source="<test config>",
        catalog_data=catalog,
    )


@pytest.mark.parametrize(
    ("limits", "message"),
    [
        ({"rpm": "often"}, r"\[prism:limits\] rpm: expected a whole number"),
        ({"budget": "5/fortnight"}, r"\[prism:limits\] budget: expected a period"),
        ({"on_shared_state_loss": "panic"}, r"on_shared_state_loss: expected share"),
        ({"lease_s": 1}, r"lease_s"),
        ({"rmp": 5}, r"rmp"),
    ],
)
def test_section_mistakes_stop_start_up_naming_the_key(limits, message):
    with pytest.raises(ConfigError, match=message):
        create_app(_config(**limits))


async def test_workers_without_shared_counters_are_refused(prism_fake, tmp_path):
    keep = {"openai", "limits"}
    disable = sorted(set(installed_plugins()) - keep)
    (tmp_path / "catalog.toml").write_text(
        f'[providers.p]\nkind = "openai"\nbase_url = "{prism_fake.base_url("ok")}"\n'
        '[models.m]\nchain = [ { provider = "p", model = "up" } ]\n'
    )
    ini = tmp_path / "prism.ini"
    ini.write_text(
        f"[prism]\nlisten = 127.0.0.1:{free_port()}\ncatalog = catalog.toml\nworkers = 2\n"
        f"disable = {', '.join(disable)}\n"
    )
    process = await asyncio.create_subprocess_exec(
        sys.executable,
        "-m",
        "prism_proxy.cli",
        "serve",
        "--config",
        str(ini),
        stderr=asyncio.subprocess.PIPE,
    )
    _, stderr = await asyncio.wait_for(process.communicate(), 30)
    message = stderr.decode()
    assert process.returncode == 2
    assert "prism-limits counts each limit in one process" in message
    assert "Traceback" not in message


def test_money_is_formatted_as_written():
    from prism_limits.limits import format_money

    assert format_money(250 * 10**9) == "250"
    assert format_money(5 * 10**7) == "0.05"
    assert format_money(0) == "0"
    assert Decimal(format_money(123456789)) == Decimal("0.123456789")
