"""The job envelope and its encoding as flat stream fields.

A job travels as one stream entry whose fields are always the same names in the same order
(``due, id, name, ts, attempt, payload, baggage, trace``), so Redis stores the names once per
stream node. The payload is the job model's JSON; the rest are short strings.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any, Generic, TypeVar

from pydantic import BaseModel, ValidationError

from streamq.errors import InvalidPayload

__all__ = [
    "FIELD_NAMES",
    "Envelope",
    "RawJob",
    "decode_entry",
    "encode_fields",
    "validate_payload",
    "validation_fields",
    "validation_problems",
]

P = TypeVar("P", bound=BaseModel)

FIELD_NAMES: tuple[str, ...] = (
    "due",
    "id",
    "name",
    "ts",
    "attempt",
    "payload",
    "baggage",
    "trace",
)
"""Stream field names, in order. ``due`` is first: the scripts set it by position."""

MAX_BAGGAGE_ERRORS = 5


def encode_fields(
    *,
    job_id: str,
    name: str,
    timestamp_ms: int,
    payload_json: bytes | str,
    attempt: int = 1,
    retry_baggage: dict[str, Any] | None = None,
    trace_context: dict[str, str] | None = None,
    due_ms: int | None = None,
) -> list[str | bytes]:
    """The field values of one job, in :data:`FIELD_NAMES` order."""
    return [
        "" if due_ms is None else str(due_ms),
        job_id,
        name,
        str(timestamp_ms),
        str(attempt),
        payload_json,
        json.dumps(retry_baggage, separators=(",", ":")) if retry_baggage else "",
        json.dumps(trace_context, separators=(",", ":")) if trace_context else "",
    ]


def flat_fields(values: list[str | bytes]) -> list[str | bytes]:
    """Interleave names and values: ``[due, v0, id, v1, ...]``."""
    out: list[str | bytes] = []
    for n, v in zip(FIELD_NAMES, values, strict=True):
        out.append(n)
        out.append(v)
    return out


def _s(v: bytes | str | None) -> str:
    if v is None:
        return ""
    return v.decode("utf-8") if isinstance(v, bytes) else v


@dataclass(slots=True)
class RawJob:
    """A stream entry decoded to strings, before its payload is validated.

    ``entry_id`` is the stream entry id (changes on retry); ``id`` is the stable job id.
    """

    entry_id: str
    id: str
    name: str
    timestamp_ms: int
    attempt: int
    payload_json: bytes
    due_ms: int
    retry_baggage: dict[str, Any] | None = None
    trace_context: dict[str, str] | None = None
    fields: dict[bytes, bytes] = field(default_factory=dict, repr=False)

    def encoded(self, **changes: Any) -> list[str | bytes]:
        """The field values of this job, with ``changes`` (e.g. ``attempt=2``) applied."""
        kw: dict[str, Any] = {
            "job_id": self.id,
            "name": self.name,
            "timestamp_ms": self.timestamp_ms,
            "payload_json": self.payload_json,
            "attempt": self.attempt,
            "retry_baggage": self.retry_baggage,
            "trace_context": self.trace_context,
            "due_ms": None,
        }
        kw.update(changes)
        return encode_fields(**kw)


def _b(v: Any) -> bytes:
    return v if isinstance(v, bytes) else str(v).encode("utf-8")


_NAMES_BYTES = tuple((n, n.encode()) for n in FIELD_NAMES)


def _lookup(fields: Mapping[Any, Any]) -> tuple[dict[str, bytes | None], bool]:
    """Each envelope field as bytes (None when absent), and whether ``fields`` is exactly
    the envelope's bytes-to-bytes dict, as redis-py returns it (then it needs no copy)."""
    norm: dict[str, bytes | None] = {}
    exact = type(fields) is dict and len(fields) == len(FIELD_NAMES)
    get = fields.get
    for name, key in _NAMES_BYTES:
        v = get(key)
        if v is None:
            exact = False
            v = get(name)
            if v is not None:
                v = _b(v)
        elif type(v) is not bytes:
            exact = False
            v = _b(v)
        norm[name] = v
    return norm, exact


def _malformed(eid: str, job_id: str | None, name: str, problem: str) -> InvalidPayload:
    return InvalidPayload(
        f"stream entry {eid} is not a streamq job envelope: field {name!r} {problem}",
        job_id=job_id,
        fields=[name],
    )


def _int_field(eid: str, job_id: str | None, name: str, raw: bytes | None) -> int:
    if raw is None:
        raise _malformed(eid, job_id, name, "is missing")
    try:
        return int(raw)
    except ValueError:
        raise _malformed(eid, job_id, name, f"is not an integer: {raw[:40]!r}") from None


def _json_field(eid: str, job_id: str | None, name: str, raw: bytes | None) -> Any:
    if not raw:
        return None
    try:
        value = json.loads(raw)
    except ValueError:
        raise _malformed(eid, job_id, name, f"is not JSON: {raw[:40]!r}") from None
    if not isinstance(value, dict):
        raise _malformed(eid, job_id, name, "is not a JSON object")
    return value


