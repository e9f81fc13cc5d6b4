"""The `prism` command's own surface: version, help, --listen, a busy port, config mistakes."""

from __future__ import annotations

import asyncio
import importlib.metadata
import logging
import signal
import socket
import sys
from pathlib import Path

import aiohttp
import pytest
from aiohttp import web

from prism_proxy import hookimpl
from prism_proxy.cli import main
from prism_proxy.server import CannotListen, listen
from prism_proxy.testing import free_port, serve_process

MESSAGES = [{"role": "user", "content": "hi"}]
CATALOG = (
    '[providers.p]\nkind = "openai"\nbase_url = "http://127.0.0.1:9/v1"\n'
    '[models.m]\nchain = [ { provider = "p", model = "x" } ]\n'
)


def write_config(directory: Path, prism: str = "", extra: str = "") -> Path:
    """``prism.ini`` (with ``prism`` added to its [prism] section) and a catalog."""
    (directory / "catalog.toml").write_text(CATALOG)
    ini = directory / "prism.ini"
    ini.write_text(f"[prism]\ncatalog = catalog.toml\nlog_level = INFO\n{prism}\n{extra}")
    return ini


async def prism_process(*args: str, cwd: Path | None = None) -> asyncio.subprocess.Process:
    return await asyncio.create_subprocess_exec(
        sys.executable,
        "-m",
        "prism_proxy.cli",
        *args,
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.PIPE,
        cwd=cwd,
    )


async def wait_ready(process: asyncio.subprocess.Process, url: str) -> None:
    async with aiohttp.ClientSession() as session:
        for _ in range(300):
            assert process.returncode is None, "prism exited before it was ready"
            try:
                async with session.get(url + "/readyz") as response:
                    if response.status == 200:
                        return
            except aiohttp.ClientConnectionError:
                pass
            await asyncio.sleep(0.05)
    raise AssertionError(f"{url} did not become ready")


async def stop(process: asyncio.subprocess.Process) -> str:
    """SIGTERM, the exit status 0, and what it wrote on stderr."""
    if process.returncode is None:
        process.send_signal(signal.SIGTERM)
    assert await asyncio.wait_for(process.wait(), 15) == 0
    assert process.stderr is not None
    return (await process.stderr.read()).decode()


# -- prism --version, prism ---------------------------------------------------------


def test_version_names_the_distribution_version(capsys):
    with pytest.raises(SystemExit) as exit:
        main(["--version"])
    assert exit.value.code == 0
    assert capsys.readouterr().out == f"prism {importlib.metadata.version('prism-llm-gateway')}\n"


def test_no_arguments_prints_the_help(tmp_path, monkeypatch, capsys):
    monkeypatch.chdir(tmp_path)
    assert main([]) == 0
    out = capsys.readouterr().out
    assert out.startswith("usage: prism")
    for command in ("serve", "check", "plugins", "demo"):
        assert command in out


# -- prism serve --listen -------------------------------------------------------------


async def test_serve_listen_overrides_the_config(tmp_path):
    configured, asked = free_port(), free_port()
    ini = write_config(tmp_path, f"listen = 127.0.0.1:{configured}")
    process = await prism_process("serve", "--config", str(ini), "--listen", f"127.0.0.1:{asked}")
    try:
        await wait_ready(process, f"http://127.0.0.1:{asked}")
        with socket.socket() as probe:
            assert probe.connect_ex(("127.0.0.1", configured)) != 0
    finally:
        stderr = await stop(process)
    assert f"Prism listening on http://127.0.0.1:{asked}" in stderr


@pytest.mark.parametrize(
    ("value", "problem"),
    [
        ("8400", "expected HOST:PORT, got '8400'"),
        ("localhost:http", "port must be a number, got 'http'"),
        ("127.0.0.1:70000", "port out of range: 70000"),
    ],
)
def test_serve_listen_is_checked_like_the_config_key(tmp_path, capsys, value, problem):
    ini = write_config(tmp_path)
    with pytest.raises(SystemExit) as exit:
        main(["serve", "--config", str(ini), "--listen", value])
    assert exit.value.code == 2
    assert f"argument --listen: {problem}" in capsys.readouterr().err


# -- a busy port ------------------------------------------------------------------------


async def test_a_busy_port_is_one_line_and_touches_nothing(tmp_path):
    with socket.socket() as holder:
        holder.bind(("127.0.0.1", 0))
        holder.listen()
        port = holder.getsockname()[1]
        ini = write_config(
            tmp_path,
            f"listen = 127.0.0.1:{port}",
            "[prism:breaker]\nstate_path = state.sqlite\n",
        )
        process = await prism_process("serve", "--config", str(ini), cwd=tmp_path)
        stdout, stderr = await asyncio.wait_for(process.communicate(), 30)
    assert process.returncode == 1
    assert stderr.decode() == f"prism: cannot listen on 127.0.0.1:{port}: address already in use\n"
    assert stdout == b""
    assert not (tmp_path / "state.sqlite").exists()


