"""Two applications on one Redis, each under its own key prefix: with ACL users restricted to
their prefixes neither can read or settle the other's jobs, and even without ACLs two workers
side by side touch only their own keys (every command each sent, seen by MONITOR)."""

from __future__ import annotations

import re
import socket
import threading
from collections.abc import Iterator
from typing import Any

import pytest
import redis
import redis.asyncio as aioredis
from pydantic import BaseModel

from streamq import (
    App,
    Backoff,
    Job,
    PermanentError,
    PermissionsMissing,
    Queue,
    QueueContract,
    RedisRefused,
    RunnerContext,
    WorkerManager,
    job,
    ops,
)
from streamq._redis import run_calls
from streamq.keys import QueueKeys
from tests.runtime.support import wait_until
from tests.security.conftest import MakeUser
from tests.support.redis_server import RedisServer


class Order(BaseModel):
    n: int


class Orders(QueueContract, name="orders", shards=2):
    place = job("place", Order)


def orders_app(ran: list[int], leading: list[str], tag: str) -> App[None]:
    app = App([Orders])

    @app.processor(Orders, concurrency=2, block_timeout=0.1, promote_interval=0.05,
                   attempts=2, backoff=Backoff.fixed(0.05), lock_duration=1, stalled_interval=0.2)
    async def place(j: Job[Order]) -> None:
        ran.append(j.payload.n)
        if j.payload.n % 3 == 0 and j.attempt == 1:
            raise ValueError("once")
        if j.payload.n % 5 == 0:
            raise PermanentError("never")

    # The same runner name in both apps: each prefix has its own lease, so both lead.
    @app.runner("leader", singleton=True, lease=2.0, renew_interval=0.2, every=0.05)
    async def lead(ctx: RunnerContext[Any]) -> None:
        leading.append(tag)
        await ctx.fenced_set(ctx.key("mark"), tag)

    return app


# -- with ACL users ---------------------------------------------------------------------------
async def test_an_app_user_cannot_read_settle_or_claim_another_apps_jobs(
    admin: aioredis.Redis, make_user: MakeUser, prefix: str
) -> None:
    a, b = f"{prefix}-a", f"{prefix}-b"
    await Queue(Orders, admin, prefix=b).for_key("x").add(Orders.place, Order(n=1))
    b_shard = QueueKeys(b, "orders", 2).for_key("x")
    await admin.xgroup_create(b_shard.stream, "streamq", id="0")
    (_, [(entry, _)]), = await admin.xreadgroup("streamq", "b-worker", {b_shard.stream: ">"})

    client = aioredis.Redis.from_url(make_user("worker", a))
    try:
        for command in (
            ("XREADGROUP", "GROUP", "streamq", "a-worker", "STREAMS", b_shard.stream, ">"),
            ("XAUTOCLAIM", b_shard.stream, "streamq", "a-worker", "0", "0-0"),
            ("XCLAIM", b_shard.stream, "streamq", "a-worker", "0", entry),
            ("XACK", b_shard.stream, "streamq", entry),
            ("XRANGE", b_shard.stream, "-", "+"),
            ("HGETALL", QueueKeys(b, "orders", 2).meta),
        ):
            with pytest.raises(redis.exceptions.NoPermissionError, match="key"):
                await client.execute_command(*command)
        # A settle is a script; its KEYS are B's, so Redis refuses it before it runs.
        call = ops.complete(b_shard, "streamq", "b-worker", [entry], token="t1")
        with pytest.raises(RedisRefused) as info:
            await run_calls(client, [call], queue="orders")
        assert b_shard.stream in str(info.value)
    finally:
        await client.aclose()
    # B's job is still pending for B's consumer, untouched.
    pending = await admin.xpending(b_shard.stream, "streamq")
    assert pending["pending"] == 1


async def test_a_worker_pointed_at_another_apps_prefix_refuses_to_start(
    make_user: MakeUser, prefix: str
) -> None:
    a, b = f"{prefix}-a", f"{prefix}-b"
    m = WorkerManager(redis_url=make_user("worker", a), prefix=b)
    m.register_app(orders_app([], [], "a"))
    with pytest.raises(PermissionsMissing) as info:
        await m.start()
    await m.close_workers()
    assert info.value.missing == [f"~{b}:*"]


# -- without ACLs: every key each worker touched ------------------------------------------------
_ARG = re.compile(r'"((?:[^"\\]|\\.)*)"')
_LINE = re.compile(r"^\+?[\d.]+ \[\d+ (?P<client>[^\]]+)\] (?P<args>.*)$")
_ESC = {"n": b"\n", "r": b"\r", "t": b"\t", "a": b"\a", "b": b"\b", '"': b'"', "\\": b"\\"}


