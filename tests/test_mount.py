"""create_app() composes: mounted under a prefix inside someone else's aiohttp app."""

from __future__ import annotations

import openai
from aiohttp import web

from prism_proxy import config_from_mapping, create_app
from prism_proxy.server import listen


async def test_mounted_under_a_prefix(prism_fake, catalog):
    root = web.Application()

    async def own_route(request: web.Request) -> web.Response:
        return web.Response(text="the host app")

    root.router.add_get("/", own_route)
    root.add_subapp("/llm", create_app(config_from_mapping({}, catalog_data=catalog)))
    listening = await listen(root, "127.0.0.1", 0, grace_s=1)
    try:
        client = openai.AsyncOpenAI(base_url=listening.url + "/llm/v1", api_key="x", max_retries=0)
        completion = await client.chat.completions.create(
            model="chat-a", messages=[{"role": "user", "content": "hi"}]
        )
        assert completion.model == "up-alpha"
        assert [m.id async for m in client.models.list()] == ["chat-a", "embed-a"]
    finally:
        await listening.stop()
