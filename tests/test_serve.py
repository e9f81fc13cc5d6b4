"""`prism serve` as an operator runs it: a real process, SIGTERM drains, then cancels."""

from __future__ import annotations

import asyncio
import signal
import sys
from pathlib import Path

import aiohttp
import pytest
from prism_fake_upstream import Fault

from prism_proxy.testing import free_port, serve_process

MESSAGES = [{"role": "user", "content": "hi"}]


async def start_prism(
    tmp_path: Path, fake, grace_s: float
) -> tuple[asyncio.subprocess.Process, str]:
    port = free_port()
    (tmp_path / "prism.ini").write_text(
        f"[prism]\nlisten = 127.0.0.1:{port}\ncatalog = catalog.toml\n"
        f"shutdown_grace_s = {grace_s}\n"
    )
    (tmp_path / "catalog.toml").write_text(
        f'[providers.p]\nkind = "openai"\nbase_url = "{fake.base_url("slow-stream")}"\n'
        '[models.m]\nchain = [ { provider = "p", model = "x" } ]\n'
    )
    process = await serve_process(tmp_path / "prism.ini", port)
    return process, f"http://127.0.0.1:{port}"


async def stream_after_sigterm(process, url: str) -> bytes:
    async with aiohttp.ClientSession() as session:
        async with session.post(
            url + "/v1/chat/completions", json={"model": "m", "messages": MESSAGES, "stream": True}
        ) as response:
            assert response.status == 200
            first = await response.content.readline()
            process.send_signal(signal.SIGTERM)
            await asyncio.sleep(0.2)
            # The listener is closed: a new caller is refused while the old one is served.
            try:
                async with aiohttp.ClientSession() as other:
                    await other.get(url + "/healthz")
                refused = False
            except aiohttp.ClientConnectionError:
                refused = True
            assert refused
            try:
                rest = await response.content.read()
            except aiohttp.ClientPayloadError:
                rest = b"<broken>"
            return first + rest


async def test_sigterm_lets_an_inflight_stream_finish(prism_fake, tmp_path):
    prism_fake.script("slow-stream", [Fault(token_delay_s=0.1, text="one two three four five six")])
    process, url = await start_prism(tmp_path, prism_fake, grace_s=10)
    body = await stream_after_sigterm(process, url)
    assert body.endswith(b"data: [DONE]\n\n")
    assert await asyncio.wait_for(process.wait(), 15) == 0
    stderr = (await process.stderr.read()).decode()
    assert "outcome=ok" in stderr


async def test_sigterm_cancels_what_outlasts_the_grace_period(prism_fake, tmp_path):
    prism_fake.script("slow-stream", [Fault(token_delay_s=0.5, text=" ".join(["w"] * 40))])
    process, url = await start_prism(tmp_path, prism_fake, grace_s=1)
    body = await asyncio.wait_for(stream_after_sigterm(process, url), 15)
    assert not body.endswith(b"data: [DONE]\n\n")
    assert await asyncio.wait_for(process.wait(), 15) == 0
    stderr = (await process.stderr.read()).decode()
    assert "outcome=aborted" in stderr
    assert prism_fake.dropped("slow-stream") == 1


async def test_the_demo_answers_from_the_fake_upstream(tmp_path):
    import socket

    with socket.socket() as probe:
        if probe.connect_ex(("127.0.0.1", 18900)) == 0:
            pytest.skip("port 18900, the demo's fake upstream, is taken on this machine")
    port = free_port()
    process = await asyncio.create_subprocess_exec(
        sys.executable,
        "-m",
        "prism_proxy.cli",
        "demo",
        "--listen",
        f"127.0.0.1:{port}",
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.PIPE,
        cwd=tmp_path,
    )
    url = f"http://127.0.0.1:{port}"
    try:
        async with aiohttp.ClientSession() as session:
            for _ in range(200):
                try:
                    async with session.get(url + "/readyz") as response:
                        if response.status == 200:
                            break
                except aiohttp.ClientConnectionError:
                    await asyncio.sleep(0.05)
            async with session.post(
                url + "/v1/chat/completions", json={"model": "chat-a", "messages": MESSAGES}
            ) as response:
                assert response.status == 200
                assert response.headers["x-prism-provider"] == "alpha"
                assert "beta/up-beta transient 500" in response.headers["x-prism-attempt-log"]
    finally:
        process.send_signal(signal.SIGTERM)
        assert await asyncio.wait_for(process.wait(), 15) == 0
    assert list(tmp_path.iterdir()) == []  # the demo writes nothing where it runs


async def test_the_listen_backlog_is_the_operators(prism_fake, tmp_path):
    port = free_port()
    (tmp_path / "prism.ini").write_text(
        f"[prism]\nlisten = 127.0.0.1:{port}\ncatalog = catalog.toml\nbacklog = 7\n"
    )
    (tmp_path / "catalog.toml").write_text(
        f'[providers.p]\nkind = "openai"\nbase_url = "{prism_fake.base_url("ok")}"\n'
        '[models.m]\nchain = [ { provider = "p", model = "x" } ]\n'
    )
    process = await serve_process(tmp_path / "prism.ini", port)
    try:
        # For a listening socket, ss's Send-Q column is the backlog it was given.
        ss = await asyncio.create_subprocess_exec(
            "ss", "-Hltn", f"sport = :{port}", stdout=asyncio.subprocess.PIPE
        )
        out, _ = await ss.communicate()
        rows = [line.split() for line in out.decode().splitlines()]
        assert [(row[0], row[2]) for row in rows] == [("LISTEN", "7")]
    finally:
        process.send_signal(signal.SIGTERM)
        assert await asyncio.wait_for(process.wait(), 15) == 0
