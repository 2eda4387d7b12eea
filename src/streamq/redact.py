"""Hide a contract's secret payload fields before anything is shown to a person.

Logs, spans and dead-letter listings go through :func:`redact`; payload fields a contract
names in ``secret_fields`` are replaced by :data:`REDACTED` wherever they occur (at any depth,
in nested objects and in lists of objects), so a secret never leaves the payload it came in.

Example::

    redact(b'{"user": "a", "token": "s3cr3t"}', frozenset({"token"}))
    # {'user': 'a', 'token': '***'}
"""

from __future__ import annotations

import json
from collections.abc import Iterable
from typing import Any

__all__ = ["REDACTED", "redact", "redact_value"]

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
