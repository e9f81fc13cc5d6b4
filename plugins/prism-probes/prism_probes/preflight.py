"""``prism preflight``: is a line fit for traffic?  Three verdicts per binding, or a suite.

- **reachable**: a short call comes back 200;
- **capable**: every capability fixture the line needs passes its contract
  check (chat text with finish reason and usage; a parseable tool call where
  the line declares ``tools``; a vector for embeddings);
- **fast**: a production-shaped prompt (``--prompt-file``, or the shipped
  policy document of about 2,000 tokens under a strict system prompt) gets its
  first token within ``--first-token-ms`` and its whole answer within
  ``--budget-ms``: a line that answers a one-line check quickly may still be
  four times slower on real prompts.

``--suite FILE`` runs a TOML suite's cases against every line of a model's
chain side by side and names any fallback line that fails a case the primary
passes.  Runs against a gateway (``--url``) or starts one in-process from the
configuration; calls are marked ``x-prism-traffic: preflight`` (admin token),
so the ledger keeps them out of every customer total.  Exit 0 only when
everything passed.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import functools
import os
import re
import secrets
import sys
import tomllib
from collections.abc import AsyncIterator, Sequence
from pathlib import Path
from typing import Any

import aiohttp
import attrs
import orjson
from aiohttp import web

from prism_proxy import (
    ADMIN_HEADER,
    GATEWAY,
    Binding,
    Catalog,
    Commands,
    Config,
    authenticating_plugins,
    create_app,
)

from .client import call_gateway
from .fixtures import (
    CHAT,
    EMBEDDINGS,
    STRICT_SYSTEM,
    Answer,
    Fixture,
    fixtures_for,
    load_bodies,
    long_prompt,
)

__all__ = ["add_commands", "run_preflight", "run_suite"]

#: Where --url mode finds the admin token when the configuration has none.
ADMIN_ENV = "PRISM_ADMIN_TOKEN"
API_KEY_ENV = "PRISM_API_KEY"
QUESTION = "A customer asks for a refund on a late order. Which rule applies, and what do you say?"


class KeyRefused(Exception):
    """The gateway answered 401: no line can be judged with this (or without an) API key."""

    def __init__(self, code: str | None) -> None:
        super().__init__(code)
        self.code = code


@attrs.frozen
class Check:
    ok: bool
    detail: str


@attrs.frozen
class LineReport:
    binding: str
    reachable: Check
    capable: Check
    fast: Check

    @property
    def ok(self) -> bool:
        return self.reachable.ok and self.capable.ok and self.fast.ok


def add_commands(commands: Commands) -> None:
    parser = commands.add(
        "preflight",
        "is a line fit for traffic? reachable, capable, fast; or a suite across a chain",
        _run,
    )
    which = parser.add_mutually_exclusive_group(required=True)
    which.add_argument("--model", help="every line of this model's chain")
    which.add_argument("--binding", metavar="PROVIDER/MODEL", help="one line")
    parser.add_argument("--url", help="a running gateway (default: start one in-process)")
    parser.add_argument("--api-key", help=f"the API key to call with (default: ${API_KEY_ENV})")
    parser.add_argument("--endpoint", choices=("chat", "embeddings"), default="chat")
    parser.add_argument("--budget-ms", type=int, default=10_000, help="whole answer (10000)")
    parser.add_argument("--first-token-ms", type=int, default=3_000, help="first token (3000)")
    parser.add_argument("--prompt-file", type=Path, help="the production-shaped prompt")
    parser.add_argument("--dimensions", type=int, help="expected embedding dimension")
    parser.add_argument("--suite", type=Path, help="a TOML suite run across the chain")
    parser.add_argument("--fixtures", type=Path, help="TOML fixture requests replacing ours")
    parser.add_argument("--json", action="store_true", help="machine-readable output")


def _run(args: argparse.Namespace, config: Config) -> int:
    generation = create_app(config)[GATEWAY].current
    catalog = generation.catalog
    api_key = args.api_key or os.environ.get(API_KEY_ENV)
    guards = authenticating_plugins(generation.pm)
    if guards and not api_key:
        # Every call would come back 401: say so once instead of failing every line.
        print(
            f"prism preflight: this configuration requires an API key ({', '.join(guards)}): "
            f"pass --api-key KEY or set ${API_KEY_ENV}",
            file=sys.stderr,
        )
        return 2
    try:
        lines = _lines(catalog, args.model, args.binding)
        suite = _load_suite(args.suite) if args.suite else None
        prompt = args.prompt_file.read_text() if args.prompt_file else long_prompt()
        bodies = load_bodies(args.fixtures) if args.fixtures else {}
    except (ValueError, OSError) as exc:
        print(f"prism preflight: {exc}", file=sys.stderr)
        return 2

    async def main() -> tuple[bool, str]:
        async with _gateway(args, config) as (url, headers):
            async with aiohttp.ClientSession() as session:
                if suite is not None:
                    report = await run_suite(session, url, headers, lines, suite)
                    return report["ok"], _suite_text(report) if not args.json else _dumps(report)
                reports = await run_preflight(
                    session, url, headers, lines, args.endpoint,
                    prompt=prompt, budget_ms=args.budget_ms,
                    first_token_ms=args.first_token_ms, dimensions=args.dimensions,
                    bodies=bodies,
                )  # fmt: skip
                ok = all(r.ok for r in reports)
                return ok, _dumps([attrs.asdict(r) for r in reports]) if args.json else _table(
                    reports, args
                )

    try:
        ok, text = asyncio.run(main())
    except KeyRefused as refused:
        code = f" ({refused.code})" if refused.code else ""
        print(
            f"prism preflight: the gateway refused the API key given{code}"
            if api_key
            else f"prism preflight: the gateway requires an API key{code}: pass --api-key KEY "
            f"or set ${API_KEY_ENV}",
            file=sys.stderr,
        )
        return 2
    print(text)
    return 0 if ok else 1


def _lines(catalog: Catalog, model: str | None, binding: str | None) -> list[Binding]:
    if binding is not None:
        found = catalog.bindings.get(binding)
        if found is None:
            raise ValueError(f"--binding: no {binding!r} in the catalog")
        return [found]
    spec = catalog.models.get(model or "")
    if spec is None:
        raise ValueError(f"--model: no {model!r} in the catalog")
    return list(spec.chain)


@contextlib.asynccontextmanager
async def _gateway(
    args: argparse.Namespace, config: Config
) -> AsyncIterator[tuple[str, dict[str, str]]]:
    """The gateway to call, and the headers that mark the calls as preflight traffic."""
    headers = {"x-prism-traffic": "preflight"}
    api_key = args.api_key or os.environ.get(API_KEY_ENV)
    if api_key:
        headers["Authorization"] = f"Bearer {api_key}"
    if args.url:
        token = config.admin_token or os.environ.get(ADMIN_ENV)
        if not token:
            raise SystemExit(
                f"prism preflight: --url needs the admin token ([prism] admin_token_env or "
                f"${ADMIN_ENV}) to mark its calls as preflight traffic"
            )
        headers[ADMIN_HEADER] = token
        yield args.url, headers
        return
    # In-process: a gateway of our own on a loopback port, with a token only we know.
    config.admin_token = secrets.token_urlsafe(24)
    headers[ADMIN_HEADER] = config.admin_token
    runner = web.AppRunner(create_app(config), handle_signals=False)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    try:
        host, port = runner.addresses[0][:2]
        yield f"http://{host}:{port}", headers
    finally:
        await runner.cleanup()


async def run_preflight(
    session: aiohttp.ClientSession,
    url: str,
    headers: dict[str, str],
    lines: Sequence[Binding],
    endpoint: str,
    *,
    prompt: str,
    budget_ms: int,
    first_token_ms: int,
    dimensions: int | None = None,
    bodies: dict[str, dict[str, Any]] | None = None,
) -> list[LineReport]:
    reports = []
    for line in lines:
        timeout_s = max(budget_ms, first_token_ms) / 1000 * 3 + 5

        call = functools.partial(_call, session, url, headers, line.id, timeout_s)
        fixtures = fixtures_for(line, endpoint, bodies)
        reach = await call(attrs.evolve(fixtures[0], stream=False))
        if reach.status == 401:
            raise KeyRefused(reach.error)
        if reach.status != 200 or reach.error:
            why = f"unreachable: {reach.error or reach.status}"
            skipped = Check(False, "not tried (unreachable)")
            reports.append(LineReport(line.id, Check(False, why), skipped, skipped))
            continue
        reachable = Check(True, f"{reach.total_ms:.0f} ms")
        failures, passed = [], []
        facts = {"dimensions": dimensions}
        for fixture in fixtures:
            answer = await call(fixture)
            problem = answer.error or fixture.check(answer, facts)
            (
                failures.append(f"{fixture.name}: {problem}")
                if problem
                else passed.append(fixture.name)
            )
        capable = Check(not failures, "; ".join(failures) or ", ".join(passed))
        fast = await _fast(call, endpoint, prompt, budget_ms, first_token_ms)
        reports.append(LineReport(line.id, reachable, capable, fast))
    return reports


async def _call(
    session: aiohttp.ClientSession,
    url: str,
    headers: dict[str, str],
    line: str,
    timeout_s: float,
    fixture: Fixture,
    body: dict[str, Any] | None = None,
) -> Answer:
    return await call_gateway(
        session,
        url,
        headers,
        fixture.endpoint,
        line,
        body or fixture.body,
        stream=fixture.stream,
        timeout_s=timeout_s,
    )


async def _fast(
    call: Any, endpoint: str, prompt: str, budget_ms: int, first_token_ms: int
) -> Check:
    if endpoint == "embeddings":
        answer = await call(EMBEDDINGS, {"input": [prompt]})
    else:
        body = {
            "messages": [
                {"role": "system", "content": STRICT_SYSTEM},
                {"role": "user", "content": f"{prompt}\n\n{QUESTION}"},
            ],
            "max_tokens": 200,
            "stream_options": {"include_usage": True},
        }
        answer = await call(CHAT, body)
    if answer.error:
        return Check(False, answer.error)
    first = answer.ttft_ms if answer.ttft_ms is not None else answer.total_ms
    problems = []
    if endpoint == "chat" and first > first_token_ms:
        problems.append(f"first token {first:.0f} ms > {first_token_ms} ms")
    if answer.total_ms > budget_ms:
        problems.append(f"total {answer.total_ms:.0f} ms > {budget_ms} ms")
    detail = f"first token {first:.0f} ms, total {answer.total_ms:.0f} ms"
    return Check(not problems, "; ".join(problems) if problems else detail)


# -- suites -------------------------------------------------------------------------


def _load_suite(path: Path) -> dict[str, Any]:
    try:
        suite = tomllib.loads(path.read_text())
    except tomllib.TOMLDecodeError as exc:
        raise ValueError(f"--suite: {path}: not valid TOML: {exc}") from None
    cases = suite.get("cases")
    if not isinstance(cases, list) or not cases:
        raise ValueError(f"--suite: {path}: needs [[cases]]")
    for i, case in enumerate(cases):
        if not isinstance(case.get("name"), str) or not isinstance(case.get("prompt"), str):
            raise ValueError(f"--suite: {path}: cases[{i}] needs a name and a prompt")
        expect = case.get("expect") or {}
        unknown = set(expect) - {"regex", "json_keys", "tool", "max_ms"}
        if unknown:
            raise ValueError(f"--suite: {path}: cases[{i}].expect: unknown {sorted(unknown)}")
        if "regex" in expect:
            try:
                re.compile(expect["regex"])
            except re.error as exc:
                raise ValueError(f"--suite: {path}: cases[{i}].expect.regex: {exc}") from None
    return suite


def _judge(case: dict[str, Any], answer: Answer) -> str | None:
    if answer.error:
        return answer.error
    expect = case.get("expect") or {}
    if "regex" in expect and not re.search(expect["regex"], answer.text):
        return f"answer does not match /{expect['regex']}/"
    if "json_keys" in expect:
        try:
            data = orjson.loads(answer.text)
        except orjson.JSONDecodeError:
            return "answer is not JSON"
        missing = [k for k in expect["json_keys"] if not isinstance(data, dict) or k not in data]
        if missing:
            return f"JSON lacks {missing}"
    if "tool" in expect:
        names = [(c.get("function") or {}).get("name") for c in answer.tool_calls]
        if expect["tool"] not in names:
            return f"did not call {expect['tool']}"
    if "max_ms" in expect and answer.total_ms > expect["max_ms"]:
        return f"{answer.total_ms:.0f} ms > {expect['max_ms']} ms"
    return None


async def run_suite(
    session: aiohttp.ClientSession,
    url: str,
    headers: dict[str, str],
    lines: Sequence[Binding],
    suite: dict[str, Any],
) -> dict[str, Any]:
    results: dict[str, dict[str, str | None]] = {}
    for case in suite["cases"]:
        messages = [{"role": "user", "content": case["prompt"]}]
        if suite.get("system"):
            messages.insert(0, {"role": "system", "content": suite["system"]})
        body: dict[str, Any] = {"messages": messages, "max_tokens": case.get("max_tokens", 256)}
        if suite.get("tools"):
            body["tools"] = suite["tools"]
        row: dict[str, str | None] = {}
        for line in lines:
            answer = await call_gateway(
                session, url, headers, "chat", line.id, body, stream=False, timeout_s=120
            )
            row[line.id] = _judge(case, answer)
        results[case["name"]] = row
    primary = lines[0].id
    parity = [
        {"case": name, "line": line, "primary": primary, "why": why}
        for name, row in results.items()
        if row[primary] is None
        for line, why in row.items()
        if line != primary and why is not None
    ]
    ok = all(why is None for row in results.values() for why in row.values())
    return {"lines": [line.id for line in lines], "results": results, "parity": parity, "ok": ok}


# -- output ------------------------------------------------------------------------


def _dumps(value: Any) -> str:
    return orjson.dumps(value, option=orjson.OPT_INDENT_2).decode()


def _cell(check: Check) -> str:
    return ("ok " if check.ok else "FAIL ") + check.detail


def _table(reports: list[LineReport], args: argparse.Namespace) -> str:
    rows = [("binding", "reachable", "capable", "fast")]
    rows += [(r.binding, _cell(r.reachable), _cell(r.capable), _cell(r.fast)) for r in reports]
    widths = [max(len(row[i]) for row in rows) for i in range(4)]
    out = ["  ".join(cell.ljust(widths[i]) for i, cell in enumerate(row)).rstrip() for row in rows]
    verdict = "every verdict passed" if all(r.ok for r in reports) else "NOT READY"
    out.append(
        f"\n{verdict} (fast: first token <= {args.first_token_ms} ms, total <= {args.budget_ms} ms)"
    )
    return "\n".join(out)


def _suite_text(report: dict[str, Any]) -> str:
    lines = report["lines"]
    out = ["case".ljust(24) + "  ".join(line.ljust(28) for line in lines)]
    for name, row in report["results"].items():
        cells = ["ok" if row[line] is None else f"FAIL {row[line]}" for line in lines]
        out.append(name.ljust(24) + "  ".join(cell[:28].ljust(28) for cell in cells))
    for gap in report["parity"]:
        out.append(
            f"parity: {gap['line']} fails {gap['case']!r}, which {gap['primary']} passes "
            f"({gap['why']})"
        )
    out.append("\nevery case passed on every line" if report["ok"] else "\nNOT READY")
    return "\n".join(out)
