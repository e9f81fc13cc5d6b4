"""Upstreams behind an egress proxy: HTTPS_PROXY/HTTP_PROXY/NO_PROXY and a provider's ``proxy``.

The forward proxy is a real one, proxy.py (a package from the index), run as
its own process; the upstream is the fake, over TLS with a certificate made
here and trusted through ``SSL_CERT_FILE``.  What the proxy carried is read
from its access log, which it writes when a connection ends.
"""

from __future__ import annotations

import asyncio
import logging
import signal
import socket
import ssl
import subprocess
import sys
import time
from collections.abc import AsyncIterator, Callable, Iterator
from pathlib import Path
from typing import Any

import aiohttp
import attrs
import openai
import pytest
from prism_fake_upstream import FakeUpstream

from prism_proxy.cli import main
from prism_proxy.testing import free_port, serve_process

MESSAGES = [{"role": "user", "content": "hello"}]
#: The password of the proxy that asks for one; the wrong one some providers send.
PASSWORD, WRONG = "s3cr@t-pw", "n0t-the-pw"
REFUSED_407 = "egress proxy refused: 407 Proxy Authentication Required"


@attrs.frozen
class ForwardProxy:
    url: str
    log: Path

    def with_credentials(self, user: str, password: str) -> str:
        # The password is percent-encoded in a URL: its "@" is %40.
        return self.url.replace("http://", f"http://{user}:{password.replace('@', '%40')}@")

    async def saw(self, line: str, timeout_s: float = 10.0) -> bool:
        """Whether the access log has ``line`` (written as connections end)."""
        deadline = time.monotonic() + timeout_s
        while line not in self.log.read_text():
            if time.monotonic() > deadline:
                return False
            await asyncio.sleep(0.05)
        return True


def _start_proxy(directory: Path, *args: str) -> Iterator[ForwardProxy]:
    port_file, log = directory / "port", directory / "access.log"
    process = subprocess.Popen(
        [
            *(sys.executable, "-m", "proxy", "--hostname", "127.0.0.1", "--port", "0"),
            *("--port-file", str(port_file), "--log-file", str(log), "--data-dir", str(directory)),
            *("--num-acceptors", "1", "--num-workers", "1", *args),
        ],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    try:
        deadline = time.monotonic() + 30
        while not port_file.exists() or not port_file.read_text().endswith("\n"):
            assert process.poll() is None, "proxy.py exited at start-up"
            assert time.monotonic() < deadline, "proxy.py did not start"
            time.sleep(0.05)
        # The port file is written once the socket listens: connections queue from here.
        yield ForwardProxy(f"http://127.0.0.1:{int(port_file.read_text().split()[0])}", log)
    finally:
        process.terminate()
        process.wait(timeout=10)


@pytest.fixture(scope="module")
def plain_proxy(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ForwardProxy]:
    yield from _start_proxy(tmp_path_factory.mktemp("proxy"))


@pytest.fixture(scope="module")
def auth_proxy(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ForwardProxy]:
    directory = tmp_path_factory.mktemp("auth-proxy")
    yield from _start_proxy(directory, "--basic-auth", f"prism:{PASSWORD}")


@pytest.fixture(scope="module")
def certificate(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path]:
    """A self-signed certificate for localhost and 127.0.0.1, and its key."""
    directory = tmp_path_factory.mktemp("tls")
    cert, key = directory / "cert.pem", directory / "key.pem"
    subprocess.run(
        [
            *("openssl", "req", "-x509", "-nodes", "-days", "2", "-subj", "/CN=localhost"),
            *("-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:prime256v1", "-keyout", str(key)),
            *("-out", str(cert), "-addext", "subjectAltName=DNS:localhost,IP:127.0.0.1"),
        ],
        check=True,
        capture_output=True,
    )
    return cert, key


@attrs.define
class TlsUpstream:
    fake: FakeUpstream
    #: The server names clients asked for (SNI), in order.
    names: list[str | None]

    def base_url(self, scenario: str, host: str = "localhost") -> str:
        return self.fake.base_url(scenario).replace("127.0.0.1", host)

    @property
    def authority(self) -> str:
        return self.fake.url.removeprefix("https://").replace("127.0.0.1", "localhost")


@pytest.fixture
async def tls_fake(
    certificate: tuple[Path, Path], monkeypatch: pytest.MonkeyPatch
) -> AsyncIterator[TlsUpstream]:
    """The fake upstream over https, its certificate trusted by the gateway's client."""
    cert, key = certificate
    context = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
    context.load_cert_chain(cert, key)
    names: list[str | None] = []

    def record(_sock: ssl.SSLObject, name: str | None, _context: ssl.SSLContext) -> None:
        names.append(name)

    context.sni_callback = record
    # OpenSSL's own variable: the trust store the gateway's default context loads.
    monkeypatch.setenv("SSL_CERT_FILE", str(cert))
    async with FakeUpstream(ssl_context=context) as fake:
        yield TlsUpstream(fake, names)


@pytest.fixture
def refusing() -> Iterator[Callable[[], int]]:
    """Loopback ports that refuse connections for the whole test: bound, never listening
    (a port merely free a moment ago may be another test's by the time it is tried)."""
    held: list[socket.socket] = []

    def port() -> int:
        sock = socket.socket()
        held.append(sock)
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])

    yield port
    for sock in held:
        sock.close()


