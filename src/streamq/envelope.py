"""The job envelope and its encoding as flat stream fields.

A job travels as one stream entry whose fields are always the same names in the same order
(``due, id, name, ts, attempt, payload, baggage, trace``), so Redis stores the names once per
stream node. The payload is the job model's JSON; the rest are short strings.
"""

from __future__ import annotations

import json
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
    "validation_fields",
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


def decode_entry(entry_id: bytes | str, fields: dict[bytes, bytes]) -> RawJob:
    """Decode one stream entry. Missing or malformed fields raise ``InvalidPayload``."""
    eid = _s(entry_id)
    try:
        due = fields.get(b"due") or b""
        baggage = fields.get(b"baggage") or b""
        trace = fields.get(b"trace") or b""
        return RawJob(
            entry_id=eid,
            id=_s(fields[b"id"]),
            name=_s(fields[b"name"]),
            timestamp_ms=int(fields[b"ts"]),
            attempt=int(fields.get(b"attempt") or b"1"),
            payload_json=fields[b"payload"],
            due_ms=int(due) if due else int(eid.split("-", 1)[0]),
            retry_baggage=json.loads(baggage) if baggage else None,
            trace_context=json.loads(trace) if trace else None,
            fields=fields,
        )
    except (KeyError, ValueError, TypeError) as exc:
        raise InvalidPayload(
            f"stream entry {eid} is not a streamq job envelope: {exc!r}",
            job_id=_s(fields.get(b"id")) or None,
        ) from exc


def validation_fields(exc: ValidationError) -> list[str]:
    """Dotted field paths named by a pydantic validation error."""
    return [".".join(str(p) for p in e["loc"]) or "<root>" for e in exc.errors()]


@dataclass(frozen=True, slots=True)
class Envelope(Generic[P]):
    """A job as the worker sees it: metadata plus the validated payload.

    Attributes:
        id: the stable job id (caller-given or generated).
        name: the job name, as declared in the contract.
        timestamp: first enqueue time, ms since the epoch (Redis clock).
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
        try:
            payload = model.model_validate_json(raw.payload_json)
        except ValidationError as exc:
            fields = validation_fields(exc)
            raise InvalidPayload(
                f"queue {queue!r} job {raw.name!r} id {raw.id!r}: payload failed validation "
                f"on field(s) {', '.join(fields)}: {exc.errors()[0]['msg']}",
                queue=queue,
                job=raw.name,
                job_id=raw.id,
                fields=fields,
            ) from exc
        return cls(
            id=raw.id,
            name=raw.name,
            timestamp=raw.timestamp_ms,
            payload=payload,
            attempt=raw.attempt,
            retry_baggage=raw.retry_baggage,
            trace_context=raw.trace_context,
        )


def add_error_to_baggage(
    baggage: dict[str, Any] | None, *, attempt: int, error_type: str, message: str, at_ms: int
) -> dict[str, Any]:
    """Retry baggage with one more error record; keeps the last few only."""
    errors = list((baggage or {}).get("errors", []))
    errors.append({"attempt": attempt, "type": error_type, "message": message[:500], "at": at_ms})
    out = dict(baggage or {})
    out["errors"] = errors[-MAX_BAGGAGE_ERRORS:]
    return out
