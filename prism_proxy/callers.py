"""Who is calling: a request's :class:`Call`, authenticated as every API endpoint does it."""

from __future__ import annotations

from aiohttp import web

from .call import Call, Endpoint, new_id
from .gateway import GATEWAY
from .generation import Generation

__all__ = ["authenticate", "caller"]


def authenticate(generation: Generation, call: Call) -> None:
    """Set ``call.principal`` as ``prism_authenticate`` says (raises PrismError on refusal)."""
    hook = generation.hooks.authenticate
    principal = hook(call=call) if hook is not None else None
    if principal is not None:
        call.principal = principal


def caller(request: web.Request, endpoint: Endpoint, *, authenticated: bool = True) -> Call:
    """A new call of ``endpoint`` on the current generation; authenticated unless told not."""
    generation = request.app[GATEWAY].current
    call = Call(
        request_id=new_id("req_"),
        endpoint=endpoint,
        received_at=generation.clock(),
        request=request,
        generation=generation,
    )
    if authenticated:
        authenticate(generation, call)
    return call
