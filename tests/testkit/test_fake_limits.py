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
