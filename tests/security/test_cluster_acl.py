"""The role ACLs on a real Redis Cluster: with the cluster client's two extra commands every
role works on every node; without them the worker says what to grant."""

from __future__ import annotations

import uuid
from collections.abc import Callable, Iterator

import pytest
import redis
import redis.asyncio as aioredis

from streamq import App, DeadLetters, Job, Queue, QueueAdmin, WorkerManager
from streamq.security import Role, acl_rules, missing_permissions
from tests.entrypoint.helpers import clean_env, last_line, run_worker
from tests.runtime.support import wait_until
from tests.security.test_acl_roles import EXPECTED, Sec, Work
from tests.support.redis_server import RedisCluster, free_port

MakeClusterUser = Callable[..., str]


@pytest.fixture
def cluster_user(redis_cluster: RedisCluster) -> Iterator[MakeClusterUser]:
    """``cluster_user(role, prefix, cluster=True)``: the same ACL user on every node; its URL."""
    made: list[str] = []

    def make(role: Role, prefix: str, *, cluster: bool = True) -> str:
        user = f"{prefix}-{role}-{uuid.uuid4().hex[:4]}"
        for node in redis_cluster.nodes:
            with redis.Redis(port=node.port) as r:
                r.execute_command("ACL", "SETUSER", user, "reset", "on", ">pw",
                                  *acl_rules(role, prefix=prefix, cluster=cluster))
        made.append(user)
        return f"redis://{user}:pw@127.0.0.1:{redis_cluster.nodes[0].port}/0"

    yield make
    for node in redis_cluster.nodes:
        with redis.Redis(port=node.port) as r:
            for user in made:
                r.execute_command("ACL", "DELUSER", user)


def denials(cluster: RedisCluster, url: str) -> list[str]:
    user = url.split("//")[1].split(":")[0]
    out = []
    for node in cluster.nodes:
        with redis.Redis(port=node.port) as r:
            out += [f"{e['reason']} {e['object']}" for e in r.acl_log()
                    if e.get("username") == user]
    return [d for d in out if d not in EXPECTED]


async def test_every_role_works_on_a_cluster_with_its_rules(
    redis_cluster: RedisCluster, cluster_user: MakeClusterUser, prefix: str
) -> None:
    urls = {role: cluster_user(role, prefix) for role in ("producer", "worker", "operator")}
    ran: list[int] = []
    app = App([Sec])

    @app.processor(Sec, block_timeout=0.1, promote_interval=0.05)
    async def proc(j: Job[Work]) -> None:
        ran.append(j.payload.n)

    m = WorkerManager(redis_url=urls["worker"], cluster=True, prefix=prefix)
    m.register_app(app)
    producer = aioredis.RedisCluster.from_url(urls["producer"])
    operator = aioredis.RedisCluster.from_url(urls["operator"])
    try:
        for role, url in urls.items():
            client = aioredis.RedisCluster.from_url(url)
            try:
                assert await missing_permissions(client, role, prefix=prefix) == []  # type: ignore[arg-type]
            finally:
                await client.aclose()
        await m.start()
        q = Queue(Sec, producer, prefix=prefix)
        for n in range(6):
            await q.for_key(f"k{n}").add(Sec.work, Work(n=n), delay=0.1 if n % 2 else None)
        await wait_until(lambda: sorted(ran) == list(range(6)), timeout_s=20,
                         what="the jobs on the cluster")
        await m.run_until_idle(10)
        depth = await QueueAdmin(operator, Sec, prefix=prefix).depth()
        assert depth.ready == 0
        assert await DeadLetters(operator, Sec, prefix=prefix).count() == 0
    finally:
        await m.close_workers(timeout_s=2)
        await producer.aclose()
        await operator.aclose()
    for url in urls.values():
        assert denials(redis_cluster, url) == []


def test_a_cluster_worker_without_the_cluster_commands_exits_2_naming_them(
    cluster_user: MakeClusterUser, prefix: str
) -> None:
    url = cluster_user("worker", prefix, cluster=False)
    done = run_worker(clean_env(WORKER_APP="tests.entrypoint.sample_app:app", REDIS_URL=url,
                                REDIS_CLUSTER="true", REDIS_PREFIX=prefix,
                                QUEUE_CONSUMER_CHORES_IS_ENABLED="true",
                                METRICS_PORT=str(free_port())))
    assert done.returncode == 2, done.stderr
    line = last_line(done.stderr)
    assert "+cluster|slots and +command" in line, line
    assert "Cluster mode is not enabled" not in line.split("(")[0]
