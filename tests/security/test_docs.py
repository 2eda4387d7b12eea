"""docs/security.md shows the ACL rules streamq.security builds, and the TLS variables are
documented where every variable is."""

from __future__ import annotations

from streamq.security import ROLES, acl_setuser
from tests.entrypoint.helpers import ROOT


def test_the_security_page_shows_exactly_each_roles_acl_line() -> None:
    text = (ROOT / "docs" / "security.md").read_text()
    shown = [line for line in text.splitlines() if line.startswith("ACL SETUSER myapp-")]
    assert shown == [acl_setuser(role, prefix="myapp", user=f"myapp-{role}") for role in ROLES]


def test_the_tls_variables_are_documented_and_the_security_page_is_linked() -> None:
    config = (ROOT / "docs" / "configuration.md").read_text()
    security = (ROOT / "docs" / "security.md").read_text()
    for name in ("REDIS_TLS_CA_FILE", "REDIS_TLS_CERT_FILE", "REDIS_TLS_KEY_FILE",
                 "REDIS_TLS_VERIFY"):
        assert f"| `{name}` |" in config
        assert f"| `{name}` |" in security
    assert "(security.md)" in (ROOT / "docs" / "index.md").read_text()
