"""``[prism:otel]``: where spans go, described once on :class:`OtelSettings`."""

from __future__ import annotations

import logging

import attrs

from prism_proxy import Config, Section, read_settings, redact_url, setting

__all__ = ["SECTION", "OtelSettings"]

log = logging.getLogger("prism.otel")

SECTION = "otel"


def _endpoint(section: Section, key: str, default: str | None) -> str | None:
    endpoint = section.get_str(key, default)
    if endpoint is not None and not endpoint.startswith(("http://", "https://")):
        raise section.error(
            key, f"expected an http(s) URL of an OTLP/HTTP receiver, got {redact_url(endpoint)!r}"
        )
    return endpoint


def _name(section: Section, key: str, default: str) -> str:
    return section.get_str(key, default) or default  # blank: the default, not a nameless service


@attrs.frozen
class OtelSettings:
    #: None: no export (spans only for a processor an embedding app adds).
    endpoint: str | None = setting(
        None,
        help="an OTLP/HTTP traces receiver, e.g. `http://collector:4318/v1/traces`; spans are "
        "batched and sent there",
        parse=_endpoint,
        type_text="`http://` or `https://` URL",
    )
    enabled: bool = setting(
        False,
        help="make spans without an `endpoint` (an embedding app or a test adds its own span "
        "processor to `tracing_of(generation).provider`)",
    )
    service_name: str = setting("prism", help="the `service.name` resource attribute", parse=_name)
    batch_delay_ms: int = setting(
        5000, min=10, max=60_000, help="how long spans wait to be sent in a batch"
    )

    @classmethod
    def from_config(cls, config: Config) -> OtelSettings | None:
        """None when tracing is off: no ``endpoint`` and not ``enabled``.

        A section that leaves tracing off without saying ``enabled = false`` gets
        a WARNING, not an error: traces are worth a loud line, not an outage.
        """
        section = config.section(SECTION)
        settings = read_settings(cls, section)
        if settings.endpoint is None and not settings.enabled:
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
        return settings