def _unescape(text: str) -> bytes:
    out = bytearray()
    i = 0
    while i < len(text):
        ch = text[i]
        if ch == "\\" and i + 1 < len(text):
            nxt = text[i + 1]
            if nxt == "x":
                out += bytes([int(text[i + 2:i + 4], 16)])
                i += 4
                continue
            out += _ESC.get(nxt, nxt.encode())
            i += 2
            continue
        out += ch.encode()
        i += 1
    return bytes(out)


class Monitor:
    """Every command the server runs, as ``(client address or 'lua', args)``, read by a thread
    on a raw MONITOR connection."""

    def __init__(self, port: int) -> None:
        self.sock = socket.create_connection(("127.0.0.1", port))
        self.sock.sendall(b"MONITOR\r\n")
        self.lines: list[tuple[str, list[bytes]]] = []
        self.thread = threading.Thread(target=self._read, daemon=True)
        self.thread.start()

    def _read(self) -> None:
        buf = b""
        while True:
            try:
                chunk = self.sock.recv(65536)
            except OSError:
                return
            if not chunk:
                return
            buf += chunk
            *done, buf = buf.split(b"\r\n")
            for raw in done:
                m = _LINE.match(raw.decode("utf-8", "replace"))
                if m:
                    args = [_unescape(a) for a in _ARG.findall(m["args"])]
                    self.lines.append((m["client"], args))

    def close(self) -> None:
        self.sock.close()


@pytest.fixture
def monitor(acl_server: RedisServer) -> Iterator[Monitor]:
    mon = Monitor(acl_server.port)
    yield mon
    mon.close()


def keys_of(r: redis.Redis, args: list[bytes]) -> list[str]:
    """The keys of one command, as the server itself finds them (COMMAND GETKEYS)."""
    try:
        return [k.decode() if isinstance(k, bytes) else str(k) for k in r.command_getkeys(*args)]
    except redis.ResponseError:
        return []  # a command without keys (PING, TIME, SCRIPT LOAD, CLIENT ...)


async def test_two_prefixes_on_one_redis_never_touch_each_others_keys(
    acl_server: RedisServer, admin: aioredis.Redis, make_user: MakeUser, monitor: Monitor,
    prefix: str,
) -> None:
    apps = {"a": f"{prefix}-a", "b": f"{prefix}-b"}
    users = {}
    for tag, p in apps.items():
        # Full rights on every key: only the prefix keeps the apps apart here.
        users[tag] = make_user("worker", p, grant=["allkeys", "+@all"])
    ran: dict[str, list[int]] = {"a": [], "b": []}
    leading: list[str] = []
    managers = {}
    for tag, p in apps.items():
        m = WorkerManager(redis_url=users[tag], prefix=p)
        m.register_app(orders_app(ran[tag], leading, tag))
        managers[tag] = m
    conns = {tag: aioredis.Redis.from_url(users[tag]) for tag in apps}
    producers = {tag: Queue(Orders, conns[tag], prefix=p) for tag, p in apps.items()}
    try:
        for m in managers.values():
            await m.start()
        for tag, q in producers.items():
            base = 100 if tag == "b" else 0
            for n in range(1, 11):
                await q.add(Orders.place, Order(n=base + n), delay=0.1 if n % 4 == 0 else None)
        await wait_until(lambda: set(ran["a"]) == set(range(1, 11))
                         and set(ran["b"]) == set(range(101, 111)), timeout_s=20,
                         what="both apps' jobs")
        await wait_until(lambda: {"a", "b"} <= set(leading), what="both runners leading")
        for m in managers.values():
            await m.run_until_idle(15)
        client_list = await admin.client_list()
    finally:
        for m in managers.values():
            await m.close_workers(timeout_s=2)
        for c in conns.values():
            await c.aclose()
    owner = {c["addr"]: c["user"] for c in client_list}
    sync = redis.Redis(port=acl_server.port)
    touched: dict[str, set[str]] = {"a": set(), "b": set(), "lua": set()}
    user_tag = {user.split("//")[1].split(":")[0]: tag for tag, user in users.items()}
    for client, args in list(monitor.lines):
        tag = "lua" if client == "lua" else user_tag.get(owner.get(client, ""))
        if tag is None:
            continue  # the test's own admin connection, or one gone before CLIENT LIST
        touched[tag].update(keys_of(sync, args))
    sync.close()

    assert touched["a"], "MONITOR saw app a's commands"
    assert touched["b"], "MONITOR saw app b's commands"
    assert all(k.startswith(f"{apps['a']}:") for k in touched["a"]), touched["a"]
    assert all(k.startswith(f"{apps['b']}:") for k in touched["b"]), touched["b"]
    # Inside scripts too: every key a script touched is one of its caller's prefixes.
    assert all(k.startswith((f"{apps['a']}:", f"{apps['b']}:")) for k in touched["lua"])
    assert not set(ran["a"]) & set(ran["b"])
    stored = {k.decode() for k in await admin.keys(f"{prefix}-*")}
    assert {k for k in stored if k.startswith(f"{apps['a']}:")} <= touched["a"] | touched["lua"]
