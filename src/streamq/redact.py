"""Hide a contract's secret payload fields before anything is shown to a person.

Logs, spans and dead-letter listings go through :func:`redact`; payload fields a contract
names in ``secret_fields`` are replaced by :data:`REDACTED` wherever they occur (at any depth,
in nested objects and in lists of objects), so a secret never leaves the payload it came in.

Error text can quote a payload too (a validation error shows the input value, a processor may
format a field into its message): :func:`secret_values` collects a payload's secret values and
:func:`scrub_text` removes them from any text before it is logged, put on a span or listed.

Example::

    redact(b'{"user": "a", "token": "s3cr3t"}', frozenset({"token"}))
    # {'user': 'a', 'token': '***'}
"""

from __future__ import annotations

import json
from collections.abc import Iterable
from typing import Any

__all__ = ["REDACTED", "redact", "redact_value", "scrub_text", "secret_values"]

REDACTED = "***"
"""What a secret field's value is replaced with."""


def redact(payload_json: bytes | str, secret_fields: Iterable[str]) -> dict[str, Any]:
    """Decode a JSON payload and replace every secret field's value by :data:`REDACTED`.

    Args:
        payload_json: the payload as stored in the envelope (a JSON object).
        secret_fields: field names to hide, matched at every nesting level.

    Returns:
        The redacted payload. A payload that is not valid JSON, or not an object, cannot be
        inspected field by field, so it is returned whole as ``{"_unreadable": REDACTED}``:
        showing undecodable bytes could show a secret.
    """
    try:
        decoded = json.loads(payload_json)
    except (ValueError, UnicodeDecodeError):
        return {"_unreadable": REDACTED}
    if not isinstance(decoded, dict):
        return {"_unreadable": REDACTED}
    result = redact_value(decoded, frozenset(secret_fields))
    assert isinstance(result, dict)
    return result


def redact_value(value: Any, secret_fields: frozenset[str]) -> Any:
    """Return ``value`` (decoded JSON) with every secret field's value replaced."""
    if not secret_fields:
        return value
    if isinstance(value, dict):
        return {
            k: REDACTED if k in secret_fields else redact_value(v, secret_fields)
            for k, v in value.items()
        }
    if isinstance(value, list):
        return [redact_value(v, secret_fields) for v in value]
    return value


MIN_SECRET_CHARS = 3
"""Shorter secret values are not scrubbed from text: replacing every ``1`` or ``ab`` in an
error message would garble it while protecting nothing."""


def secret_values(payload_json: bytes | str, secret_fields: Iterable[str]) -> frozenset[str]:
    """The values (as text) of every secret field in a JSON payload, at any depth.

    Values shorter than :data:`MIN_SECRET_CHARS` are left out; a payload that is not JSON has
    none that can be found.
    """
    fields = frozenset(secret_fields)
    if not fields:
        return frozenset()
    try:
        decoded = json.loads(payload_json)
    except (ValueError, UnicodeDecodeError):
        return frozenset()
    found: set[str] = set()
    _collect(decoded, fields, found, inside=False)
    return frozenset(v for v in found if len(v) >= MIN_SECRET_CHARS)


def _collect(value: Any, fields: frozenset[str], found: set[str], *, inside: bool) -> None:
    if isinstance(value, dict):
        for k, v in value.items():
            _collect(v, fields, found, inside=inside or k in fields)
    elif isinstance(value, list):
        for v in value:
            _collect(v, fields, found, inside=inside)
    elif inside and value is not None and not isinstance(value, bool):
        found.add(str(value))
        if isinstance(value, str):
            # A repr (``input_value='...'``) or JSON encoding may escape the value.
            found.add(json.dumps(value)[1:-1])
            found.add(repr(value)[1:-1])


def scrub_text(text: str, values: Iterable[str]) -> str:
    """``text`` with every occurrence of each secret value replaced by :data:`REDACTED`."""
    # Longest first, so a value that contains another is replaced whole.
    for v in sorted(values, key=len, reverse=True):
        if v and v in text:
            text = text.replace(v, REDACTED)
    return text
