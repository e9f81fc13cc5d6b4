"""Default authentication: everyone is an anonymous caller.

Start-up warns loudly when no other plugin implements ``prism_authenticate``.
"""

from __future__ import annotations

from ..call import ANONYMOUS, Call, Principal
from ..hookimpl import hookimpl


@hookimpl(trylast=True)
def prism_authenticate(call: Call) -> Principal:
    return ANONYMOUS
