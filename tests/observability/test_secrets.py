"""A secret payload field never shows up in logs, spans, metrics or dead-letter listings."""

from __future__ import annotations

import json
import logging

import pytest
import redis.asyncio as aioredis
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

from streamq import CompositeHooks, Queue
from streamq.deadletters import DeadLetters
from streamq.keys import QueueKeys
from streamq.metrics import PrometheusHooks
from streamq.observe import JobLogHooks
from streamq.redact import REDACTED, redact, scrub_text, secret_values
from streamq.tracing import TracingHooks, current_trace_ids
from tests.observability.conftest import RunWorker
from tests.observability.support import (
    CANARY,
    Behaviour,
    Obs,
    Work,
    http_get,
    make_app,
    raw_entry,
)


def test_redact_hides_secret_fields_at_any_depth() -> None:
    payload = json.dumps({
        "user": "u", "token": CANARY, "inner": {"token": 123456, "keep": 1},
        "items": [{"token": "x"}, {"other": "y"}],
    }).encode()
    assert redact(payload, {"token"}) == {
        "user": "u", "token": REDACTED, "inner": {"token": REDACTED, "keep": 1},
        "items": [{"token": REDACTED}, {"other": "y"}],
    }
    assert redact(b"not json", {"token"}) == {"_unreadable": REDACTED}
    assert redact(payload, ()) == json.loads(payload)


def test_scrub_text_removes_every_secret_value_however_quoted() -> None:
    payload = json.dumps({"token": 'quo"te-s3cret', "pin": 98765, "a": "ab"}).encode()
    values = secret_values(payload, {"token", "pin", "a"})
    assert "ab" not in values  # too short to scrub without garbling text
    text = "got 'quo\"te-s3cret' and \"quo\\\"te-s3cret\" and pin=98765"
    assert scrub_text(text, values) == f"got '{REDACTED}' and \"{REDACTED}\" and pin={REDACTED}"


async def test_canary_secret_never_appears_in_logs_spans_metrics_or_dead_letter_listing(
    run_worker: RunWorker,
    aredis: aioredis.Redis,
    prefix: str,
    caplog: pytest.LogCaptureFixture,
) -> None:
    caplog.set_level(logging.DEBUG)
    exporter = InMemorySpanExporter()
    provider = TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(exporter))
    prom = PrometheusHooks()
    hooks = CompositeHooks(
        [TracingHooks(provider), prom, JobLogHooks(trace_ids=current_trace_ids)]
    )
    queue = Queue(Obs, aredis, prefix=prefix, hooks=hooks)
    manager, server = await run_worker(make_app(Behaviour()), hooks)
    # Fails every attempt with the secret in its message, then dies.
    await queue.add(Obs.work, Work(project_id="p", mode="leak", token=CANARY), job_id="leak-1")
    # Dies at once: the secret field itself fails validation (pydantic quotes the input).
    keys = QueueKeys(prefix, "obs", 2)
    poison = json.dumps({"project_id": "p", "token": [CANARY]}).encode()
    await aredis.xadd(keys.shards[0].stream,
                      raw_entry(job_id="poison-1", name="work", payload=poison))
    await manager.run_until_idle(timeout_s=10)

    letters = await DeadLetters(aredis, Obs, prefix=prefix).list()
    assert sorted(d.job_id or "" for d in letters) == ["leak-1", "poison-1"]
    # The canary is stored (the dead letter keeps the whole envelope for a retry)...
    raw = [await aredis.xrange(s.dead) for s in keys.shards]
    assert CANARY in repr(raw)
    # ...but never shown.
    listing = json.dumps([d.to_dict() for d in letters], default=str)
    assert CANARY not in listing
    assert REDACTED in listing

    formatter = logging.Formatter()
    log_text = "\n".join(
        formatter.format(r) + " " + repr(vars(r)) for r in caplog.records
    )
    assert "leak-1" in log_text  # the failures were logged...
    assert CANARY not in log_text  # ...without the secret

    spans = exporter.get_finished_spans()
    assert len(spans) == 4  # one producer span, three attempts
    span_text = "\n".join(s.to_json() for s in spans)
    assert "rejected token" in span_text
    assert CANARY not in span_text

    port = server.port
    assert port is not None
    _, _, metrics = await http_get(port, "/metrics")
    assert CANARY.encode() not in metrics
    provider.shutdown()
