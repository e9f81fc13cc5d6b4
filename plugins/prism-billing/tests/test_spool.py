"""PostgreSQL unreachable: no answer without its row, streams included.

The ledger is reached through a TCP forwarder the test controls: ``cut()``
resets its connections and refuses new ones (an outage), ``restore()`` ends
it.  Rows are read back from PostgreSQL directly, as an auditor would.
"""

from __future__ import annotations

import asyncio
import collections
import logging
import re
import shutil
from pathlib import Path
from typing import Any

import aiohttp
import attrs
import orjson
import pytest
from prism_billing.pg_ledger import LedgerUnavailable, PostgresLedgerWriter
from prism_billing.settings import BillingSettings
from prism_billing.spool import Spool
from prism_billing.testing import POSTGRES_SERVER
from prism_fake_upstream import Fault

from prism_proxy import ConfigError, config_from_mapping, load_config
from prism_proxy.testing import free_port, serve_process

from .conftest import PRICE_A, expected_cost, priced_catalog
from .test_billing import MESSAGES
from .test_ledger_writer import row
from .test_postgres_ledger import ledger_state, rows_in, stats

OUTAGE_CALLS = 5


@attrs.define(eq=False)
class Forwarder:
    """A TCP forwarder in front of PostgreSQL that a test can cut and restore."""

    target: tuple[str, int]
    port: int = 0
    server: asyncio.Server | None = None
    pipes: set[asyncio.StreamWriter] = attrs.field(factory=set)

    async def start(self) -> None:
        self.server = await asyncio.start_server(
            self._serve, "127.0.0.1", self.port, reuse_address=True
        )
        self.port = self.server.sockets[0].getsockname()[1]

    def url(self, direct_url: str) -> str:
        """``direct_url`` (the test's database), reached through this forwarder."""
        return f"postgresql://postgres@127.0.0.1:{self.port}/{direct_url.rsplit('/', 1)[1]}"

    async def cut(self) -> None:
        """Refuse new connections and reset the open ones: the database is gone."""
        assert self.server is not None
        self.server.close()
        for writer in list(self.pipes):
            writer.transport.abort()
        await self.server.wait_closed()

    async def restore(self) -> None:
        await self.start()

    async def _serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            far_reader, far_writer = await asyncio.open_connection(*self.target)
        except OSError:
            writer.transport.abort()
            return
        pair = {writer, far_writer}
        self.pipes |= pair
        try:
            await asyncio.gather(_pump(reader, far_writer), _pump(far_reader, writer))
        finally:
            self.pipes -= pair


