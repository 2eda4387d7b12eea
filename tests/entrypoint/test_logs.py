"""The worker's log formatters: JSON lines and readable text, both with extras, no payload."""

from __future__ import annotations

import io
import json
import logging

from worker.logs import JsonFormatter, TextFormatter, configure_logging


def record(**extra: object) -> logging.LogRecord:
    r = logging.LogRecord("streamq.worker", logging.WARNING, __file__, 1, "job %s", ("failed",),
                          None)
    for k, v in extra.items():
        setattr(r, k, v)
    return r


def test_json_line_has_level_logger_message_and_extras_but_no_payload() -> None:
    line = JsonFormatter().format(record(queue="q", attempt=2, payload={"x": 1}))
    assert "\n" not in line
    out = json.loads(line)
    assert out["level"] == "WARNING"
    assert out["logger"] == "streamq.worker"
    assert out["message"] == "job failed"
    assert (out["queue"], out["attempt"]) == ("q", 2)
    assert "payload" not in out
    assert out["ts"].endswith("Z")


def test_json_line_carries_the_exception() -> None:
    try:
        raise ValueError("boom")
    except ValueError:
        import sys

        r = logging.LogRecord("x", logging.ERROR, __file__, 1, "failed", (), sys.exc_info())
    out = json.loads(JsonFormatter().format(r))
    assert "ValueError: boom" in out["exc"]


def test_text_line_is_readable_with_extras() -> None:
    line = TextFormatter().format(record(queue="q", payload="secret"))
    assert "WARNING streamq.worker: job failed  queue=q" in line
    assert "secret" not in line


def test_configure_logging_auto_is_json_when_not_a_terminal() -> None:
    stream = io.StringIO()
    root = logging.getLogger()
    saved = (list(root.handlers), root.level)
    try:
        configure_logging("auto", "DEBUG", stream)
        logging.getLogger("streamq.test").debug("hello", extra={"queue": "q"})
        assert json.loads(stream.getvalue())["queue"] == "q"
    finally:
        root.handlers[:] = saved[0]
        root.setLevel(saved[1])
