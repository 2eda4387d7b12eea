"""What ``python -m worker`` says when it cannot start: exit 2 naming what to change for bad
configuration (REDIS_URL, REDIS_CLUSTER, the app, what Redis refuses), exit 1 for an
unreachable Redis, and never a raw traceback for either."""

from __future__ import annotations

import os
import socket
import textwrap
from collections.abc import Iterator
from pathlib import Path
from subprocess import CompletedProcess

import pytest
import redis
from redis.exceptions import (
    AuthenticationError,
    MovedError,
    NoPermissionError,
    RedisClusterException,
    ResponseError,
)

from streamq.errors import (
    ConfigurationError,
    ForeignConsumerGroup,
    IncompatibleContract,
    RedisRefused,
    RedisUnavailable,
    RegistrationError,
    UnsafeRedisConfig,
)
from streamq.fingerprint import record_contract_sync
from streamq.keys import QueueKeys
from tests.support.redis_server import RedisServer, find_binary
from worker.failures import explain
from worker.settings import Settings

from .helpers import WorkerProcess, clean_env, run_worker, run_workers


def worker_env(url: str, prefix: str = "p", **extra: str) -> dict[str, str]:
    return clean_env(WORKER_APP="tests.entrypoint.sample_app:app", REDIS_URL=url,
                     REDIS_PREFIX=prefix, QUEUE_CONSUMER_NOTES_IS_ENABLED="true",
                     LOG_FORMAT="json", **extra)


def assert_no_traceback(stderr: str) -> None:
    assert "Traceback" not in stderr
    assert '"exc"' not in stderr  # a JSON log record carrying one


# -- refusals at connection time ------------------------------------------------------------
def test_a_database_index_the_server_refuses_exits_2_naming_redis_url(
    redis_server: RedisServer,
) -> None:
    done = run_worker(worker_env(f"redis://127.0.0.1:{redis_server.port}/99"))
    assert done.returncode == 2, done.stderr
    assert "REDIS_URL selects database 99" in done.stderr
    assert "DB index is out of range" in done.stderr
    assert_no_traceback(done.stderr)


def test_cluster_mode_against_a_plain_node_exits_2_naming_redis_cluster(
    redis_server: RedisServer,
) -> None:
    done = run_worker(worker_env(redis_server.url, REDIS_CLUSTER="true"))
    assert done.returncode == 2, done.stderr
    assert "REDIS_CLUSTER=true but redis://127.0.0.1:" in done.stderr
    assert "is not a Redis Cluster node" in done.stderr
    assert_no_traceback(done.stderr)


@pytest.fixture(scope="module")
def acl_server() -> Iterator[RedisServer]:
    """A Redis of this module's own, with a user that may not create consumer groups."""
    binary = find_binary()
    if binary is None:
        pytest.skip("no redis-server")
    server = RedisServer(binary, extra=["--maxmemory-policy", "noeviction"]).start()
    client = redis.Redis(port=server.port)
    client.acl_setuser("limited", enabled=True, passwords=["+s3cret-pw"], keys=["*"],
                       commands=["+@all", "-xgroup"])
    client.close()
    yield server
    server.stop(kill=True)


def test_credentials_redis_refuses_exit_2_naming_redis_url(acl_server: RedisServer) -> None:
    done = run_worker(worker_env(f"redis://limited:wrong-pw@127.0.0.1:{acl_server.port}/0"))
    assert done.returncode == 2, done.stderr
    assert "refused the credentials of REDIS_URL" in done.stderr
    assert "wrong-pw" not in done.stderr
    assert_no_traceback(done.stderr)


def test_a_command_the_acl_denies_exits_2_naming_redis_url(
    acl_server: RedisServer, prefix: str
) -> None:
    url = f"redis://limited:s3cret-pw@127.0.0.1:{acl_server.port}/0"
    done = run_worker(worker_env(url, prefix))
    assert done.returncode == 2, done.stderr
    # The start-up permission check names every missing permission at once.
    assert "lacks permissions the worker role needs" in done.stderr
    assert "+xgroup|create" in done.stderr
    assert "ACL user of REDIS_URL" in done.stderr
    assert "s3cret-pw" not in done.stderr
    assert_no_traceback(done.stderr)


