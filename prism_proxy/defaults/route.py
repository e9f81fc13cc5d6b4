"""Default routing: the model's own chain, in catalog order."""

from __future__ import annotations

from ..call import Call, Route
from ..hookimpl import hookimpl


@hookimpl(trylast=True)
def prism_select_route(call: Call) -> Route | None:
    if call.model is None:
        return None
    return Route(bindings=call.model.chain)
