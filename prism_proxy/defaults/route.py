"""Default routing: the model's own chain, in catalog order."""

from __future__ import annotations

from ..call import Route
from ..catalog import ModelSpec
from ..hookimpl import hookimpl


@hookimpl(trylast=True)
def prism_select_route(model: ModelSpec) -> Route:
    return Route(bindings=model.chain)
