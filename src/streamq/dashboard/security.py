"""Who may change state through the dashboard, and the headers every answer carries.

Reading is open to whoever reaches the port (bind it to loopback or put it behind your own
authentication). Changing state (retry, purge, pause, resume) is refused unless:

* the dashboard is not read-only, **and** a token was configured (no token: actions are off);
* the request is a ``POST`` carrying the token in the ``token`` form field or the
  ``X-Streamq-Token`` header, compared in constant time. A cookie is never accepted: a page
  of another site can make the browser send cookies, not a form field it cannot read;
* its ``Origin`` header, when the browser sends one, is this dashboard's own.
"""

from __future__ import annotations

import hmac
from dataclasses import dataclass
from urllib.parse import urlsplit

from streamq.errors import ConfigurationError

__all__ = ["SECURITY_HEADERS", "TOKEN_HEADER", "Access"]

TOKEN_HEADER = "x-streamq-token"
MIN_TOKEN_CHARS = 16

SECURITY_HEADERS = {
    "content-security-policy": (
        "default-src 'self'; script-src 'self'; style-src 'self'; img-src 'self' data:; "
        "form-action 'self'; frame-ancestors 'none'; base-uri 'none'"
    ),
    "x-frame-options": "DENY",
    "x-content-type-options": "nosniff",
    "referrer-policy": "same-origin",  # "no-referrer" would make the Origin of our own forms "null"
    "cache-control": "no-store",
}
"""Sent with every page: no framing, no inline script, nothing cached."""


@dataclass(frozen=True, slots=True)
class Access:
    """The dashboard's action policy.

    Raises:
        ConfigurationError: a token shorter than 16 characters (or with spaces around it).
    """

    token: str | None = None
    read_only: bool = False

    def __post_init__(self) -> None:
        if self.token is not None and (
            len(self.token) < MIN_TOKEN_CHARS or self.token != self.token.strip()
        ):
            raise ConfigurationError(
                f"dashboard token: give at least {MIN_TOKEN_CHARS} characters without "
                "surrounding spaces (e.g. python -c 'import secrets; "
                "print(secrets.token_urlsafe(24))')"
            )

    @property
    def actions_enabled(self) -> bool:
        """Whether action buttons are shown at all."""
        return not self.read_only and self.token is not None

    @property
    def mode(self) -> str:
        """``read-only``, ``actions off`` (no token) or ``actions need the token``."""
        if self.read_only:
            return "read-only"
        return "actions off" if self.token is None else "actions need the token"

    def refusal(self, given: str | None, origin: str | None, host: str | None) -> str | None:
        """Why a state-changing request is refused, or None when it may go on."""
        if self.read_only:
            return "this dashboard is read-only: it changes nothing"
        if self.token is None:
            return ("actions are off: start the dashboard with a token (--token, or "
                    "DASHBOARD_TOKEN in the worker) to retry, purge, pause or resume")
        if origin and (not host or urlsplit(origin).netloc != host):
            return f"refused: the request comes from another site ({origin})"
        if not given:
            return "the dashboard token is required for this action (field 'token')"
        if not hmac.compare_digest(given.encode(), self.token.encode()):
            return "wrong dashboard token (field 'token')"
        return None
