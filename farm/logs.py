"""Log setup of the long-running commands (``farm worker``, ``farm scheduler``): text or JSON lines.

``FARM_LOG_FORMAT=json`` writes one JSON object per line (``ts`` ISO 8601 UTC, ``level``, ``logger``,
``message``, ``process``, plus ``exc`` with the traceback and any ``extra=`` fields), for log collectors.
"""
from __future__ import annotations

import json
import logging
from datetime import UTC, datetime
from typing import Any

TEXT_FORMAT = "%(asctime)s %(levelname)s %(name)s: %(message)s"
#: attributes every LogRecord has; anything else on a record came from ``extra=`` and is kept
_STANDARD = set(vars(logging.makeLogRecord({}))) | {"message", "asctime", "taskName"}


class JsonFormatter(logging.Formatter):
    """One JSON object per record."""

    def format(self, record: logging.LogRecord) -> str:
        out: dict[str, Any] = {
            "ts": datetime.fromtimestamp(record.created, UTC).isoformat(timespec="milliseconds"),
            "level": record.levelname, "logger": record.name, "message": record.getMessage(),
            "process": record.process,
        }
        if record.exc_info:
            out["exc"] = self.formatException(record.exc_info)
        for key, value in vars(record).items():
            if key not in _STANDARD and not key.startswith("_"):
                out[key] = value
        return json.dumps(out, default=str)


def setup_logging(loglevel: str, fmt: str = "text") -> None:
    """Configure the root logger once: ``loglevel`` (INFO, DEBUG, ...) and ``fmt`` ``text`` or ``json``."""
    handler = logging.StreamHandler()
    handler.setFormatter(JsonFormatter() if fmt == "json" else logging.Formatter(TEXT_FORMAT))
    logging.basicConfig(level=loglevel.upper(), handlers=[handler])