def one_model(*lines: tuple[str, dict[str, Any]]) -> dict[str, Any]:
    """A catalog whose model ``m`` tries each ``(provider name, options)`` once, in order."""
    return {
        "providers": {name: {"kind": "openai", **options} for name, options in lines},
        "models": {
            "m": {"chain": [{"provider": name, "model": "up"} for name, _ in lines], "retries": 0}
        },
    }


async def chat(gw: Any) -> Any:
    return await gw.openai().chat.completions.with_raw_response.create(model="m", messages=MESSAGES)


def attempt_log(raw: Any) -> list[list[str]]:
    return [entry.split()[:2] for entry in raw.headers["x-prism-attempt-log"].split("; ")]


async def test_https_proxy_from_the_environment_carries_tls_in_a_connect_tunnel(
    prism_gateway, tls_fake, plain_proxy, monkeypatch
):
    with monkeypatch.context() as env:
        env.setenv("HTTPS_PROXY", plain_proxy.url)
        gw = await prism_gateway(one_model(("tls", {"base_url": tls_fake.base_url("ok")})))
    # The environment is read when the generation is built, not per call.
    for _ in range(2):
        raw = await chat(gw)
        assert raw.parse().choices[0].message.content.startswith("Hello from up.")
    assert tls_fake.fake.hits("ok") == 2
    assert tls_fake.names == ["localhost"]  # one pooled connection, TLS to the upstream's name
    await gw.stop()
    assert await plain_proxy.saw(f"CONNECT {tls_fake.authority} ")


async def test_prism_serve_on_uvloop_tunnels_too(tmp_path, tls_fake, plain_proxy):
    """The served process runs on uvloop, whose ``start_tls`` the tunnel's TLS rests on."""
    port = free_port()
    (tmp_path / "prism.ini").write_text(f"[prism]\nlisten = 127.0.0.1:{port}\ncatalog = c.toml\n")
    (tmp_path / "c.toml").write_text(
        f'[providers.p]\nkind = "openai"\nbase_url = "{tls_fake.base_url("served")}"\n'
        '[models.m]\nchain = [ { provider = "p", model = "x" } ]\n'
    )
    process = await serve_process(
        tmp_path / "prism.ini", port, env={"HTTPS_PROXY": plain_proxy.url}, stderr=None
    )
    try:
        async with aiohttp.ClientSession() as session:
            body = {"model": "m", "messages": MESSAGES}
            url = f"http://127.0.0.1:{port}/v1/chat/completions"
            async with session.post(url, json=body) as response:
                assert response.status == 200
    finally:
        process.send_signal(signal.SIGTERM)
        assert await asyncio.wait_for(process.wait(), 15) == 0
    assert tls_fake.fake.hits("served") == 1
    assert await plain_proxy.saw(f"CONNECT {tls_fake.authority} ")


