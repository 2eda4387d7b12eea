"""The envelope: encoding to flat stream fields, decoding, payload validation, rolling deploys."""

from __future__ import annotations

import json
import uuid
from datetime import UTC, date, datetime, timedelta, timezone
from decimal import Decimal
from typing import Any

import pytest
import redis.asyncio as aioredis
from hypothesis import given, settings
from hypothesis import strategies as st
from pydantic import BaseModel

from streamq import InvalidPayload
from streamq.envelope import (
    FIELD_NAMES,
    Envelope,
    RawJob,
    add_error_to_baggage,
    decode_entry,
    encode_fields,
    flat_fields,
)


class Address(BaseModel):
    street: str
    zip: str | None = None


class Rich(BaseModel):
    day: date
    at: datetime
    amount: Decimal
    ref: uuid.UUID
    address: Address
    tags: list[str] = []


def as_entry(values: list[str | bytes]) -> dict[bytes, bytes]:
    """The field map redis-py returns for an entry written with these values."""
    return {
        n.encode(): v if isinstance(v, bytes) else v.encode()
        for n, v in zip(FIELD_NAMES, values, strict=True)
    }


def entry(**overrides: Any) -> dict[bytes, bytes]:
    values = encode_fields(
        job_id="job-1", name="ingest-event", timestamp_ms=1_700_000_000_000, payload_json=b"{}"
    )
    fields = as_entry(values)
    for k, v in overrides.items():
        if v is None:
            fields.pop(k.encode(), None)
        else:
            fields[k.encode()] = v if isinstance(v, bytes) else str(v).encode()
    return fields


def test_field_names_are_fixed_with_due_first() -> None:
    assert FIELD_NAMES == ("due", "id", "name", "ts", "attempt", "payload", "baggage", "trace")


def test_every_field_round_trips() -> None:
    baggage = {"errors": [{"attempt": 1, "type": "ValueError", "message": "boom", "at": 5}]}
    trace = {"traceparent": "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01"}
    values = encode_fields(
        job_id="job-42",
        name="ingest-event",
        timestamp_ms=1_700_000_000_123,
        payload_json=b'{"a":1}',
        attempt=3,
        retry_baggage=baggage,
        trace_context=trace,
        due_ms=1_700_000_005_000,
    )
    raw = decode_entry(b"1700000009999-0", as_entry(values))
    assert raw.entry_id == "1700000009999-0"
    assert raw.id == "job-42"
    assert raw.name == "ingest-event"
    assert raw.timestamp_ms == 1_700_000_000_123
    assert raw.attempt == 3
    assert raw.payload_json == b'{"a":1}'
    assert raw.due_ms == 1_700_000_005_000
    assert raw.retry_baggage == baggage
    assert raw.trace_context == trace
    # Re-encoding with a change keeps everything else, and clears the due time.
    again = decode_entry("1-0", as_entry(raw.encoded(attempt=4, due_ms=7)))
    assert (again.id, again.attempt, again.due_ms, again.retry_baggage) == ("job-42", 4, 7, baggage)


def test_ready_job_is_due_at_its_entry_id_time() -> None:
    raw = decode_entry("1700000001234-5", entry(due=""))
    assert raw.due_ms == 1_700_000_001_234


def test_optional_fields_default_when_empty_or_absent() -> None:
    raw = decode_entry("5-0", entry(attempt=None, baggage=None, trace=None))
    assert raw.attempt == 1
    assert raw.retry_baggage is None
    assert raw.trace_context is None


def test_decode_accepts_str_keys_from_a_decode_responses_client() -> None:
    fields = {k.decode(): v.decode() for k, v in entry().items()}
    raw = decode_entry("5-0", fields)
    assert raw.id == "job-1"
    assert raw.payload_json == b"{}"
    assert raw.fields[b"id"] == b"job-1"


