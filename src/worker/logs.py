"""Structured logs for ``python -m worker``: one JSON object per line, or readable text.

Each record carries its level, logger, message and the ``extra`` fields the runtime attaches
(queue, shard, job id, attempt, error type...). Payloads are never logged: the runtime does not
pass them, and a field named ``payload`` is dropped here as a last guard.
"""

from __future__ import annotations

import json
import logging
import sys
import time
from typing import Any, TextIO

__all__ = ["JsonFormatter", "TextFormatter", "configure_logging"]

# Attributes every LogRecord has; anything else on a record came from ``extra``.
_STANDARD = frozenset(
    vars(logging.LogRecord("", 0, "", 0, "", None, None)).keys()
    | {"message", "asctime", "taskName"}
)
_NEVER = frozenset({"payload", "payload_json"})


def record_extras(record: logging.LogRecord) -> dict[str, Any]:
    """The ``extra`` fields of ``record`` (minus anything named like a payload)."""
    return {
        k: v for k, v in vars(record).items()
        if k not in _STANDARD and k not in _NEVER and not k.startswith("_")
    }


def _timestamp(record: logging.LogRecord) -> str:
    base = time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(record.created))
    return f"{base}.{int(record.msecs):03d}Z"


class JsonFormatter(logging.Formatter):
    """One JSON object per line: ``ts``, ``level``, ``logger``, ``message``, extras, ``exc``."""

    def format(self, record: logging.LogRecord) -> str:
        out: dict[str, Any] = {
            "ts": _timestamp(record),
            "level": record.levelname,
            "logger": record.name,
            "message": record.getMessage(),
        }
        for k, v in record_extras(record).items():
            out.setdefault(k, v)
        if record.exc_info:
            out["exc"] = self.formatException(record.exc_info)
        return json.dumps(out, default=str, ensure_ascii=False)


class TextFormatter(logging.Formatter):
    """``<time> <LEVEL> <logger>: <message> key=value ...`` for people at a terminal."""

    def format(self, record: logging.LogRecord) -> str:
        extras = " ".join(f"{k}={v}" for k, v in record_extras(record).items())
        line = (
            f"{_timestamp(record)} {record.levelname:<7} {record.name}: {record.getMessage()}"
        )
        if extras:
            line = f"{line}  {extras}"
        if record.exc_info:
            line = f"{line}\n{self.formatException(record.exc_info)}"
        return line


def configure_logging(fmt: str, level: str, stream: TextIO | None = None) -> None:
    """Send every log record to ``stream`` (stderr) in ``fmt`` (json, text, or auto: text at
    a terminal, JSON otherwise), at ``level``."""
    out = stream or sys.stderr
    if fmt == "auto":
        fmt = "text" if out.isatty() else "json"
    handler = logging.StreamHandler(out)
    handler.setFormatter(JsonFormatter() if fmt == "json" else TextFormatter())
    root = logging.getLogger()
    for h in list(root.handlers):
        root.removeHandler(h)
    root.addHandler(handler)
    root.setLevel(level)
    logging.captureWarnings(True)