@pytest.mark.parametrize(
    ("no_proxy", "listed", "unlisted"),
    [
        pytest.param("localhost", "localhost", "127.0.0.1", id="host"),
        pytest.param("example.com, .localhost", "localhost", "127.0.0.1", id="dot-suffix"),
        pytest.param("127.0.0.1:{port}", "127.0.0.1", "localhost", id="address-and-port"),
        pytest.param("10.0.0.0/8,127.0.0.0/8", "127.0.0.1", "localhost", id="network"),
    ],
)
async def test_no_proxy_lists_the_upstreams_reached_directly(
    prism_gateway, prism_fake, monkeypatch, refusing, no_proxy, listed, unlisted
):
    port = prism_fake.url.rsplit(":", 1)[1]
    url = prism_fake.base_url("ok")
    dead = f"http://127.0.0.1:{refusing()}"  # a proxy nothing answers on
    with monkeypatch.context() as env:
        env.setenv("HTTP_PROXY", dead)
        env.setenv("HTTPS_PROXY", dead)
        env.setenv("no_proxy", no_proxy.format(port=port))
        gw = await prism_gateway(
            one_model(
                ("unlisted", {"base_url": url.replace("127.0.0.1", unlisted)}),
                ("listed", {"base_url": url.replace("127.0.0.1", listed)}),
            )
        )
    raw = await chat(gw)
    assert raw.headers["x-prism-provider"] == "listed"
    assert attempt_log(raw) == [["unlisted/up", "transient"], ["listed/up", "ok"]]


async def test_an_unreachable_proxy_fails_the_attempt_over_and_says_so(
    prism_gateway, prism_fake, monkeypatch, refusing
):
    walled = {"base_url": prism_fake.base_url("ok"), "proxy": f"http://127.0.0.1:{refusing()}"}
    with monkeypatch.context() as env:
        env.setenv("HTTP_PROXY", f"http://127.0.0.1:{refusing()}")
        # proxy = "none": direct, whatever the environment says.
        gw = await prism_gateway(
            one_model(("walled", walled), ("open", {**walled, "proxy": "none"}))
        )
        lone = await prism_gateway(one_model(("walled", walled)))
    raw = await chat(gw)
    assert attempt_log(raw) == [["walled/up", "transient"], ["open/up", "ok"]]
    with pytest.raises(openai.APIStatusError) as info:
        await chat(lone)
    assert info.value.status_code == 503
    [attempt] = info.value.body["attempts"]
    assert (attempt["outcome"], attempt["reason"]) == ("transient", "egress proxy unreachable")


async def test_a_proxy_refusing_the_tunnel_fails_over_to_the_next_line(
    prism_gateway, tls_fake, plain_proxy, monkeypatch, refusing
):
    """proxy.py answers 502 to a CONNECT whose upstream does not answer it."""
    with monkeypatch.context() as env:
        env.setenv("HTTPS_PROXY", plain_proxy.url)
        gw = await prism_gateway(
            one_model(
                ("gone", {"base_url": f"https://localhost:{refusing()}/v1"}),
                ("here", {"base_url": tls_fake.base_url("ok")}),
            )
        )
    raw = await chat(gw)
    assert raw.headers["x-prism-provider"] == "here"
    assert attempt_log(raw) == [["gone/up", "transient"], ["here/up", "ok"]]
    # The same refusal, named, when nothing is left to fail over to.
    gone = one_model(("gone", {"base_url": f"https://localhost:{refusing()}/v1"}))
    with monkeypatch.context() as env:
        env.setenv("HTTPS_PROXY", plain_proxy.url)
        gw = await prism_gateway(gone)
    with pytest.raises(openai.APIStatusError) as info:
        await chat(gw)
    [attempt] = info.value.body["attempts"]
    assert attempt["reason"] == "egress proxy refused: 502 Bad Gateway"


