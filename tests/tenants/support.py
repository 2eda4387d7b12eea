"""Helpers of the tenant tests: where jobs landed, and how many commands Redis ran."""

from __future__ import annotations

from typing import Any

from streamq.keys import QueueKeys
from tests.tenants.contracts import Tenanted


def lanes(prefix: str) -> tuple[QueueKeys, QueueKeys]:
    assert Tenanted.secondary is not None
    return (
        QueueKeys(prefix, Tenanted.primary.name, Tenanted.primary.shards),
        QueueKeys(prefix, Tenanted.secondary.name, Tenanted.secondary.shards),
    )


async def lane_lengths(r: Any, prefix: str) -> tuple[int, int]:
    """Entries in the primary lane's streams, and in the secondary lane's."""
    primary, secondary = lanes(prefix)
    return (
        sum([await r.xlen(s.stream) for s in primary.shards]),
        sum([await r.xlen(s.stream) for s in secondary.shards]),
    )


def sync_lane_lengths(r: Any, prefix: str) -> tuple[int, int]:
    primary, secondary = lanes(prefix)
    return (
        sum(r.xlen(s.stream) for s in primary.shards),
        sum(r.xlen(s.stream) for s in secondary.shards),
    )


def calls(info: dict[str, Any]) -> dict[str, int]:
    """``INFO commandstats`` as command -> calls."""
    return {k.removeprefix("cmdstat_"): int(v["calls"]) for k, v in info.items()}


def delta(before: dict[str, int], after: dict[str, int]) -> dict[str, int]:
    return {k: n - before.get(k, 0) for k, n in after.items() if n != before.get(k, 0)}
