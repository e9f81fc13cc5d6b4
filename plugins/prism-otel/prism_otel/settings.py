"""``[prism:otel]``: where spans go."""

from __future__ import annotations

import logging

import attrs

from prism_proxy import Config, redact_url

__all__ = ["SECTION", "OtelSettings"]

log = logging.getLogger("prism.otel")

SECTION = "otel"
_KEYS = frozenset({"endpoint", "enabled", "service_name", "batch_delay_ms"})


@attrs.frozen
class OtelSettings:
    #: OTLP/HTTP traces endpoint (``http://collector:4318/v1/traces``); None: no export.
    endpoint: str | None = None
    service_name: str = "prism"
    #: How long spans wait to be sent in a batch.
    batch_delay_ms: int = 5000

    @classmethod
    def from_config(cls, config: Config) -> OtelSettings | None:
        """None when tracing is off: no ``endpoint`` and not ``enabled``.

        A section that leaves tracing off without saying ``enabled = false`` gets
        a WARNING, not an error: traces are worth a loud line, not an outage.
        """
        section = config.section(SECTION)
        section.check_keys(_KEYS)
        endpoint = section.get_str("endpoint")
        if endpoint is not None and not endpoint.startswith(("http://", "https://")):
            raise section.error(
                "endpoint",
                f"expected an http(s) URL of an OTLP/HTTP receiver, got {redact_url(endpoint)!r}",
            )
        if endpoint is None and not section.get_bool("enabled", False):
            if section.written and "enabled" not in section:
                log.warning(
                    "%s",
                    section.warning(
                        "endpoint",
                        "not set, and enabled is not true: prism-otel is off and makes no "
                        "spans (set endpoint = http://collector:4318/v1/traces, or "
                        "enabled = false to say off is meant)",
                    ),
                )
            return None
        return cls(
            endpoint=endpoint,
            service_name=section.get_str("service_name") or "prism",
            batch_delay_ms=section.get_int("batch_delay_ms", 5000, min=10, max=60_000),
        )
