"""The testing guide's examples (docs/testing.md), runnable as they are:

    pytest examples/testing                          # real redis-server when found, else fake
    pytest examples/testing --streamq-redis=fake     # fakeredis, no server needed
"""

from __future__ import annotations

import pytest
from signups import Mailer, Signup, Welcome, app, send_welcome

from streamq import PermanentError, SyncDeadLetters
from streamq.testing import make_job


@pytest.fixture(autouse=True)
def mailer() -> Mailer:
    app.state = Mailer()
    return app.state


# -- 1. unit: the processor alone, no Redis -------------------------------------------------


def test_a_welcome_mail_is_sent(mailer: Mailer) -> None:
    send_welcome(make_job(Welcome.send, Signup(user_id="u1", email="a@example.org")))
    assert mailer.sent == ["a@example.org"]


def test_an_address_without_at_is_a_permanent_error() -> None:
    job = make_job(Welcome.send, {"user_id": "u2", "email": "nobody"}, attempt=3)
    assert job.is_final_attempt
    with pytest.raises(PermanentError, match="u2 has no valid address"):
        send_welcome(job)


# -- 2 and 3. through Redis: the same tests on fakeredis or a real redis-server -------------


def test_mails_are_sent_and_retried_while_the_service_is_down(
    streamq_queue, streamq_worker, mailer: Mailer
) -> None:
    mailer.down_for = 2
    queue = streamq_queue(Welcome)
    job_id = queue.add(Welcome.send, Signup(user_id="u3", email="c@example.org"))
    report = streamq_worker.run_sync(app)
    assert [o.outcome for o in report.of(job_id)] == ["retried", "retried", "completed"]
    assert mailer.sent == ["c@example.org"]


def test_a_bad_address_is_dead_lettered_at_once(
    streamq_queue, streamq_worker, streamq_redis
) -> None:
    streamq_queue(Welcome).add(Welcome.send, Signup(user_id="u4", email="nobody"))
    report = streamq_worker.run_sync(app)
    assert report.dead_reasons == {"permanent": 1}
    dead = SyncDeadLetters(streamq_redis.sync_client(), Welcome, prefix=streamq_redis.prefix)
    assert [d.job_name for d in dead.list()] == ["send"]


@pytest.mark.streamq_needs("memory_limits")
def test_a_full_redis_refuses_new_mails_loudly(streamq_queue, streamq_redis) -> None:
    from streamq import RedisOutOfMemory

    client = streamq_redis.sync_client()
    client.config_set("maxmemory", "1")  # below what the server already uses
    try:
        with pytest.raises(RedisOutOfMemory):
            streamq_queue(Welcome).add(Welcome.send, Signup(user_id="u5", email="e@x.org"))
    finally:
        client.config_set("maxmemory", "0")