@pytest.mark.parametrize(
    "answer",
    [
        pytest.param(b"SMTP ready\r\n\r\n", id="not-http"),
        pytest.param(b"HTTP/1.1 200 OK\r\n\r\nnot TLS", id="bytes-before-tls"),
        pytest.param(b"HTTP/1.1 200 OK\r\n" + b"X-Pad: " + b"x" * 20_000, id="endless-head"),
        pytest.param(b"", id="hangs-up"),
    ],
)
async def test_a_proxy_that_answers_connect_wrongly_fails_the_attempt(prism_gateway, answer):
    """A hostile or broken proxy: what it said is not believed, and no TLS is tried on it."""

    async def liar(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        await reader.readuntil(b"\r\n\r\n")
        writer.write(answer)
        await writer.drain()
        writer.close()

    server = await asyncio.start_server(liar, "127.0.0.1", 0)
    proxy = f"http://127.0.0.1:{server.sockets[0].getsockname()[1]}"
    try:
        gw = await prism_gateway(
            one_model(("liar", {"base_url": "https://localhost:9/v1", "proxy": proxy}))
        )
        with pytest.raises(openai.APIStatusError) as info:
            await chat(gw)
    finally:
        server.close()
        await server.wait_closed()
    [attempt] = info.value.body["attempts"]
    assert (attempt["outcome"], attempt["reason"]) == ("transient", "egress proxy broke CONNECT")


@pytest.mark.parametrize("scheme", ["https", "http"])
async def test_a_provider_proxy_with_credentials_and_one_with_wrong_ones(
    prism_gateway, prism_fake, tls_fake, auth_proxy, monkeypatch, caplog, refusing, scheme
):
    """The ``proxy`` option wins over the environment; a 407 fails the attempt over,
    named, and the password is nowhere: answers, headers, logs."""
    caplog.set_level(logging.DEBUG)
    base_url = tls_fake.base_url("ok") if scheme == "https" else prism_fake.base_url("ok")
    right = auth_proxy.with_credentials("prism", PASSWORD)
    wrong = auth_proxy.with_credentials("prism", WRONG)
    with monkeypatch.context() as env:
        env.setenv("HTTPS_PROXY", f"http://127.0.0.1:{refusing()}")  # overridden
        env.setenv("HTTP_PROXY", f"http://127.0.0.1:{refusing()}")
        gw = await prism_gateway(
            one_model(
                ("wrong", {"base_url": base_url, "proxy": wrong}),
                ("right", {"base_url": base_url, "proxy": right}),
            )
        )
        lone = await prism_gateway(one_model(("wrong", {"base_url": base_url, "proxy": wrong})))
    raw = await chat(gw)
    assert raw.headers["x-prism-provider"] == "right"
    assert attempt_log(raw) == [["wrong/up", "transient"], ["right/up", "ok"]]
    with pytest.raises(openai.APIStatusError) as info:
        await chat(lone)
    err = info.value
    assert err.status_code == 503
    [attempt] = err.body["attempts"]
    assert (attempt["outcome"], attempt["reason"]) == ("transient", REFUSED_407)
    said = [err.response.text, str(raw.headers), str(err.response.headers), caplog.text]
    for secret in (PASSWORD, WRONG, PASSWORD.replace("@", "%40")):
        assert not any(secret in text for text in said)
    await gw.stop()
    if scheme == "https":
        assert await auth_proxy.saw(f"CONNECT {tls_fake.authority} ")
    else:
        assert await auth_proxy.saw(f"POST {prism_fake.url.removeprefix('http://')}/s/ok/v1/chat/")


@pytest.mark.parametrize(
    ("where", "expected"),
    [
        pytest.param(
            "option",
            "providers.p.proxy: unsupported proxy scheme 'socks5'",
            id="provider-option",
        ),
        pytest.param(
            "environment",
            "environment: HTTPS_PROXY: unsupported proxy scheme 'socks5'",
            id="environment",
        ),
    ],
)
def test_a_proxy_that_is_not_an_http_proxy_stops_start_up_without_its_password(
    tmp_path, capsys, monkeypatch, where, expected
):
    url = "socks5://prism:hunter2@127.0.0.1:1080"
    option = f'proxy = "{url}"\n' if where == "option" else ""
    if where == "environment":
        monkeypatch.setenv("HTTPS_PROXY", url)
    (tmp_path / "catalog.toml").write_text(
        f'[providers.p]\nkind = "openai"\nbase_url = "https://127.0.0.1:9/v1"\n{option}'
        '[models.m]\nchain = [ { provider = "p", model = "x" } ]\n'
    )
    (tmp_path / "prism.ini").write_text("[prism]\ncatalog = catalog.toml\n")
    status = main(["check", "--config", str(tmp_path / "prism.ini")])
    err = capsys.readouterr().err
    assert status == 2
    assert expected in err
    assert "hunter2" not in err
