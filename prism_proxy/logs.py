"""The process's log output: text lines (the default) or one JSON object per line.

``[prism] log_format = json`` writes every record as one JSON object: ``ts``,
``level``, ``logger``, ``message``, and for the access line (logger
``prism.calls``) its fields as they are (see ``answers.access_fields``).
JSON escapes every control character, so no value can start a new line.
"""

from __future__ import annotations

import datetime
import logging
import sys
from typing import Any

import orjson

__all__ = ["FORMATS", "JsonFormatter", "configure_logging"]

FORMATS = ("text", "json")
TEXT_FORMAT = "%(asctime)s %(levelname)s %(name)s: %(message)s"


class JsonFormatter(logging.Formatter):
    """One JSON object per record, on one line."""

    def format(self, record: logging.LogRecord) -> str:
        out: dict[str, Any] = {
            "ts": datetime.datetime.fromtimestamp(record.created, datetime.UTC).isoformat(
                timespec="milliseconds"
            ),
            "level": record.levelname,
            "logger": record.name,
        }
        access = getattr(record, "access", None)
        if isinstance(access, dict):
            out["message"] = "access"
            out.update(access)
        else:
            out["message"] = record.getMessage()
        if record.exc_info:
            out["exception"] = self.formatException(record.exc_info)
        return orjson.dumps(out, default=str).decode()


def configure_logging(level: str, log_format: str) -> None:
    handler = logging.StreamHandler(sys.stderr)
    handler.setFormatter(
        JsonFormatter() if log_format == "json" else logging.Formatter(TEXT_FORMAT)
    )
    logging.basicConfig(level=level, handlers=[handler])
