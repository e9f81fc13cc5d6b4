"""Azure OpenAI's error model, for attempts on ``azure-openai`` lines.

Azure answers in OpenAI's wire but with errors of its own: a prompt its
content filter refuses is a 400 whose ``error.code`` is ``content_filter``
(``innererror.code`` ``ResponsibleAIPolicyViolation``, with the categories in
``innererror.content_filter_result``); a deployment it does not have is a 404
``DeploymentNotFound``; a 429 says when to come back in ``retry-after-ms`` and
``retry-after``.  Anything else is the default classifier's.
"""

from __future__ import annotations

from typing import Any

from prism_proxy import (
    Outcome,
    UpstreamResult,
    Verdict,
    content_filtered,
    error_model,
    model_not_found,
    parse_retry_after,
)

__all__ = ["classify_azure"]

#: At most this many filtered category names in a verdict's reason.
_MAX_CATEGORIES = 4


def _error(payload: Any) -> dict[str, Any] | None:
    error = payload.get("error") if isinstance(payload, dict) else None
    return error if isinstance(error, dict) else None


def _filtered_categories(inner: Any) -> list[str]:
    """The categories Azure says it filtered on (names only, never the prompt)."""
    result = inner.get("content_filter_result") if isinstance(inner, dict) else None
    if not isinstance(result, dict):
        return []
    names = [
        name
        for name, verdict in result.items()
        if isinstance(name, str)
        and len(name) <= 40
        and isinstance(verdict, dict)
        and (verdict.get("filtered") is True or verdict.get("detected") is True)
    ]
    return names[:_MAX_CATEGORIES]


@error_model
def classify_azure(
    result: UpstreamResult, extra_markers: tuple[str, ...] = (), /
) -> Verdict | None:
    """A verdict for an Azure OpenAI answer, or None to let the default decide.

    The permanent markers are left to the default, which reads OpenAI's bodies.
    """
    status = result.status
    if status == 200:
        return None  # answers (and a content-filtered finish) are the core's to judge
    error = _error(result.json)
    code = error.get("code") if error is not None else None
    inner = error.get("innererror") if error is not None else None
    inner_code = inner.get("code") if isinstance(inner, dict) else None
    if status == 400 and (code == "content_filter" or inner_code == "ResponsibleAIPolicyViolation"):
        categories = _filtered_categories(inner)
        said = f" ({', '.join(categories)})" if categories else ""
        return content_filtered(f"Azure content filter refused the prompt{said}")
    if status == 404 and code == "DeploymentNotFound":
        return model_not_found("deployment not found")
    if status == 429:
        return Verdict(Outcome.RATE_LIMITED, "rate limited", parse_retry_after(result.headers))
    return None