async def test_envelope_survives_a_real_stream_round_trip(
    aredis: aioredis.Redis, prefix: str
) -> None:
    payload = Rich(
        day=date(2024, 2, 29),
        at=datetime(2024, 2, 29, 23, 59, 59, 999999, tzinfo=timezone(timedelta(hours=5))),
        amount=Decimal("12345678901234567890.000001"),
        ref=uuid.uuid4(),
        address=Address(street="Hauptstraße 1", zip=None),
        tags=["a", "ü", ""],
    )
    values = encode_fields(
        job_id="j",
        name="rich",
        timestamp_ms=1,
        payload_json=payload.model_dump_json(),
        trace_context={"traceparent": "x"},
    )
    key = f"{prefix}:s"
    await aredis.xadd(key, dict(zip(FIELD_NAMES, values, strict=True)))  # type: ignore[arg-type]
    [(eid, fields)] = await aredis.xrange(key)
    env = Envelope.from_raw(decode_entry(eid, fields), Rich, queue="q")
    assert env.payload == payload
    assert isinstance(env.payload.day, date)
    assert env.payload.at.utcoffset() == timedelta(hours=5)
    assert isinstance(env.payload.amount, Decimal)
    assert env.payload.amount == Decimal("12345678901234567890.000001")
    assert isinstance(env.payload.ref, uuid.UUID)
    assert isinstance(env.payload.address, Address)
    assert env.trace_context == {"traceparent": "x"}
    assert env.id == "j"


def test_extra_stream_fields_from_a_newer_producer_are_ignored_and_kept() -> None:
    fields = entry(priority="high")
    raw = decode_entry("1-0", fields)
    assert raw.id == "job-1"
    assert raw.fields[b"priority"] == b"high"


# -- rolling deploys ----------------------------------------------------------------------------


class EventV1(BaseModel):
    project_id: str
    event_id: str


class EventV2(BaseModel):
    project_id: str
    event_id: str
    source: str | None = None
    retries: int = 0


def raw_with(payload_json: bytes) -> RawJob:
    return decode_entry("1-0", entry(payload=payload_json))


def test_newer_consumer_accepts_an_older_producers_job() -> None:
    old_json = EventV1(project_id="p", event_id="e").model_dump_json().encode()
    env = Envelope.from_raw(raw_with(old_json), EventV2)
    assert env.payload == EventV2(project_id="p", event_id="e", source=None, retries=0)


def test_older_consumer_ignores_a_newer_producers_extra_fields() -> None:
    new_json = EventV2(project_id="p", event_id="e", source="api", retries=3).model_dump_json()
    env = Envelope.from_raw(raw_with(new_json.encode()), EventV1)
    assert env.payload == EventV1(project_id="p", event_id="e")
    assert not hasattr(env.payload, "source")


# -- malformed entries --------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("overrides", "field", "problem"),
    [
        ({"id": None}, "id", "is missing"),
        ({"id": ""}, "id", "is missing"),
        ({"name": None}, "name", "is missing"),
        ({"ts": None}, "ts", "is missing"),
        ({"ts": "yesterday"}, "ts", "is not an integer"),
        ({"attempt": "two"}, "attempt", "is not an integer"),
        ({"attempt": "0"}, "attempt", "must be >= 1"),
        ({"payload": None}, "payload", "is missing"),
        ({"due": "soon"}, "due", "is not an integer"),
        ({"baggage": "{not json"}, "baggage", "is not JSON"),
        ({"baggage": "[1, 2]"}, "baggage", "is not a JSON object"),
        ({"trace": "nope"}, "trace", "is not JSON"),
        ({"name": b"\xff\xfe"}, "name", "is not UTF-8"),
    ],
)
def test_malformed_entry_raises_invalid_payload_naming_the_field(
    overrides: dict[str, Any], field: str, problem: str
) -> None:
    with pytest.raises(InvalidPayload) as info:
        decode_entry("1700000000000-0", entry(**overrides))
    err = info.value
    assert f"field {field!r} {problem}" in str(err)
    assert "1700000000000-0" in str(err)
    assert err.fields == [field]


def test_malformed_entry_error_carries_the_job_id_when_readable() -> None:
    with pytest.raises(InvalidPayload) as info:
        decode_entry("1-0", entry(ts="x"))
    assert info.value.job_id == "job-1"


def test_entry_that_is_not_a_job_at_all_is_invalid() -> None:
    with pytest.raises(InvalidPayload, match="field 'id' is missing"):
        decode_entry("1-0", {b"hello": b"world"})


def test_payload_failing_validation_names_queue_job_and_fields() -> None:
    bad = json.dumps({"project_id": "p", "address": {"street": 5}}).encode()
    with pytest.raises(InvalidPayload) as info:
        Envelope.from_raw(raw_with(bad), Rich, queue="ingestion")
    err = info.value
    assert err.queue == "ingestion"
    assert err.job == "ingest-event"
    assert err.job_id == "job-1"
    assert "address.street" in err.fields
    assert "day" in err.fields
    for word in ("ingestion", "ingest-event", "address.street"):
        assert word in str(err)