async def test_listen_binds_before_the_apps_start_up_runs():
    started: list[str] = []

    async def start_up(app: web.Application):
        started.append("start-up")
        yield

    app = web.Application()
    app.cleanup_ctx.append(start_up)
    with socket.socket() as holder:
        holder.bind(("127.0.0.1", 0))
        holder.listen()
        port = holder.getsockname()[1]
        with pytest.raises(CannotListen) as info:
            await listen(app, "127.0.0.1", port, grace_s=0)
    assert str(info.value) == f"cannot listen on 127.0.0.1:{port}: address already in use"
    assert started == []


# -- the admin-token warning ------------------------------------------------------------

UNSET = "PRISM_TEST_ADMIN_TOKEN_NEVER_SET"


def admin_warnings(caplog) -> list[str]:
    return [r.getMessage() for r in caplog.records if "admin_token_env" in r.getMessage()]


class Hello:
    @hookimpl
    def prism_cli(self, commands):
        commands.add("hello", "say hello", lambda args, config: 0)


def test_only_serve_warns_about_an_unset_admin_token(tmp_path, monkeypatch, caplog, capsys):
    from prism_proxy import plugins

    def with_hello(config, **kwargs):
        return plugins.make_plugin_manager(config, extra_plugins=[(Hello(), "hello")])

    monkeypatch.setattr("prism_proxy.cli.make_plugin_manager", with_hello)
    monkeypatch.delenv(UNSET, raising=False)
    ini = str(write_config(tmp_path, f"admin_token_env = {UNSET}"))
    caplog.set_level(logging.WARNING)
    assert main(["check", "--config", ini]) == 0
    assert main(["plugins", "--config", ini]) == 0
    assert main(["hello", "--config", ini]) == 0  # a plugin's command
    assert admin_warnings(caplog) == []
    assert UNSET not in capsys.readouterr().err


async def test_serve_warns_about_an_unset_admin_token(tmp_path, monkeypatch):
    monkeypatch.delenv(UNSET, raising=False)
    port = free_port()
    ini = write_config(tmp_path, f"listen = 127.0.0.1:{port}\nadmin_token_env = {UNSET}")
    process = await serve_process(ini, port)
    stderr = await stop(process)
    assert stderr.count(f"admin_token_env: {UNSET} is not set; the admin API stays off") == 1


# -- prism demo --upstream-port -----------------------------------------------------------


async def test_demo_on_another_upstream_port(tmp_path):
    port, upstream = free_port(), free_port()
    process = await prism_process(
        "demo", "--listen", f"127.0.0.1:{port}", "--upstream-port", str(upstream), cwd=tmp_path
    )
    url = f"http://127.0.0.1:{port}"
    try:
        await wait_ready(process, url)
        async with aiohttp.ClientSession() as session:
            async with session.post(
                url + "/v1/chat/completions", json={"model": "chat-a", "messages": MESSAGES}
            ) as response:
                assert response.status == 200
                assert response.headers["x-prism-provider"] == "alpha"
    finally:
        await stop(process)
    assert process.stdout is not None
    banner = (await process.stdout.read()).decode()
    assert f"Prism demo on {url} (fake upstream on 127.0.0.1:{upstream})." in banner
    assert list(tmp_path.iterdir()) == []


# -- ini files that are not ini ---------------------------------------------------------


@pytest.mark.parametrize(
    ("text", "where"),
    [
        (
            "# Prism\n\nthis is not ini\n[prism]\ncatalog = catalog.toml\n",
            "line 3: not a valid ini file (a key outside any section)",
        ),
        (
            "[prism]\ncatalog = catalog.toml\nlisten = 127.0.0.1:1\nlisten = 127.0.0.1:2\n",
            "line 4: not a valid ini file ([prism] listen is set twice)",
        ),
        (
            "[prism]\ncatalog = catalog.toml\n[prism:breaker]\n[prism:breaker]\n",
            "line 4: not a valid ini file (section [prism:breaker] appears twice)",
        ),
        (
            "[prism]\ncatalog = catalog.toml\nthis is not ini\n",
            "line 3: not a valid ini file (not a [section], a key = value or a comment)",
        ),
    ],
)
def test_an_ini_syntax_error_names_the_line(tmp_path, capsys, text, where):
    ini = tmp_path / "prism.ini"
    ini.write_text(text)
    assert main(["check", "--config", str(ini)]) == 2
    assert capsys.readouterr().err == f"prism: configuration error: {ini}: {where}\n"