def test_a_foreign_consumer_group_exits_2_naming_worker_group(
    sredis: redis.Redis, redis_url: str, prefix: str
) -> None:
    stream = QueueKeys(prefix, "notes", 2).shards[0].stream
    sredis.xgroup_create(stream, "analytics", id="0", mkstream=True)
    done = run_worker(worker_env(redis_url, prefix))
    assert done.returncode == 2, done.stderr
    assert "['analytics']" in done.stderr
    assert "WORKER_GROUP" in done.stderr
    assert_no_traceback(done.stderr)


def test_a_metrics_port_in_use_exits_2_naming_it(redis_url: str, prefix: str) -> None:
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        done = run_worker(worker_env(redis_url, prefix, METRICS_PORT=str(port),
                                     METRICS_HOST="127.0.0.1"))
    assert done.returncode == 2, done.stderr
    assert f"METRICS_PORT: cannot serve /metrics on 127.0.0.1:{port}" in done.stderr
    assert_no_traceback(done.stderr)


def test_an_incompatible_recorded_contract_exits_2_unless_told_to_start_anyway(
    sredis: redis.Redis, redis_url: str, prefix: str, tmp_path: Path
) -> None:
    from pydantic import BaseModel

    from streamq import QueueContract, job

    class OldWork(BaseModel):
        m: int  # the app's tasks need an n, which jobs of this contract do not carry

    class OldTasks(QueueContract, name="tasks", shards=2):
        task = job("task", OldWork)

    record_contract_sync(sredis, QueueKeys(prefix, "tasks", 2), OldTasks)
    env = clean_env(WORKER_APP="tests.entrypoint.fleet_app:app", REDIS_URL=redis_url,
                    REDIS_PREFIX=prefix, QUEUE_CONSUMER_TASKS_IS_ENABLED="true",
                    LOG_FORMAT="json")
    done = run_worker(env)
    assert done.returncode == 2, done.stderr
    assert '"variable": "WORKER_APP"' in done.stderr
    assert "WORKER_REFUSE_INCOMPATIBLE_CONTRACT=false" in done.stderr  # how to start anyway
    assert_no_traceback(done.stderr)

    w = WorkerProcess({**env, "WORKER_REFUSE_INCOMPATIBLE_CONTRACT": "false"},
                      tmp_path / "worker.log")
    try:
        w.wait_consuming()
        errors = [r for r in w.records() if r["level"] == "ERROR"]
        assert len(errors) == 1
        assert "starting anyway as configured" in errors[0]["message"]
        assert w.terminate() == 0
    finally:
        w.kill()


# -- errors of WorkerManager.start(), raised as the runtime raises them ------------------
START_ERRORS = {
    "registration": ('errors.RegistrationError("queue \'notes\' has no processor")', 2,
                     "WORKER_APP", "RegistrationError: queue 'notes' has no processor"),
    "contract": ('errors.IncompatibleContract("contract changed", changes=["job note: '
                 'field n removed"])', 2, "WORKER_APP", "job note: field n removed"),
    "foreign-group": ('errors.ForeignConsumerGroup("stream p:{notes:0}:stream has consumer '
                      'group(s) [\'billing\'] besides ours", groups=["billing"])', 2,
                      "WORKER_GROUP", "['billing'] besides ours"),
    "refused": ('errors.RedisRefused("Redis refused the call (NOPERM)", reply="NOPERM")', 2,
                "REDIS_URL", "Redis refused a call for good"),
    "unsafe": ('errors.UnsafeRedisConfig("maxmemory-policy is \'allkeys-lru\'")', 2,
               "ALLOW_UNSAFE_EVICTION", "ALLOW_UNSAFE_EVICTION=true starts anyway"),
    "unreachable": ('errors.RedisUnavailable("Redis is unreachable: Error 111")', 1, None,
                    "cannot reach Redis at redis://127.0.0.1:1"),
}