def decode_entry(entry_id: bytes | str, fields: Mapping[Any, Any]) -> RawJob:
    """Decode one stream entry. A missing or malformed field raises ``InvalidPayload``
    naming it (in the message and in ``fields``).

    Field names may be bytes or str (a client with ``decode_responses=True``).
    """
    eid = _s(entry_id)
    norm, exact = _lookup(fields)
    text: dict[str, str] = {}
    job_id: str | None = None
    for n in ("id", "name"):
        try:
            text[n] = _s(norm[n])
        except UnicodeDecodeError:
            raise _malformed(eid, job_id, n, "is not UTF-8") from None
        if not text[n]:
            raise _malformed(eid, job_id, n, "is missing")
        job_id = text["id"]
    payload = norm["payload"]
    if payload is None:
        raise _malformed(eid, job_id, "payload", "is missing")
    attempt = _int_field(eid, job_id, "attempt", norm["attempt"] or b"1")
    if attempt < 1:
        raise _malformed(eid, job_id, "attempt", f"must be >= 1, got {attempt}")
    due = norm["due"]
    if due:
        due_ms = _int_field(eid, job_id, "due", due)
    else:
        # A job added ready has no due time: it was due when Redis stamped the entry id.
        due_ms = _int_field(eid, job_id, "due", eid.split("-", 1)[0].encode())
    return RawJob(
        entry_id=eid,
        id=text["id"],
        name=text["name"],
        timestamp_ms=_int_field(eid, job_id, "ts", norm["ts"]),
        attempt=attempt,
        payload_json=payload,
        due_ms=due_ms,
        retry_baggage=_json_field(eid, job_id, "baggage", norm["baggage"]),
        trace_context=_json_field(eid, job_id, "trace", norm["trace"]),
        # The worker decodes every job: keep redis-py's dict instead of copying it when it
        # already is bytes to bytes with nothing else in it (nothing mutates it).
        fields=fields if exact else {_b(k): _b(v) for k, v in fields.items()},  # type: ignore[arg-type]
    )


def validation_fields(exc: ValidationError) -> list[str]:
    """Dotted field paths named by a pydantic validation error."""
    return [".".join(str(p) for p in e["loc"]) or "<root>" for e in exc.errors()]


def validation_problems(exc: ValidationError) -> str:
    """Each failing field with its own error text: ``"a: msg; b.c: other msg"``."""
    return "; ".join(
        f"{field}: {e['msg']}"
        for field, e in zip(validation_fields(exc), exc.errors(), strict=True)
    )


@dataclass(frozen=True, slots=True)
class Envelope(Generic[P]):
    """A job as the worker sees it: metadata plus the validated payload.

    Attributes:
        id: the stable job id (caller-given or generated).
        name: the job name, as declared in the contract.
        timestamp: first enqueue time, ms since the epoch, on the producer's clock (the
            due time and the stream entry id come from the Redis clock).
        payload: the validated payload model.
        attempt: the 1-based number of this attempt.
        retry_baggage: errors of earlier attempts (``{"errors": [...]}``), or None.
        trace_context: W3C trace context carried from the producer, or None.
    """

    id: str
    name: str
    timestamp: int
    payload: P
    attempt: int = 1
    retry_baggage: dict[str, Any] | None = None
    trace_context: dict[str, str] | None = None

    @classmethod
    def from_raw(cls, raw: RawJob, model: type[P], *, queue: str | None = None) -> Envelope[P]:
        """Validate ``raw``'s payload against ``model``; raises ``InvalidPayload``."""
        payload = validate_payload(raw, model, queue=queue)
        return cls(
            id=raw.id,
            name=raw.name,
            timestamp=raw.timestamp_ms,
            payload=payload,
            attempt=raw.attempt,
            retry_baggage=raw.retry_baggage,
            trace_context=raw.trace_context,
        )


def validate_payload(raw: RawJob, model: type[P], *, queue: str | None = None) -> P:
    """``raw``'s payload validated against ``model``; raises ``InvalidPayload`` naming the
    failing fields. (The worker needs only the payload, not a whole :class:`Envelope`.)"""
    try:
        return model.model_validate_json(raw.payload_json)
    except ValidationError as exc:
        fields = validation_fields(exc)
        raise InvalidPayload(
            f"queue {queue!r} job {raw.name!r} id {raw.id!r}: payload failed validation "
            f"on field(s) {validation_problems(exc)}",
            queue=queue,
            job=raw.name,
            job_id=raw.id,
            fields=fields,
        ) from exc


def add_error_to_baggage(
    baggage: dict[str, Any] | None, *, attempt: int, error_type: str, message: str, at_ms: int
) -> dict[str, Any]:
    """Retry baggage with one more error record; keeps the last few only."""
    errors = list((baggage or {}).get("errors", []))
    errors.append({"attempt": attempt, "type": error_type, "message": message[:500], "at": at_ms})
    out = dict(baggage or {})
    out["errors"] = errors[-MAX_BAGGAGE_ERRORS:]
    return out
