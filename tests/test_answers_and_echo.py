"""Answers a caller can act on: an id on every response, a 404 that says what exists,
an attempt log that reads as written, and a caller's text repeated only so far."""

from __future__ import annotations

import logging
from typing import Any

import aiohttp
import openai
import pytest

from prism_proxy import hookimpl
from prism_proxy.errors import ECHO_LIMIT

MESSAGES = [{"role": "user", "content": "hi"}]
API = [
    "POST /v1/chat/completions",
    "POST /v1/embeddings",
    "POST /v1/messages",
    "POST /v1/responses",
    "GET /v1/responses/{response_id}",
    "DELETE /v1/responses/{response_id}",
    "GET /v1/responses/{response_id}/input_items",
    "POST /v1/messages/count_tokens",
    "GET /v1/models",
    "GET /v1/models/{model}",
]


async def test_every_answer_carries_a_request_id(prism_gateway, catalog, prism_clock):
    gw = await prism_gateway(catalog, clock=prism_clock)  # the retries' pauses take no time
    ids = []
    async with aiohttp.ClientSession() as session:
        for method, path, body in (
            ("GET", "/v1/batches", None),  # 404
            ("DELETE", "/v1/models", None),  # 405
            ("GET", "/v1/models", None),
            ("GET", "/v1/models/nope", None),
            ("GET", "/healthz", None),
            ("POST", "/v1/chat/completions", {"model": "nope", "messages": MESSAGES}),
            ("POST", "/v1/chat/completions", {"model": "chat-a", "messages": MESSAGES}),
        ):
            async with session.request(method, gw.url + path, json=body) as response:
                ids.append((path, response.status, response.headers.get("x-prism-request-id")))
    assert [status for _, status, _ in ids] == [404, 405, 200, 404, 200, 404, 200]
    assert all(rid and rid.startswith("req_") for _, _, rid in ids), ids
    assert len({rid for _, _, rid in ids}) == len(ids)


async def test_an_unknown_path_names_itself_and_the_endpoints_that_exist(prism_gateway, catalog):
    gw = await prism_gateway(catalog)
    with pytest.raises(openai.NotFoundError) as missing:
        await gw.openai().batches.create(
            completion_window="24h", endpoint="/v1/chat/completions", input_file_id="file-1"
        )
    error = missing.value.body
    assert isinstance(error, dict) and error["code"] == "not_found"
    assert "/v1/batches" in error["message"]
    assert "POST /v1/chat/completions" in error["message"]
    assert error["endpoints"] == API
    assert missing.value.response.headers["x-prism-request-id"].startswith("req_")


async def test_a_huge_model_name_is_cut_in_the_answer_and_the_access_log(
    prism_gateway, prism_fake, catalog, caplog, prism_clock
):
    caplog.set_level(logging.INFO, logger="prism.calls")
    long_but_real = "a-model-whose-name-is-long-" * 6  # longer than ECHO_LIMIT, in the catalog
    assert len(long_but_real) > ECHO_LIMIT
    catalog["models"][long_but_real] = catalog["models"]["chat-a"]
    gw = await prism_gateway(catalog, clock=prism_clock)
    client = gw.openai()
    huge = "".join(chr(ord("a") + i % 26) for i in range(100_000))
    with pytest.raises(openai.NotFoundError) as missing:
        await client.chat.completions.create(model=huge, messages=MESSAGES)
    error: Any = missing.value.body
    cut = huge[:ECHO_LIMIT] + "…"
    assert error["code"] == "model_not_found" and error["param"] == "model"
    assert f"'{cut}'" in error["message"] and len(error["message"]) < 2 * ECHO_LIMIT + 100
    access = [r for r in caplog.records if r.name == "prism.calls"]
    assert len(access) == 1 and access[0].access["model"] == cut  # type: ignore[attr-defined]
    assert len(access[0].getMessage()) < ECHO_LIMIT + 400

    # A name the catalog has is never cut, however long.
    served = await client.chat.completions.create(model=long_but_real, messages=MESSAGES)
    assert served.choices[0].message.content
    # The last access line (another test's lingering task may log after it).
    last = [r for r in caplog.records if r.name == "prism.calls"][-1]
    assert last.access["model"] == long_but_real  # type: ignore[attr-defined]

    async with aiohttp.ClientSession() as session:
        async with session.get(gw.url + "/v1/" + "p" * 8000) as response:
            raw = await response.read()
            body = await response.json()
    assert response.status == 404 and len(raw) < 2000
    assert f"/v1/{'p' * (ECHO_LIMIT - 4)}…" in body["error"]["message"]


class Semicolons:
    """Leaves its first binding out and notes why, in words with a ``;``."""

    @hookimpl(wrapper=True)
    def prism_select_route(self, call: Any, model: Any) -> Any:
        route = yield
        first, *rest = route.bindings
        route.skipped.append((first, "test: sick; try later"))
        route.notes.append("test: one;two")
        route.bindings = tuple(rest)
        return route


async def test_the_attempt_log_keeps_the_reasons_words_apart(prism_gateway, prism_fake):
    catalog = {
        "providers": {
            "ok": {"kind": "openai", "base_url": prism_fake.base_url("ok")},
            "eyes": {"kind": "openai", "base_url": prism_fake.base_url("ok")},
        },
        "models": {
            "m": {
                "chain": [
                    {"provider": "ok", "model": "up-first"},
                    {"provider": "eyes", "model": "up-eyes", "capabilities": ["vision"]},
                    {"provider": "ok", "model": "up-ok"},
                ]
            }
        },
    }
    gw = await prism_gateway(catalog, plugins=[(Semicolons(), "semicolons")])
    tool = {"type": "function", "function": {"name": "f", "parameters": {"type": "object"}}}
    raw = await gw.openai().chat.completions.with_raw_response.create(
        model="m", messages=MESSAGES, tools=[tool]
    )
    entries = raw.headers["x-prism-attempt-log"].split("; ")
    assert entries[:3] == [
        "ok/up-first skipped test: sick, try later",
        "note test: one,two",
        "eyes/up-eyes skipped lacks tools",
    ]
    assert entries[3].startswith("ok/up-ok ok 200 ") and len(entries) == 4
