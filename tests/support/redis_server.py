"""The suite's Redis servers: see :mod:`streamq.testing`."""

from streamq.testing import (
    RedisCluster,
    RedisSentinel,
    RedisServer,
    find_binary,
    free_cluster_ports,
    free_port,
)

__all__ = [
    "RedisCluster",
    "RedisSentinel",
    "RedisServer",
    "find_binary",
    "free_cluster_ports",
    "free_port",
]
