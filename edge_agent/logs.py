"""Structured logs: one JSON object per line on stderr (journald and log shippers read them as they are).

Fields: ``ts`` (ISO 8601 UTC), ``level``, ``logger``, ``msg``, plus whatever the call passed in ``extra=``
(``source``, ``outbox_depth``, ``model_version``, ``reason``...), and ``exc`` with the traceback of an exception.

>>> import logging
>>> record = logging.LogRecord("precursor.edge", logging.WARNING, __file__, 1, "quarantined %s", ("m1",), None)
>>> record.kind = "future"
>>> line = json.loads(JsonFormatter().format(record))
>>> line["msg"], line["level"], line["kind"]
('quarantined m1', 'WARNING', 'future')
"""

from __future__ import annotations

import json
import logging
import sys
from datetime import UTC, datetime

_STANDARD = set(logging.LogRecord("", 0, "", 0, "", (), None).__dict__) | {"message", "asctime", "taskName"}


class JsonFormatter(logging.Formatter):
    def format(self, record: logging.LogRecord) -> str:
        entry: dict[str, object] = {
            "ts": datetime.fromtimestamp(record.created, UTC).isoformat(timespec="milliseconds"),
            "level": record.levelname,
            "logger": record.name,
            "msg": record.getMessage(),
        }
        for key, value in record.__dict__.items():
            if key not in _STANDARD and not key.startswith("_"):
                entry[key] = value
        if record.exc_info:
            entry["exc"] = self.formatException(record.exc_info)
        return json.dumps(entry, default=str)


def configure_logging(format: str = "json", level: str = "INFO") -> None:
    """Send the agent's logs (``precursor.edge`` and below) to stderr as JSON lines or plain text."""
    logger = logging.getLogger("precursor.edge")
    for handler in list(logger.handlers):
        if getattr(handler, "_precursor_edge", False):
            logger.removeHandler(handler)
    handler = logging.StreamHandler(sys.stderr)
    handler._precursor_edge = True  # type: ignore[attr-defined]
    if format == "json":
        handler.setFormatter(JsonFormatter())
    else:
        handler.setFormatter(logging.Formatter("%(asctime)s %(levelname)s %(name)s: %(message)s"))
    logger.addHandler(handler)
    logger.setLevel(level)
    logger.propagate = False
