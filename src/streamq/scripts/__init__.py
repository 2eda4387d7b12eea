"""The Lua scripts behind every queue transition, loaded once and called by SHA.

Each ``<name>.lua`` file in this package is one atomic operation; its header names its KEYS,
ARGV and reply. ``_prelude.lua`` (shared helpers) is prepended at load time. The typed
wrappers that know each script's argument order live in :mod:`streamq.ops`.
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass
from functools import cache
from importlib import resources

__all__ = ["SCRIPT_NAMES", "Script", "script"]

SCRIPT_NAMES = (
    "acl_check",
    "cancel",
    "complete",
    "complete_tracked",
    "control",
    "dead_retry",
    "drop_consumer",
    "enqueue",
    "fail",
    "job_status",
    "lease_acquire",
    "lease_fenced_set",
    "lease_release",
    "lease_renew",
    "limiter",
    "progress",
    "promote",
    "reclaim",
    "release",
    "renew",
    "retry",
    "tenant_flag",
    "tenant_flags",
    "tenant_slot_acquire",
    "tenant_slot_renew",
    "settle_tracked",
    "track_final",
)


@dataclass(frozen=True, slots=True)
class Script:
    """One Lua script: its name, full source (prelude included) and SHA1."""

    name: str
    source: str
    sha: str


def _read(name: str) -> str:
    return resources.files(__package__).joinpath(name).read_text(encoding="utf-8")


@cache
def script(name: str) -> Script:
    """The loaded script ``name`` (cached; the SHA is what Redis caches under)."""
    if name not in SCRIPT_NAMES:
        raise KeyError(f"no script named {name!r}")
    source = _read("_prelude.lua") + "\n" + _read(f"{name}.lua")
    return Script(name, source, hashlib.sha1(source.encode("utf-8")).hexdigest())
