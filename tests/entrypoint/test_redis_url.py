"""``REDIS_URL`` is checked before anything connects: every form redis-py would misread or
refuse in a traceback is a settings problem naming the variable (and never its password)."""

from __future__ import annotations

from subprocess import CompletedProcess

import pytest

from worker.redis_url import database, location
from worker.settings import SettingsError, parse_settings

from .helpers import clean_env, last_line, run_workers

LANES = ["notes", "notes-secondary", "chores"]


def worker_env(url: str) -> dict[str, str]:
    return clean_env(WORKER_APP="tests.entrypoint.sample_app:app", REDIS_URL=url,
                     QUEUE_CONSUMER_NOTES_IS_ENABLED="true", LOG_FORMAT="json")


MALFORMED = {
    "localhost:6379": "has no scheme",
    "http://user:hunter2@localhost:6379/0": "scheme 'http' is not one of",
    "redis://localhost:notaport": "invalid port 'notaport'",
    "redis://localhost:6379/abc": "database index must be a whole number",
}


@pytest.fixture(scope="module")
def outcomes() -> dict[str, CompletedProcess[str]]:
    """One ``python -m worker`` per malformed URL, run side by side."""
    return run_workers({url: worker_env(url) for url in MALFORMED})


@pytest.mark.parametrize("url", list(MALFORMED))
def test_malformed_redis_url_exits_2_naming_it(
    url: str, outcomes: dict[str, CompletedProcess[str]]
) -> None:
    done = outcomes[url]
    assert done.returncode == 2, done.stderr
    last = last_line(done.stderr).strip()
    assert last.startswith("REDIS_URL: ")
    assert MALFORMED[url] in last
    assert "hunter2" not in done.stderr
    assert "Traceback" not in done.stderr


@pytest.mark.parametrize(
    ("url", "cluster", "says"),
    [
        ("localhost:6379", "false", "did you mean redis://localhost:6379?"),
        ("redis://host:99999/0", "false", "invalid port '99999'"),
        ("redis://host:0", "false", "invalid port 0"),
        ("redis://:6379/0", "false", "has no host"),
        ("redis://host:6379/0/1", "false", "is not a database index"),
        ("redis://host:6379/0?db=x", "false", "whole number >= 0, got 'x'"),
        ("redis://u:pw@host:6379/0?colour=red", "false", "unknown option 'colour'"),
        ("redis://host:6379/0?socket_timeout=soon", "false", "query string is invalid"),
        ("unix://", "false", "needs the socket's path"),
        ("redis://host:6379/3", "true", "a Redis Cluster has only database 0"),
        ("unix:///run/redis.sock", "true", "not a unix socket"),
        ("redis+sentinel://h1:26379,h2:26379", "false", "names no service"),
        ("redis+sentinel://h1:26379/jobs/x", "false", "whole number >= 0, got 'x'"),
        ("redis+sentinel://h1:nope/jobs", "false", "invalid port 'nope'"),
        ("redis+sentinel://u:pw@h1:26379/jobs?colour=red", "false", "unknown option(s) colour"),
        ("redis+sentinel://h1:26379/jobs/0/1", "false", "expected /service_name[/db]"),
        ("redis+sentinel://h1:26379/jobs/0", "true", "cannot use a redis+sentinel:// URL"),
    ],
)
def test_every_redis_url_problem_is_named_before_connecting(
    url: str, cluster: str, says: str
) -> None:
    env = {"WORKER_APP": "x:app", "QUEUE_CONSUMER_NOTES_IS_ENABLED": "true",
           "REDIS_URL": url, "REDIS_CLUSTER": cluster}
    with pytest.raises(SettingsError) as info:
        parse_settings(env, lanes=LANES)
    problems = dict(info.value.problems)
    assert says in problems["REDIS_URL"]
    assert "pw@" not in problems["REDIS_URL"]


@pytest.mark.parametrize(
    "url",
    ["redis://localhost", "redis://u:p@db.internal:6380/15", "rediss://h:6380/0?ssl_cert_reqs=required",
     "unix:///run/redis.sock?db=2", "redis://[::1]:6379/1",
     "redis+sentinel://h1:26379,h2:26380/jobs/2",
     "redis+sentinel://u:p@h1:26379/jobs?sentinel_password=s"],
)
def test_valid_redis_urls_are_kept_as_given(url: str) -> None:
    env = {"WORKER_APP": "x:app", "QUEUE_CONSUMER_NOTES_IS_ENABLED": "true", "REDIS_URL": url}
    assert parse_settings(env, lanes=LANES).redis_url == url


def test_a_sentinel_url_gives_its_database_and_a_location_without_the_password() -> None:
    url = "redis+sentinel://u:hunter2@h1:26379,h2:26380/jobs/3"
    assert database(url) == 3
    assert location(url, 6390) == "redis+sentinel://h1:26379,h2:26380/jobs/3"
