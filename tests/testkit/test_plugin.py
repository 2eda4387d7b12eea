"""The pytest plugin as an application's suite meets it: found through its entry point,
starting nothing it is not asked for."""

from __future__ import annotations

import pytest

USER_TESTS = '''
from pydantic import BaseModel
from streamq import App, Job, QueueContract, job


class Signup(BaseModel):
    email: str


class Mail(QueueContract, name="mail"):
    welcome = job("welcome", Signup)


app = App([Mail])
sent = []


@app.processor(Mail)
def send_welcome(job: Job[Signup]) -> None:
    sent.append(job.payload.email)


def test_welcome_mails_are_sent(streamq_redis, streamq_queue, streamq_worker):
    assert streamq_redis.kind == "{kind}"
    streamq_queue(Mail).add(Mail.welcome, Signup(email="a@example.org"))
    report = streamq_worker.run_sync(app)
    assert report.completed == 1
    assert sent == ["a@example.org"]


def test_the_processor_alone(streamq_job):
    send_welcome(streamq_job(Mail.welcome, {{"email": "b@example.org"}}))
    assert sent[-1] == "b@example.org"
'''


@pytest.mark.parametrize("kind", ["fake", "real"])
def test_a_users_suite_gets_the_fixtures_from_the_entry_point(
    pytester: pytest.Pytester, kind: str
) -> None:
    from streamq.testing import find_binary

    if kind == "real" and find_binary() is None:
        pytest.skip("no redis-server")
    pytester.makepyfile(test_mail=USER_TESTS.format(kind=kind))
    result = pytester.runpytest_subprocess(f"--streamq-redis={kind}", "-p", "no:cacheprovider",
                                           "--setup-show")
    result.assert_outcomes(passed=2)
    result.stdout.fnmatch_lines(["*SETUP    S streamq_redis_server*"])


def test_a_test_needing_what_the_fake_lacks_fails_saying_so(pytester: pytest.Pytester) -> None:
    pytester.makepyfile(test_oom='''
import pytest

@pytest.mark.streamq_needs("memory_limits")
def test_enqueue_fails_loudly_when_redis_is_full(streamq_redis):
    raise AssertionError("must not run on the fake")
''')
    result = pytester.runpytest_subprocess("--streamq-redis=fake", "-p", "no:cacheprovider")
    result.assert_outcomes(errors=1)
    result.stdout.fnmatch_lines(
        ["*this test needs a real redis-server; fakeredis cannot do: memory_limits (maxmemory*"]
    )
    result.stdout.no_fnmatch_line("*must not run on the fake*")


def test_the_plugin_starts_nothing_unless_its_fixtures_are_used(
    pytester: pytest.Pytester,
) -> None:
    pytester.makepyfile(test_plain="def test_plain():\n    assert True\n")
    result = pytester.runpytest_subprocess("-p", "no:cacheprovider", "--setup-show")
    result.assert_outcomes(passed=1)
    result.stdout.fnmatch_lines(["plugins:*streamq-*"])  # loaded, through its entry point
    result.stdout.no_fnmatch_line("*SETUP*streamq*")