@pytest.fixture(scope="module")
def start_outcomes(
    tmp_path_factory: pytest.TempPathFactory,
) -> dict[str, CompletedProcess[str]]:
    """One ``python -m worker`` per error, each with an app whose manager raises it from
    ``start()``, run side by side."""
    directory = tmp_path_factory.mktemp("apps")
    envs = {}
    for case, (raised, *_) in START_ERRORS.items():
        module = "refusing_" + case.replace("-", "_")
        (directory / f"{module}.py").write_text(textwrap.dedent(f"""
            from streamq import errors
            from streamq.runtime.manager import WorkerManager
            from tests.entrypoint.sample_app import app

            async def refuse(self: WorkerManager) -> None:
                raise {raised}

            WorkerManager.start = refuse
        """))
        env = worker_env("redis://127.0.0.1:1/0")
        env["WORKER_APP"] = f"{module}:app"
        env["PYTHONPATH"] = os.pathsep.join(
            filter(None, [str(directory), env.get("PYTHONPATH")])
        )
        envs[case] = env
    return run_workers(envs)


@pytest.mark.parametrize("case", sorted(START_ERRORS))
def test_start_errors_exit_with_one_line_naming_what_to_change(
    case: str, start_outcomes: dict[str, CompletedProcess[str]]
) -> None:
    _, code, variable, says = START_ERRORS[case]
    done = start_outcomes[case]

    assert done.returncode == code, done.stderr
    errors = [line for line in done.stderr.splitlines() if '"level": "ERROR"' in line]
    assert len(errors) == 1, done.stderr
    assert says in errors[0]
    if variable is not None:
        assert f'"variable": "{variable}"' in errors[0]
    assert_no_traceback(done.stderr)


# -- the mapping itself, for shapes a test server cannot easily produce -------------------
SETTINGS = Settings(app="a:app", redis_url="redis://db:6379/7")


def chained(outer: BaseException, cause: BaseException) -> BaseException:
    outer.__cause__ = cause
    return outer


@pytest.mark.parametrize(
    ("exc", "code", "variable"),
    [
        (RedisClusterException("Redis Cluster cannot be connected. Please provide at least "
                               "one reachable node: Cluster mode is not enabled on this node"),
         2, "REDIS_CLUSTER"),
        (RedisClusterException("Redis Cluster cannot be connected. Please provide at least "
                               "one reachable node: Error 111 connecting"), 1, None),
        (ResponseError("DB index is out of range"), 2, "REDIS_URL"),
        (ResponseError("SELECT is not allowed in cluster mode"), 2, "REDIS_URL"),
        (MovedError("1234 10.0.0.2:6379"), 2, "REDIS_CLUSTER"),
        (chained(RedisUnavailable("Redis is unreachable"),
                 AuthenticationError("invalid username-password pair")), 2, "REDIS_URL"),
        (NoPermissionError("this user has no permissions to run the 'xgroup' command"), 2,
         "REDIS_URL"),
        (chained(RedisRefused("refused (WRONGTYPE)", reply="WRONGTYPE"),
                 ResponseError("WRONGTYPE Operation against a key holding the wrong kind")),
         2, "REDIS_PREFIX"),
        (ForeignConsumerGroup("stream s has consumer group(s) ['x'] besides ours"), 2,
         "WORKER_GROUP"),
        (IncompatibleContract("changed", changes=["a"]), 2, "WORKER_APP"),
        (RegistrationError("no processor"), 2, "WORKER_APP"),
        (UnsafeRedisConfig("policy"), 2, "ALLOW_UNSAFE_EVICTION"),
        (ConfigurationError("STREAMQ_DATA_DIR: not writable"), 2, None),
        (RedisUnavailable("Redis is unreachable"), 1, None),
        (redis.TimeoutError("Timeout connecting to server"), 1, None),
        (ValueError("a bug"), 1, None),
    ],
)
def test_failures_map_to_exit_code_and_variable(
    exc: BaseException, code: int, variable: str | None
) -> None:
    failure = explain(exc, SETTINGS)
    assert (failure.code, failure.variable) == (code, variable)
    assert "\n" not in failure.message
    assert failure.unexpected == isinstance(exc, ValueError)
