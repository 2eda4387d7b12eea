"""Tenant flags: stored per queue with expiry, followed by producers within a staleness bound
and without a Redis round trip per add."""

from __future__ import annotations

import asyncio
import time
from datetime import timedelta
from typing import Any

import pytest
import redis
import redis.asyncio as aioredis

from streamq import ConfigurationError, Hooks, Queue, QueueAdmin, SyncQueue, SyncQueueAdmin
from streamq.keys import QueueKeys
from tests.tenants.contracts import NoLane, NoTenant, Tenanted, Work
from tests.tenants.support import calls, delta, lane_lengths, sync_lane_lengths

STALE_S = 0.3


class Routed(Hooks):
    def __init__(self) -> None:
        self.routed: list[tuple[str, str]] = []

    def tenant_routed(self, queue: str, job_name: str) -> None:
        self.routed.append((queue, job_name))


async def test_flagged_tenant_is_routed_to_secondary_once_the_staleness_bound_passed(
    aredis: aioredis.Redis, prefix: str
) -> None:
    hooks = Routed()
    queue = Queue(Tenanted, aredis, prefix=prefix, tenant_flags_staleness=STALE_S, hooks=hooks)
    await queue.add(Tenanted.work, Work(project_id="noisy"))
    assert await lane_lengths(aredis, prefix) == (1, 0)

    await QueueAdmin(aredis, Tenanted, prefix=prefix).flag_tenant("noisy", 60, reason="429s")
    await asyncio.sleep(STALE_S)  # the bound itself is what is tested: wait it out, no more
    await queue.add(Tenanted.work, Work(project_id="noisy"))
    await queue.add(Tenanted.work, Work(project_id="quiet"))

    assert await lane_lengths(aredis, prefix) == (2, 1)
    assert hooks.routed == [("tn", "work")]