def test_payload_failing_validation_gives_each_field_its_own_error_text() -> None:
    bad = json.dumps({"day": "not a day", "at": "2024-01-01T00:00:00", "amount": "1",
                      "ref": str(uuid.uuid4()), "address": {"street": 5}}).encode()
    with pytest.raises(InvalidPayload) as info:
        Envelope.from_raw(raw_with(bad), Rich, queue="ingestion")
    message = str(info.value)
    assert info.value.fields == ["day", "address.street"]
    assert "day: Input should be a valid date" in message
    assert "address.street: Input should be a valid string" in message


def test_payload_that_is_not_json_is_invalid() -> None:
    with pytest.raises(InvalidPayload, match="payload failed validation"):
        Envelope.from_raw(raw_with(b"\x00not json"), EventV1)


def test_retry_baggage_keeps_the_last_five_errors() -> None:
    baggage: dict[str, Any] | None = None
    for attempt in range(1, 8):
        baggage = add_error_to_baggage(
            baggage, attempt=attempt, error_type="E", message="m" * 900, at_ms=attempt
        )
    assert baggage is not None
    assert [e["attempt"] for e in baggage["errors"]] == [3, 4, 5, 6, 7]
    assert all(len(e["message"]) == 500 for e in baggage["errors"])


def test_flat_fields_interleave_names_and_values() -> None:
    values = encode_fields(job_id="i", name="n", timestamp_ms=1, payload_json="{}")
    flat = flat_fields(values)
    assert flat[0::2] == list(FIELD_NAMES)
    assert flat[1::2] == values


# -- property ------------------------------------------------------------------------------------


class Prop(BaseModel):
    text: str
    number: int
    ratio: float
    flag: bool
    day: date
    at: datetime
    amount: Decimal
    ref: uuid.UUID
    address: Address | None = None
    tags: list[str] = []
    counts: dict[str, int] = {}


names = st.from_regex(r"\A[a-z0-9]+(-[a-z0-9]+)*\Z")
payloads = st.builds(
    Prop,
    text=st.text(),
    number=st.integers(min_value=-(2**63), max_value=2**63),
    ratio=st.floats(allow_nan=False, allow_infinity=False),
    flag=st.booleans(),
    day=st.dates(),
    at=st.datetimes(timezones=st.none() | st.just(UTC)),
    amount=st.decimals(allow_nan=False, allow_infinity=False),
    ref=st.uuids(),
    address=st.none() | st.builds(Address, street=st.text(), zip=st.none() | st.text()),
    tags=st.lists(st.text(), max_size=5),
    counts=st.dictionaries(st.text(), st.integers(), max_size=5),
)


@settings(max_examples=150, deadline=None)
@given(
    payload=payloads,
    job_id=st.text(min_size=1, max_size=200),
    name=names,
    ts=st.integers(min_value=0, max_value=2**53),
    attempt=st.integers(min_value=1, max_value=10_000),
    due=st.none() | st.integers(min_value=0, max_value=2**53),
    baggage=st.none() | st.dictionaries(st.text(min_size=1), st.integers(), min_size=1),
    trace=st.none() | st.dictionaries(st.text(min_size=1), st.text(), min_size=1),
)
def test_encode_decode_round_trip_property(
    payload: Prop,
    job_id: str,
    name: str,
    ts: int,
    attempt: int,
    due: int | None,
    baggage: dict[str, Any] | None,
    trace: dict[str, str] | None,
) -> None:
    values = encode_fields(
        job_id=job_id,
        name=name,
        timestamp_ms=ts,
        payload_json=payload.model_dump_json().encode(),
        attempt=attempt,
        retry_baggage=baggage,
        trace_context=trace,
        due_ms=due,
    )
    raw = decode_entry("1700000000000-1", as_entry(values))
    env = Envelope.from_raw(raw, Prop)
    assert env.payload == payload
    assert (env.id, env.name, env.timestamp, env.attempt) == (job_id, name, ts, attempt)
    assert raw.due_ms == (1_700_000_000_000 if due is None else due)
    assert env.retry_baggage == baggage
    assert env.trace_context == trace
