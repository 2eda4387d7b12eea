"""A worker checks its ACL permissions at start (ACL DRYRUN when its user may run it, otherwise
a script asking redis.acl_check_cmd) and refuses to start naming what is missing."""

from __future__ import annotations

import pytest
import redis.asyncio as aioredis
from pydantic import BaseModel

from streamq import App, Job, PermissionsMissing, QueueContract, WorkerManager, job
from streamq.keys import QueueKeys
from streamq.security import (
    ROLE_COMMANDS,
    acl_key_pattern,
    acl_rules,
    acl_setuser,
    missing_permissions,
)
from tests.entrypoint.helpers import clean_env, last_line, run_worker
from tests.security.conftest import MakeUser
from tests.support.redis_server import free_port


class Unit(BaseModel):
    n: int = 0


class Checked(QueueContract, name="checked"):
    unit = job("unit", Unit)


def app() -> App[None]:
    a = App([Checked])

    @a.processor(Checked, block_timeout=0.1)
    async def proc(j: Job[Unit]) -> None: ...

    return a


DRYRUN = {"with ACL DRYRUN": ["+acl|dryrun"], "by the script probe": []}


@pytest.mark.parametrize("grant", DRYRUN.values(), ids=DRYRUN.keys())
@pytest.mark.parametrize("role", ["producer", "worker", "operator"])
async def test_a_user_with_exactly_its_roles_rules_misses_nothing(
    make_user: MakeUser, prefix: str, role: str, grant: list[str]
) -> None:
    client = aioredis.Redis.from_url(make_user(role, prefix, grant=grant))
    try:
        assert await missing_permissions(client, role, prefix=prefix) == []  # type: ignore[arg-type]
    finally:
        await client.aclose()


@pytest.mark.parametrize("grant", DRYRUN.values(), ids=DRYRUN.keys())
async def test_a_worker_missing_a_command_refuses_to_start_and_names_it(
    admin: aioredis.Redis, make_user: MakeUser, prefix: str, grant: list[str]
) -> None:
    url = make_user("worker", prefix, grant=grant, deny=["xautoclaim", "xgroup|create"])
    m = WorkerManager(redis_url=url, prefix=prefix)
    m.register_app(app())
    with pytest.raises(PermissionsMissing) as info:
        await m.start()
    await m.close_workers()
    assert info.value.missing == ["+xautoclaim", "+xgroup|create"]
    assert info.value.role == "worker"
    assert info.value.user == url.split("//")[1].split(":")[0]
    assert "+xautoclaim +xgroup|create" in str(info.value)
    assert f"ACL SETUSER {info.value.user} +xautoclaim" in str(info.value)
    # Refused before anything was read or created.
    assert await admin.keys(f"{prefix}:*") == []


async def test_a_worker_whose_keys_are_another_prefixs_is_told_the_key_pattern_it_needs(
    make_user: MakeUser, prefix: str
) -> None:
    url = make_user("worker", f"{prefix}-other")
    m = WorkerManager(redis_url=url, prefix=prefix)
    m.register_app(app())
    with pytest.raises(PermissionsMissing) as info:
        await m.start()
    await m.close_workers()
    assert info.value.missing == [acl_key_pattern(prefix)]


async def test_a_worker_that_may_not_run_scripts_is_told_so(
    make_user: MakeUser, prefix: str
) -> None:
    url = make_user("worker", prefix, deny=["evalsha"])
    m = WorkerManager(redis_url=url, prefix=prefix)
    m.register_app(app())
    with pytest.raises(PermissionsMissing) as info:
        await m.start()
    await m.close_workers()
    assert info.value.missing == ["+evalsha"]


async def test_an_operator_user_cannot_run_a_worker(make_user: MakeUser, prefix: str) -> None:
    m = WorkerManager(redis_url=make_user("operator", prefix), prefix=prefix)
    m.register_app(app())
    with pytest.raises(PermissionsMissing) as info:
        await m.start()
    await m.close_workers()
    assert {"+xreadgroup", "+xautoclaim", "+xclaim", "+xack"} <= set(info.value.missing)


def test_python_m_worker_exits_2_listing_the_missing_permissions(
    make_user: MakeUser, prefix: str
) -> None:
    url = make_user("worker", prefix, deny=["xclaim"])
    done = run_worker(clean_env(WORKER_APP="tests.entrypoint.sample_app:app", REDIS_URL=url,
                                REDIS_PREFIX=prefix, QUEUE_CONSUMER_NOTES_IS_ENABLED="true",
                                METRICS_PORT=str(free_port())))
    assert done.returncode == 2, done.stderr
    line = last_line(done.stderr)
    assert "+xclaim" in line, line
    assert "worker role" in line


def test_acl_rules_start_from_nothing_and_cover_only_the_prefix() -> None:
    rules = acl_rules("producer", prefix="my*app")
    assert rules[:4] == ["resetkeys", r"~my\*app:*", "resetchannels", "-@all"]
    assert {r.removeprefix("+") for r in rules[4:]} == ROLE_COMMANDS["producer"]
    assert ROLE_COMMANDS["producer"] < ROLE_COMMANDS["worker"]
    assert not {"flushall", "flushdb", "keys", "config|get", "eval"} & set().union(
        *ROLE_COMMANDS.values())
    line = acl_setuser("worker", prefix="myapp", user="myapp-worker", password="pw")
    assert line.startswith("ACL SETUSER myapp-worker reset on >pw resetkeys ~myapp:* ")
    assert QueueKeys("myapp", "q", 1).shards[0].stream.startswith("myapp:")


async def test_another_users_permissions_are_told_by_acl_dryrun_or_not_at_all(
    make_user: MakeUser, admin: aioredis.Redis, prefix: str
) -> None:
    other = make_user("producer", prefix)
    other_user = other.split("//")[1].split(":")[0]
    # The default user may run ACL DRYRUN: it can tell what the producer lacks as a worker.
    missing = await missing_permissions(admin, "worker", prefix=prefix, user=other_user)
    assert missing is not None
    assert "+xreadgroup" in missing
    # A worker user may not: its script probe answers only for itself, so no answer.
    client = aioredis.Redis.from_url(make_user("worker", prefix))
    try:
        assert await missing_permissions(client, "worker", prefix=prefix,
                                         user=other_user) is None
    finally:
        await client.aclose()