async def test_adds_read_the_flags_at_most_once_per_half_bound_never_per_add(
    aredis: aioredis.Redis, prefix: str
) -> None:
    queue = Queue(Tenanted, aredis, prefix=prefix, tenant_flags_staleness=STALE_S)
    await QueueAdmin(aredis, Tenanted, prefix=prefix).flag_tenant("noisy", 60)
    await queue.add(Tenanted.work, Work(project_id="warm-up"))  # first add reads the flags
    before = calls(await aredis.info("commandstats"))
    began = time.monotonic()
    n = 300
    for i in range(n):
        await queue.add(Tenanted.work, Work(project_id="noisy" if i % 2 else "quiet", n=i))
    elapsed = time.monotonic() - began
    used = delta(before, calls(await aredis.info("commandstats")))

    # Each add is one XADD; the flag reads (a script) come at most once per half bound.
    reads_allowed = 1 + int(elapsed / (STALE_S / 2))
    assert used.get("xadd", 0) == n
    assert used.get("evalsha", 0) <= reads_allowed, (used, elapsed)
    assert used.get("zrange", 0) == used.get("evalsha", 0)  # every script call was a read
    assert await lane_lengths(aredis, prefix) == (1 + n // 2, n // 2)


def test_sync_queue_follows_flags_within_the_bound_without_a_read_per_add(
    sredis: redis.Redis, prefix: str
) -> None:
    queue = SyncQueue(Tenanted, sredis, prefix=prefix, tenant_flags_staleness=STALE_S)
    queue.add(Tenanted.work, Work(project_id="noisy"))
    SyncQueueAdmin(sredis, Tenanted, prefix=prefix).flag_tenant("noisy", timedelta(minutes=1))
    time.sleep(STALE_S)
    before = calls(sredis.info("commandstats"))  # type: ignore[arg-type]
    began = time.monotonic()
    for i in range(100):
        queue.add(Tenanted.work, Work(project_id="noisy", n=i))
    elapsed = time.monotonic() - began
    used = delta(before, calls(sredis.info("commandstats")))  # type: ignore[arg-type]

    assert sync_lane_lengths(sredis, prefix) == (1, 100)
    assert used.get("xadd", 0) == 100
    assert used.get("evalsha", 0) <= 1 + int(elapsed / (STALE_S / 2))


async def test_unflagged_tenant_goes_back_to_primary_within_the_bound(
    aredis: aioredis.Redis, prefix: str
) -> None:
    admin = QueueAdmin(aredis, Tenanted, prefix=prefix)
    queue = Queue(Tenanted, aredis, prefix=prefix, tenant_flags_staleness=STALE_S)
    await admin.flag_tenant("noisy", 60)
    await queue.add(Tenanted.work, Work(project_id="noisy"))
    assert await lane_lengths(aredis, prefix) == (0, 1)

    assert await admin.unflag_tenant("noisy") is True
    assert await admin.unflag_tenant("noisy") is False
    await asyncio.sleep(STALE_S)
    await queue.add(Tenanted.work, Work(project_id="noisy"))
    assert await lane_lengths(aredis, prefix) == (1, 1)


async def test_expired_flag_sends_the_tenant_back_to_primary_without_a_new_read(
    aredis: aioredis.Redis, prefix: str
) -> None:
    # A long bound: only the flag's own expiry (known on the Redis clock) can end it.
    queue = Queue(Tenanted, aredis, prefix=prefix, tenant_flags_staleness=60)
    await QueueAdmin(aredis, Tenanted, prefix=prefix).flag_tenant("noisy", 0.4)
    await queue.add(Tenanted.work, Work(project_id="noisy"))
    assert await lane_lengths(aredis, prefix) == (0, 1)
    await asyncio.sleep(0.5)
    await queue.add(Tenanted.work, Work(project_id="noisy"))
    assert await lane_lengths(aredis, prefix) == (1, 1)
    # Redis dropped both keys with the last flag.
    qk = QueueKeys(prefix, "tn", 2)
    assert await aredis.exists(qk.tenant_flags, qk.tenant_reasons) == 0


async def test_an_explicit_lane_choice_wins_over_a_flag(
    aredis: aioredis.Redis, prefix: str
) -> None:
    await QueueAdmin(aredis, Tenanted, prefix=prefix).flag_tenant("noisy", 60)
    primary = Queue(Tenanted, aredis, prefix=prefix, secondary=False)
    await primary.add(Tenanted.work, Work(project_id="noisy"))
    assert await lane_lengths(aredis, prefix) == (1, 0)
    ignoring = Queue(Tenanted, aredis, prefix=prefix, tenant_flags_staleness=None)
    await ignoring.add(Tenanted.work, Work(project_id="noisy"))
    assert await lane_lengths(aredis, prefix) == (2, 0)
    secondary = Queue(Tenanted, aredis, prefix=prefix, secondary=True)
    await secondary.add(Tenanted.work, Work(project_id="quiet"))
    assert await lane_lengths(aredis, prefix) == (2, 1)


async def test_a_flag_only_lengthens_and_the_listing_shows_reason_author_and_since(
    aredis: aioredis.Redis, prefix: str
) -> None:
    admin = QueueAdmin(aredis, Tenanted, prefix=prefix)
    first = await admin.flag_tenant("noisy", timedelta(minutes=10), reason="upstream 429s")
    again = await admin.flag_tenant("noisy", 5, reason="still throttled", by="ops")
    await admin.flag_tenant("other", 30)

    assert again.expires_at_ms == first.expires_at_ms
    flags = await admin.flagged_tenants()
    assert [f.tenant for f in flags] == ["other", "noisy"]  # soonest expiry first
    noisy = flags[1]
    assert (noisy.queue, noisy.reason, noisy.by) == ("tn", "still throttled", "ops")
    assert noisy.expires_at_ms == first.expires_at_ms
    assert noisy.since_ms is not None
    assert noisy.since_ms <= noisy.expires_at_ms - 9 * 60_000
    # The secondary lane's admin sees the same flags: they belong to the queue.
    assert Tenanted.secondary is not None
    side = QueueAdmin(aredis, Tenanted.secondary, prefix=prefix)
    assert [f.tenant for f in await side.flagged_tenants()] == ["other", "noisy"]


@pytest.mark.parametrize(
    ("contract", "words"),
    [(NoLane, "no secondary lane"), (NoTenant, "no tenant_field")],
)
async def test_flagging_a_queue_that_cannot_route_tenants_names_the_queue(
    aredis: aioredis.Redis, prefix: str, contract: Any, words: str
) -> None:
    with pytest.raises(ConfigurationError, match=words) as err:
        await QueueAdmin(aredis, contract, prefix=prefix).flag_tenant("x", 10)
    assert err.value.queue == contract.queue_name


@pytest.mark.parametrize(
    ("tenant", "duration", "reason", "words"),
    [("", 10, "", "tenant"), ("x", 0, "", "duration"), ("x", -1, "", "duration"),
     ("x", 10, "r" * 501, "reason")],
)
async def test_malformed_flag_arguments_are_refused_naming_queue_and_field(
    aredis: aioredis.Redis, prefix: str, tenant: str, duration: float, reason: str, words: str
) -> None:
    with pytest.raises(ConfigurationError, match=words) as err:
        await QueueAdmin(aredis, Tenanted, prefix=prefix).flag_tenant(tenant, duration,
                                                                       reason=reason)
    assert err.value.queue == "tn"
    assert "'tn'" in str(err.value)


def test_a_producer_keeps_routing_with_its_last_view_when_the_read_fails(
    sredis: redis.Redis, prefix: str, caplog: pytest.LogCaptureFixture
) -> None:
    queue = SyncQueue(Tenanted, sredis, prefix=prefix, tenant_flags_staleness=0.05)
    SyncQueueAdmin(sredis, Tenanted, prefix=prefix).flag_tenant("noisy", 60)
    queue.add(Tenanted.work, Work(project_id="noisy"))
    # The flags key of the wrong type makes the read fail; adds go on with the last view.
    qk = QueueKeys(prefix, "tn", 2)
    sredis.delete(qk.tenant_flags)
    sredis.set(qk.tenant_flags, "not a zset")
    time.sleep(0.1)
    queue.add(Tenanted.work, Work(project_id="noisy"))
    assert sync_lane_lengths(sredis, prefix) == (0, 2)
    assert "could not read the flagged tenants" in caplog.text


async def test_short_lived_producers_on_one_client_share_one_view_of_the_flags(
    aredis: aioredis.Redis, prefix: str
) -> None:
    await QueueAdmin(aredis, Tenanted, prefix=prefix).flag_tenant("noisy", 60)
    await Queue(Tenanted, aredis, prefix=prefix).add(Tenanted.work, Work(project_id="a"))
    before = calls(await aredis.info("commandstats"))
    for i in range(20):  # a Queue per request, as a web handler may make
        queue = Queue(Tenanted, aredis, prefix=prefix)
        await queue.add(Tenanted.work, Work(project_id="noisy", n=i))
    used = delta(before, calls(await aredis.info("commandstats")))
    assert used.get("xadd", 0) == 20
    assert used.get("evalsha", 0) <= 1  # at most one refresh, not a read per new producer
    assert await lane_lengths(aredis, prefix) == (1, 20)
