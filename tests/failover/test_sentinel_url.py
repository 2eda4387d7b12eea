"""``SentinelURL``: reading ``redis+sentinel://`` URLs (no server needed)."""

from __future__ import annotations

import pytest

from streamq import ConfigurationError, SentinelURL
from streamq.runtime import WorkerManager


def test_a_sentinel_url_names_every_sentinel_the_service_the_database_and_credentials():
    t = SentinelURL.parse(
        "redis+sentinel://app:s%40cret@10.0.0.1:26379,10.0.0.2:26380,[::1]:26381/jobs/4"
        "?sentinel_password=sp"
    )
    assert t.sentinels == (("10.0.0.1", 26379), ("10.0.0.2", 26380), ("::1", 26381))
    assert (t.service, t.db, t.username, t.password) == ("jobs", 4, "app", "s@cret")
    assert t.sentinel_password == "sp"
    assert t.where() == "redis+sentinel://10.0.0.1:26379,10.0.0.2:26380,::1:26381/jobs/4"


def test_a_sentinel_without_a_port_is_reached_on_the_sentinel_default_port():
    t = SentinelURL.parse("redis+sentinel://sentinel-a,sentinel-b:5000/jobs")
    assert t.sentinels == (("sentinel-a", 26379), ("sentinel-b", 5000))
    assert t.db == 0


@pytest.mark.parametrize(
    ("url", "says"),
    [
        ("redis://h:6379/0", "must start with redis+sentinel://"),
        ("redis+sentinel://h:26379", "names no service"),
        ("redis+sentinel://h:26379/jobs/one", "whole number >= 0, got 'one'"),
        ("redis+sentinel://h:0/jobs", "invalid port '0'"),
        ("redis+sentinel://:26379/jobs", "has no host"),
        ("redis+sentinel://h:26379/jobs?timeout=1", "unknown option(s) timeout"),
    ],
)
def test_a_malformed_sentinel_url_is_a_configuration_error_naming_the_part(url, says):
    with pytest.raises(ConfigurationError) as info:
        SentinelURL.parse(url)
    assert says in str(info.value)


def test_worker_manager_refuses_a_sentinel_url_in_cluster_mode():
    with pytest.raises(ConfigurationError, match="not a Redis Cluster"):
        WorkerManager(redis_url="redis+sentinel://h:26379/jobs", cluster=True)


def test_worker_manager_refuses_a_malformed_sentinel_url_before_connecting():
    with pytest.raises(ConfigurationError, match="names no service"):
        WorkerManager(redis_url="redis+sentinel://h:26379")


def test_the_admin_cli_never_shows_the_password_of_a_sentinel_url():
    from streamq._cli_support import masked

    assert masked("redis+sentinel://u:hunter2@h1:26379,h2:26380/jobs/1") == (
        "redis+sentinel://h1:26379,h2:26380/jobs/1"
    )
    assert "hunter2" not in masked("redis+sentinel://u:hunter2@h1:26379")
