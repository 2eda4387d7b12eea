"""What fakeredis cannot do is refused, not done differently."""

from __future__ import annotations

import pytest
import redis

from streamq.errors import ConfigurationError
from streamq.pytest_plugin import StreamqRedis
from streamq.testing import FAKE_LIMITS, TestRedis


@pytest.mark.parametrize(
    "command",
    [("CLIENT", "PAUSE", "10"), ("CLIENT", "KILL", "ID", "999999"), ("SAVE",), ("BGSAVE",)],
)
def test_commands_the_fake_would_ignore_are_refused_there(
    streamq_redis: StreamqRedis, command: tuple[str, ...]
) -> None:
    if streamq_redis.kind == "real":
        pytest.skip("a real redis-server does what these commands say")
    client = streamq_redis.sync_client()
    with pytest.raises(redis.ResponseError, match=r"refused by streamq's fake Redis"):
        client.execute_command(*command)
    # A script cannot go around it either.
    with pytest.raises(redis.ResponseError, match=r"refused by streamq's fake Redis"):
        client.eval("return redis.call(ARGV[1], unpack(ARGV, 2))", 0, *command)


def test_commands_fakeredis_does_not_know_fail_loudly(streamq_redis: StreamqRedis) -> None:
    client = streamq_redis.sync_client()
    if streamq_redis.kind == "real":
        assert client.config_get("maxmemory-policy") == {"maxmemory-policy": "noeviction"}
        return
    for command in (("CONFIG", "GET", "maxmemory"), ("INFO",), ("OBJECT", "ENCODING", "k"),
                    ("MEMORY", "USAGE", "k"), ("SHUTDOWN",), ("CLUSTER", "INFO")):
        with pytest.raises(redis.ResponseError, match="unknown command"):
            client.execute_command(*command)


def test_require_refuses_on_the_fake_naming_what_it_lacks(
    streamq_redis_server: TestRedis,
) -> None:
    for feature in FAKE_LIMITS:
        assert streamq_redis_server.supports(feature) is (streamq_redis_server.kind == "real")
    if streamq_redis_server.kind == "real":
        streamq_redis_server.require(*FAKE_LIMITS)
        return
    with pytest.raises(ConfigurationError) as info:
        streamq_redis_server.require("memory_limits", "persistence")
    assert "needs a real redis-server" in str(info.value)
    assert "memory_limits (maxmemory" in str(info.value)
    assert "persistence (AOF" in str(info.value)


def test_an_unknown_feature_is_a_clear_error(streamq_redis_server: TestRedis) -> None:
    with pytest.raises(ConfigurationError,
                       match="unknown Redis feature 'lua'; known: client_control, cluster"):
        streamq_redis_server.supports("lua")


# -- what streamq relies on, held by both ----------------------------------------------------


def test_a_blocking_group_read_wakes_when_an_entry_is_added(streamq_redis: StreamqRedis) -> None:
    import threading
    import time

    reader, writer = streamq_redis.sync_client(), streamq_redis.sync_client()
    stream = f"{streamq_redis.prefix}:s"
    reader.xgroup_create(stream, "g", id="0", mkstream=True)
    got: dict[str, object] = {}

    def read() -> None:
        started = time.monotonic()
        got["reply"] = reader.xreadgroup("g", "c", {stream: ">"}, count=1, block=20_000)
        got["waited"] = time.monotonic() - started

    thread = threading.Thread(target=read)
    thread.start()
    # Once the read is blocked, the add must wake it, long before its 20 s block ends.
    deadline = time.monotonic() + 10
    while not blocked(writer, stream, streamq_redis.kind):
        assert time.monotonic() < deadline, "the read never blocked"
        time.sleep(0.01)
    writer.xadd(stream, {"k": "v"})
    thread.join(20)
    assert got["reply"], got
    assert float(got["waited"]) < 15  # type: ignore[arg-type]


def blocked(client: redis.Redis, stream: str, kind: str) -> bool:
    if kind == "real":  # Redis adds the consumer only once the read is served
        return any(c.get("cmd") == "xreadgroup" for c in client.client_list())
    # fakeredis has no per-client command in CLIENT LIST; it adds the consumer at once.
    return bool(client.xinfo_groups(stream)[0]["consumers"])


def test_xautoclaim_reports_entries_deleted_while_pending(streamq_redis: StreamqRedis) -> None:
    client = streamq_redis.sync_client()
    stream = f"{streamq_redis.prefix}:s"
    client.xgroup_create(stream, "g", id="0", mkstream=True)
    kept, gone = client.xadd(stream, {"n": "1"}), client.xadd(stream, {"n": "2"})
    client.xreadgroup("g", "old", {stream: ">"}, count=10)
    client.xdel(stream, gone)
    cursor, claimed, deleted = client.xautoclaim(stream, "g", "new", 0, "0-0", count=10)[:3]
    assert cursor == b"0-0"
    assert [e[0] for e in claimed] == [kept]
    assert deleted == [gone]
    pending = client.xpending_range(stream, "g", "-", "+", 10)
    assert [(p["message_id"], p["consumer"], p["times_delivered"]) for p in pending] == [
        (kept, b"new", 2)
    ]
