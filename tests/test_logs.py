"""`[prism] log_format = json`: a JSON object per line, the access fields, nothing secret."""

from __future__ import annotations

import asyncio

import aiohttp
import orjson

from prism_proxy.testing import free_port, installed_plugins, serve_process


async def test_json_logs_are_one_object_per_line_with_the_access_fields(prism_fake, tmp_path):
    port = free_port()
    disable = ", ".join(sorted(set(installed_plugins()) - {"openai"}))
    (tmp_path / "catalog.toml").write_text(
        f'[providers.p]\nkind = "openai"\nbase_url = "{prism_fake.base_url("ok")}"\n'
        '[models.m]\nchain = [ { provider = "p", model = "up", region = "eu-west-1" } ]\n'
    )
    ini = tmp_path / "prism.ini"
    ini.write_text(
        f"[prism]\nlisten = 127.0.0.1:{port}\ncatalog = catalog.toml\nlog_format = json\n"
        f"shutdown_grace_s = 1\ndisable = {disable}\n"
    )
    log_path = tmp_path / "stderr.log"
    process = await serve_process(ini, port, stderr=log_path.open("ab"))
    url = f"http://127.0.0.1:{port}/v1/chat/completions"
    prompt = "my very private prompt"
    try:
        async with aiohttp.ClientSession() as session:
            body = {"model": "m", "messages": [{"role": "user", "content": prompt}]}
            async with session.post(url, json=body, headers={"Authorization": "Bearer sk-x"}) as r:
                assert r.status == 200
                served_id = r.headers["x-prism-request-id"]
            # A model name that tries to forge a log line of its own.
            forged = {
                "model": 'm\n{"level": "INFO", "message": "forged"}',
                "messages": body["messages"],
            }
            async with session.post(url, json=forged) as r:
                assert r.status == 404
    finally:
        process.terminate()
        await asyncio.wait_for(process.wait(), 15)

    lines = log_path.read_text().splitlines()
    records = [orjson.loads(line) for line in lines]  # every line is one JSON object
    assert all({"ts", "level", "logger", "message"} <= set(r) for r in records)
    access = [r for r in records if r["logger"] == "prism.calls"]
    served = next(r for r in access if r["request_id"] == served_id)
    assert served["endpoint"] == "chat" and served["model"] == "m"
    assert (served["provider"], served["upstream_model"], served["region"]) == (
        "p",
        "up",
        "eu-west-1",
    )
    assert served["status"] == 200 and served["outcome"] == "ok" and served["attempts"] == 1
    assert served["route"] == "default" and served["code"] is None
    assert served["ttft_ms"] is not None and served["duration_ms"] >= 0
    assert served["finish_reason"] == "stop"
    assert served["input_tokens"] > 0 and served["output_tokens"] > 0
    assert {"org", "key_id"} <= set(served)
    refused = next(r for r in access if r["status"] == 404)
    assert refused["model"].startswith("m\n")  # kept as data, inside its JSON string
    assert not any(r.get("message") == "forged" for r in records)
    text = log_path.read_text()
    assert prompt not in text and "sk-x" not in text