async def _pump(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
    try:
        while data := await reader.read(65536):
            writer.write(data)
            await writer.drain()
    except OSError:
        pass
    finally:
        writer.transport.abort()


@pytest.fixture
async def forwarder() -> Any:
    host, port = POSTGRES_SERVER.split(":")
    forwarder = Forwarder((host, int(port)))
    await forwarder.start()
    yield forwarder
    if forwarder.server is not None:
        forwarder.server.close()
    for writer in list(forwarder.pipes):
        writer.transport.abort()


@attrs.frozen
class Streamed:
    request_id: str
    status: int
    text: str
    usage: dict[str, Any] | None
    done: bool
    cost: str | None
    body: bytes


async def stream(session: aiohttp.ClientSession, base_url: str) -> Streamed:
    """One streamed chat call, read to its end as an SSE client would."""
    async with session.post(
        base_url + "/chat/completions",
        json={
            "model": "m",
            "messages": MESSAGES,
            "stream": True,
            "stream_options": {"include_usage": True},
        },
    ) as response:
        request_id = response.headers["x-prism-request-id"]
        body = await response.read()
        if response.status != 200:
            return Streamed(request_id, response.status, "", None, False, None, body)
    events = [line[6:] for line in body.split(b"\n") if line.startswith(b"data: ")]
    chunks = [orjson.loads(event) for event in events if event != b"[DONE]"]
    choices = [choice for chunk in chunks for choice in chunk.get("choices") or ()]
    text = "".join(choice["delta"].get("content") or "" for choice in choices)
    usage = next((chunk["usage"] for chunk in chunks if chunk.get("usage")), None)
    cost = re.search(rb"^: x-prism-cost: (\S+)$", body, re.MULTILINE)
    return Streamed(
        request_id,
        200,
        text,
        usage,
        bool(events) and events[-1] == b"[DONE]",
        cost.group(1).decode() if cost else None,
        body,
    )


def texts(count: int) -> list[str]:
    """Answers of different lengths, so every row's tokens are its own."""
    return [" ".join(f"w{i}" for i in range(3 + n)) for n in range(count)]


async def replayed_ids(pg_url: str) -> list[str]:
    """The ledger's request ids in the order they were inserted (a fresh table: ctid order)."""
    import asyncpg

    conn = await asyncpg.connect(pg_url, timeout=5)
    try:
        found = await conn.fetch("SELECT request_id FROM ledger ORDER BY ctid")
        return [r["request_id"] for r in found]
    finally:
        await conn.close()


async def scrape(url: str) -> str:
    async with aiohttp.ClientSession() as session:
        async with session.get(url + "/metrics") as response:
            return await response.text()


async def test_streams_in_an_outage_are_spooled_and_replayed_once_in_order(
    prism_fake, prism_gateway, prism_postgres, forwarder, tmp_path: Path
):
    answers = texts(OUTAGE_CALLS + 2)
    prism_fake.script("alpha", [Fault(text=text) for text in answers])
    spool_file = tmp_path / "ledger.spool"
    section = {"ledger_url": forwarder.url(prism_postgres), "spool_path": str(spool_file)}
    gw = await prism_gateway(
        priced_catalog(prism_fake, ("alpha", PRICE_A)), sections={"billing": section}
    )
    async with aiohttp.ClientSession() as session:
        before = await stream(session, gw.base_url)
        assert before.done and before.cost is not None
        await forwarder.cut()
        during = [await stream(session, gw.base_url) for _ in range(OUTAGE_CALLS)]
        # Every stream was served whole, its cost told, while no row reached PostgreSQL.
        for streamed, text in zip(during, answers[1:], strict=False):
            assert streamed.status == 200 and streamed.done, streamed.body
            assert streamed.text == text and streamed.cost is not None
            assert b"settlement_failed" not in streamed.body
        assert [r["request_id"] for r in await rows_in(prism_postgres)] == [before.request_id]
        facts = await ledger_state(gw, "spooling")
        assert facts["spool_depth"] == facts["rows_spooled"] == OUTAGE_CALLS
        assert facts["spool"] == "ok"
        assert facts["spool_bytes"] == spool_file.stat().st_size > 0
        metrics = await scrape(gw.url)
        assert f"prism_ledger_spool_depth {float(OUTAGE_CALLS)}" in metrics
        assert f'prism_events_total{{event="billing_spooled"}} {float(OUTAGE_CALLS)}' in metrics

        await forwarder.restore()
        facts = await ledger_state(gw, "ok")
        assert (facts["spool_depth"], facts["rows_replayed"]) == (0, OUTAGE_CALLS)
        assert spool_file.stat().st_size == 0
        after = await stream(session, gw.base_url)
        assert after.done and after.cost is not None

    calls = [before, *during, after]
    assert await replayed_ids(prism_postgres) == [c.request_id for c in calls]
    by_id = {r["request_id"]: r for r in await rows_in(prism_postgres)}
    for streamed in calls:
        stored = by_id[streamed.request_id]
        assert streamed.usage is not None
        assert (stored["input_tokens"], stored["output_tokens"]) == (
            streamed.usage["prompt_tokens"],
            streamed.usage["completion_tokens"],
        )
        assert (stored["outcome"], stored["stream"], stored["estimated"]) == ("ok", True, False)
        cost = expected_cost(PRICE_A, stored["input_tokens"], stored["output_tokens"])
        assert str(cost) == streamed.cost
    assert len({c.usage["completion_tokens"] for c in calls if c.usage}) == len(calls)
    counters = await stats(gw)
    assert (counters["billing_spooled"], counters["billing_replayed"]) == (OUTAGE_CALLS,) * 2
    assert counters.get("billing_write_errors", 0) == 0


async def test_spool_unwritable_and_postgresql_down_refuses_calls_before_the_upstream(
    prism_fake, prism_gateway, prism_postgres, forwarder, tmp_path: Path, caplog
):
    prism_fake.script("alpha", [Fault(text=text) for text in texts(4)])
    spool_dir = tmp_path / "spool"
    spool_dir.mkdir()
    section = {"ledger_url": forwarder.url(prism_postgres), "spool_path": str(spool_dir / "s")}
    gw = await prism_gateway(
        priced_catalog(prism_fake, ("alpha", PRICE_A)), sections={"billing": section}
    )
    async with aiohttp.ClientSession() as session:
        await forwarder.cut()
        spooled = await stream(session, gw.base_url)
        assert spooled.done
        shutil.rmtree(spool_dir)  # the spool's disk is gone too
        with caplog.at_level(logging.INFO):
            # Admitted while the spool still looked writable: served, then its row
            # had nowhere to go, so its final event is withheld.
            lost = await stream(session, gw.base_url)
        assert lost.status == 200 and not lost.done and b"settlement_failed" in lost.body
        failures = [r for r in caplog.records if lost.request_id in r.getMessage()]
        failures = [r for r in failures if r.levelno >= logging.ERROR]
        assert len(failures) == 1 and not failures[0].exc_info
        assert "\n" not in failures[0].getMessage()
        assert (await ledger_state(gw, "refusing"))["spool"] == "unusable"
        hits = prism_fake.hits("alpha")
        refused = await stream(session, gw.base_url)
        async with session.post(
            gw.base_url + "/chat/completions", json={"model": "m", "messages": MESSAGES}
        ) as response:
            assert response.status == 503
            error = (await response.json())["error"]
            assert response.headers["Retry-After"] == "1"
        assert refused.status == 503 and orjson.loads(refused.body)["error"]["code"] == (
            "ledger_unavailable"
        )
        assert error["code"] == "ledger_unavailable" and "spool" in error["message"]
        assert prism_fake.hits("alpha") == hits, "a refused call reached the upstream"
        assert (await stats(gw))["billing_refusals"] == 2

        # PostgreSQL back: the row spooled before the disk went is replayed, calls served.
        await forwarder.restore()
        await ledger_state(gw, "ok")
        served = await stream(session, gw.base_url)
        assert served.done
    ids = [r["request_id"] for r in await rows_in(prism_postgres)]
    assert sorted(ids) == sorted([spooled.request_id, served.request_id])


async def test_a_full_spool_refuses_rows(prism_postgres, forwarder, tmp_path: Path):
    counters: collections.Counter[str] = collections.Counter()
    spool = Spool(tmp_path / "s", max_bytes=1, counters=counters)
    writer = PostgresLedgerWriter(forwarder.url(prism_postgres), spool=spool, counters=counters)
    await writer.start()
    try:
        await forwarder.cut()
        await writer.record(row("req_1"))  # spooled: the file now holds more than 1 byte
        assert not writer.can_take() and writer.report()["state"] == "refusing"
        with pytest.raises(LedgerUnavailable, match="full"):
            await writer.record(row("req_2"))
    finally:
        await writer.close()
    assert counters["billing_spooled"] == 1


async def test_a_replay_cut_short_runs_again_without_doubling_a_row(prism_postgres, tmp_path: Path):
    path = tmp_path / "s"
    counters: collections.Counter[str] = collections.Counter()
    earlier = Spool(path, max_bytes=1 << 20, counters=counters)
    await earlier.open()
    await earlier.append([row("req_1"), row("req_2"), row("req_3")])
    await earlier.close()
    # The process died after inserting req_1 and req_2, before emptying the spool,
    # and in the middle of appending one more record (never acknowledged).
    first = PostgresLedgerWriter(prism_postgres)
    await first.start()
    await asyncio.gather(first.record(row("req_1")), first.record(row("req_2")))
    await first.close()
    with path.open("ab") as torn:
        torn.write(b'0badc0de {"request_id": "req_4", "ts"')

    spool = Spool(path, max_bytes=1 << 20, counters=counters)
    writer = PostgresLedgerWriter(prism_postgres, spool=spool, counters=counters, retry_s=0.05)
    await writer.start()
    try:
        async with asyncio.timeout(10):
            while not writer.direct:
                await asyncio.sleep(0.02)
    finally:
        await writer.close()
    assert [r["request_id"] for r in await rows_in(prism_postgres)] == ["req_1", "req_2", "req_3"]
    assert (counters["billing_replayed"], counters["billing_rows"]) == (3, 1)
    assert path.stat().st_size == 0


async def test_spools_of_workers_are_separate_and_an_abandoned_one_is_adopted(tmp_path: Path):
    counters: collections.Counter[str] = collections.Counter()
    one = Spool(tmp_path / "s", max_bytes=1 << 20, counters=counters)
    two = Spool(tmp_path / "s", max_bytes=1 << 20, counters=counters)
    await one.open()
    await two.open()  # held by ``one``: takes the next slot
    assert (one.path.name, two.path.name) == ("s", "s.1")
    await two.append([row("req_a"), row("req_b")])
    await two.close()  # a worker that is not restarted: its slot is abandoned
    await one.append([row("req_c")])
    await one.close()
    again = Spool(tmp_path / "s", max_bytes=1 << 20, counters=counters)
    await again.open()
    try:
        assert (again.path.name, again.depth) == ("s", 3)
        rows, _ = await again.read(10)
        assert [r.request_id for r in rows] == ["req_c", "req_a", "req_b"]
    finally:
        await again.close()
    assert (tmp_path / "s.1").stat().st_size == 0


START_CALLS = 3


@attrs.frozen
class Reached:
    """A gateway that runs in another process, as ``ledger_state`` needs it: its URL."""

    url: str


async def start_prism(tmp_path: Path, fake: Any, port: int, url: str) -> asyncio.subprocess.Process:
    (tmp_path / "prism.ini").write_text(
        f"[prism]\nlisten = 127.0.0.1:{port}\ncatalog = catalog.toml\nlog_level = WARNING\n\n"
        f"[prism:billing]\nledger_url = {url}\n"
    )
    (tmp_path / "catalog.toml").write_text(
        f'[providers.p]\nkind = "openai"\nbase_url = "{fake.base_url("crash")}"\n'
        '[models.m]\nchain = [ { provider = "p", model = "x", '
        "price = { input = 3.0, output = 15.0 } } ]\n"
    )
    return await serve_process(
        tmp_path / "prism.ini", port, stderr=(tmp_path / "stderr.log").open("ab")
    )


async def test_sigkill_in_an_outage_then_a_restart_still_replays_the_spool(
    prism_fake, prism_postgres, forwarder, tmp_path: Path
):
    prism_fake.script("crash", [Fault(text=text) for text in texts(START_CALLS)])
    port = free_port()
    url = forwarder.url(prism_postgres)
    process = await start_prism(tmp_path, prism_fake, port, url)
    base = f"http://127.0.0.1:{port}"
    try:
        await forwarder.cut()
        async with aiohttp.ClientSession() as session:
            delivered = [await stream(session, base + "/v1") for _ in range(START_CALLS)]
        assert all(d.done and d.cost for d in delivered)
        process.kill()
        assert await asyncio.wait_for(process.wait(), 10) == -9
        # The default spool sits beside the configuration file.
        assert (tmp_path / "prism-billing.spool").stat().st_size > 0

        # Restarted while PostgreSQL is still away: it serves on the spool it finds.
        process = await start_prism(tmp_path, prism_fake, port, url)
        gateway = Reached(base)
        facts = await ledger_state(gateway, "spooling")
        assert facts["spool_depth"] == START_CALLS
        await forwarder.restore()
        await ledger_state(gateway, "ok")
    finally:
        if process.returncode is None:
            process.kill()
            await process.wait()
    stored = {r["request_id"]: r for r in await rows_in(prism_postgres)}
    assert sorted(stored) == sorted(d.request_id for d in delivered)
    for d in delivered:
        assert d.usage is not None
        assert stored[d.request_id]["output_tokens"] == d.usage["completion_tokens"]
    assert "Traceback" not in (tmp_path / "stderr.log").read_text()


def test_spool_settings(tmp_path: Path):
    ini = tmp_path / "prism.ini"
    ini.write_text(
        "[prism]\ncatalog = catalog.toml\n\n[prism:billing]\n"
        "ledger_url = postgresql://postgres@127.0.0.1:5432/x\n"
    )
    (tmp_path / "catalog.toml").write_text("")
    settings = BillingSettings.from_config(load_config(ini))
    assert settings.spool_path == tmp_path / "prism-billing.spool"
    pg, sqlite = "postgresql://h/x", str(tmp_path / "l.sqlite")
    for section, key, problem in [
        ({"ledger_path": sqlite, "spool_path": "s"}, "spool_path", "ledger_url"),
        ({"ledger_url": pg, "spool_path": ""}, "spool_path", "off"),
        ({"ledger_url": pg, "spool_path": str(tmp_path)}, "spool_path", "directory"),
        ({"ledger_url": pg, "spool_max_bytes": 10}, "spool_max_bytes", "65536"),
    ]:
        config = config_from_mapping({}, {"billing": section}, catalog_data={})
        with pytest.raises(ConfigError) as info:
            BillingSettings.from_config(config)
        assert info.value.key == f"[prism:billing] {key}" and problem in info.value.problem
    off = config_from_mapping(
        {}, {"billing": {"ledger_url": "postgresql://h/x", "spool_path": "off"}}, catalog_data={}
    )
    assert BillingSettings.from_config(off).spool_path is None
