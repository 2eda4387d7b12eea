"""The dashboard's routes against a real Redis, in-process (httpx over ASGI): figures match
Redis, secrets never show, and every state change needs the token."""

from __future__ import annotations

import re
import subprocess
import sys
import textwrap

import pytest
import redis.asyncio as aioredis

from streamq import ConfigurationError, DeadLetters, Queue, QueueAdmin, create_dashboard_app
from streamq.dashboard.data import Source, find_job, read_runners
from streamq.keys import QueueKeys, RunnerKeys
from tests.admin.contracts import CONTRACTS, Adm, Credential, Solo, Task, running_worker
from tests.admin.test_admin import build_state
from tests.admin.test_deadletters import GROUP, make_dead_with_worker, shard_keys
from tests.dashboard.support import ROOT_DIR, TOKEN, cells, dashboard


async def xlen_minus_pending(r: aioredis.Redis, stream: str) -> tuple[int, int]:
    pending = (await r.xpending(stream, GROUP))["pending"]
    return await r.xlen(stream) - pending, pending


# -- what is shown ---------------------------------------------------------------------------


async def test_overview_figures_equal_what_redis_holds(prefix: str, aredis: aioredis.Redis) -> None:
    await build_state(aredis, prefix)  # adm: 3 ready 2 in flight 2 delayed 1 dead; adm-1: 1/0/1/0
    s0, s1 = shard_keys(prefix, index=0), shard_keys(prefix, index=1)
    ready0, pending0 = await xlen_minus_pending(aredis, s0.stream)
    ready1 = await aredis.xlen(s1.stream)
    async with dashboard(CONTRACTS, aredis, prefix) as http:
        page = await http.get("/")
        api = (await http.get("/api/queues")).json()
    assert page.status_code == 200
    row = cells(page.text, "data-queue", "adm")
    assert row["ready"] == str(ready0 + ready1) == "4"
    assert row["in_flight"] == str(pending0) == "2"
    assert row["delayed"] == str(await aredis.zcard(s0.delayed) + await aredis.zcard(s1.delayed))
    assert row["dead"] == str(await aredis.xlen(s0.dead)) == "1"
    adm = next(q for q in api if q["queue"] == "adm")
    assert [(s["shard"], s["ready"], s["in_flight"], s["delayed"], s["dead"])
            for s in adm["shards"]] == [("adm", 3, 2, 2, 1), ("adm-1", 1, 0, 1, 0)]
    # Three entries of adm were never delivered: the oldest one's age is on the Redis clock.
    assert adm["shards"][0]["oldest_ready_age_s"] >= 0
    assert {q["queue"] for q in api} == {"adm", "solo"}


async def test_queue_page_shows_shards_consumers_and_paused_state(
    redis_url: str, prefix: str, aredis: aioredis.Redis
) -> None:
    await build_state(aredis, prefix)
    await QueueAdmin(aredis, Adm, prefix=prefix).pause()
    async with dashboard(CONTRACTS, aredis, prefix, token=TOKEN) as http:
        html = (await http.get("/queues/adm")).text
        fragment = (await http.get("/queues/adm/fragment")).text
    assert cells(html, "data-shard", "adm") == {
        "ready": "3", "in_flight": "2", "delayed": "2", "dead": "1"}
    assert cells(html, "data-shard", "total")["ready"] == "4"
    assert cells(html, "data-consumer", "fake-worker")["pending"] == "2"
    assert 'id="paused-badge"' in html
    assert 'id="resume-button"' in html  # paused: the action offered is resume
    assert "fake-worker" in fragment
    assert "<html" not in fragment


async def test_dead_letter_pages_never_show_secret_fields(
    redis_url: str, prefix: str, aredis: aioredis.Redis
) -> None:
    q = Queue(Adm, aredis, prefix=prefix)
    await q.add(Adm.task, Task(n=7, kind="permanent", token="tok-SECRET-123",
                               creds=[Credential(token="nested-SECRET-9", label="visible")]),
                job_id="charge-7")
    async with running_worker(redis_url, prefix) as h:
        await h.manager.run_until_idle(10)
    (letter,) = await DeadLetters(aredis, Adm, prefix=prefix).list()
    async with dashboard(CONTRACTS, aredis, prefix, token=TOKEN) as http:
        listing = await http.get("/queues/adm/dead")
        one = await http.get(f"/queues/adm/dead/{letter.shard}/{letter.id}")
        lookup = await http.get("/jobs", params={"id": "charge-7"})
    for page in (listing, one, lookup):
        assert page.status_code == 200
        assert "SECRET" not in page.text
    assert "charge-7" in listing.text
    assert "&#34;token&#34;: &#34;***&#34;" in one.text  # the field is there, its value is not
    assert "visible" in one.text
    assert "project of job 7 is gone" in one.text
    assert 'id="retry-one"' in one.text


async def test_dead_letters_filter_by_reason_with_counts(
    redis_url: str, prefix: str, aredis: aioredis.Redis
) -> None:
    await make_dead_with_worker(redis_url, prefix, aredis,
                                [(1, "permanent", 0), (2, "error", 1), (3, "error", 0)])
    async with dashboard(CONTRACTS, aredis, prefix) as http:
        everything = (await http.get("/queues/adm/dead")).text
        errors = (await http.get("/queues/adm/dead", params={"reason": "error"})).text
        bad = await http.get("/queues/adm/dead", params={"reason": "bogus"})
        bad_limit = await http.get("/queues/adm/dead", params={"limit": "0"})
    assert len(re.findall(r'<tr data-ref="', everything)) == 3
    assert len(re.findall(r'<tr data-ref="', errors)) == 2
    assert "job-1" not in errors
    assert ">error (2)<" in everything
    assert ">permanent (1)<" in everything
    assert bad.status_code == 400
    assert "reason" in bad.text
    assert "&#39;adm&#39;" in bad.text
    assert bad_limit.status_code == 400
    assert "field &#39;limit&#39;" in bad_limit.text


async def test_job_lookup_finds_dead_jobs_and_says_not_found_clearly(
    redis_url: str, prefix: str, aredis: aioredis.Redis
) -> None:
    await make_dead_with_worker(redis_url, prefix, aredis, [(1, "permanent", 1), (2, "ok", 0)])
    src = Source.of(CONTRACTS, aredis, prefix=prefix)
    found = await find_job(src, "job-1")
    assert found.state == "dead"
    assert [d.shard for d in found.dead_letters] == ["adm-1"]
    assert (await find_job(src, "job-2")).state == "not_found"
    with pytest.raises(ConfigurationError, match="field 'id'"):
        await find_job(src, "has space")
    async with dashboard(CONTRACTS, aredis, prefix) as http:
        missing = await http.get("/jobs", params={"id": "job-2"})
        bad = await http.get("/jobs", params={"id": " "})
    assert "Not found: no job" in missing.text
    assert "job-2" in missing.text
    assert bad.status_code == 400


async def test_unknown_queue_and_malformed_dead_letter_refs_are_named(
    prefix: str, aredis: aioredis.Redis
) -> None:
    async with dashboard(CONTRACTS, aredis, prefix) as http:
        queue = await http.get("/queues/nope")
        api = await http.get("/queues/nope", headers={"accept": "application/json"})
        shard = await http.get("/queues/adm/dead/adm-9/1-0")
        gone = await http.get("/queues/adm/dead/adm/1-0")
    assert queue.status_code == 404
    assert "unknown queue &#39;nope&#39;" in queue.text
    assert api.json() == {"error": "unknown queue 'nope'; queues: adm, solo"}
    assert shard.status_code == 400
    assert "adm-9/1-0" in shard.text
    assert gone.status_code == 404
    assert "no dead letter" in gone.text


async def test_runners_show_their_lease_holder(prefix: str, aredis: aioredis.Redis) -> None:
    from streamq import App

    app = App([Adm])

    @app.runner("reconciler", singleton=True, every=60)
    async def reconcile(ctx: object) -> None:
        pass

    @app.runner("exporter")
    async def export(ctx: object) -> None:
        pass

    lease = RunnerKeys(prefix, "reconciler").lease
    await aredis.hset(lease, mapping={"holder": "host-1-abc:1234abcd", "token": "7"})
    await aredis.pexpire(lease, 15_000)
    views = await read_runners(Source.of(app, aredis, prefix=prefix))
    assert [(v.name, v.singleton, v.holder, v.token) for v in views] == [
        ("exporter", False, None, None), ("reconciler", True, "host-1-abc:1234abcd", 7)]
    assert views[1].lease_ttl_ms is not None
    assert 0 < views[1].lease_ttl_ms <= 15_000
    async with dashboard(app, aredis, prefix) as http:
        html = (await http.get("/schedules")).text
    assert cells(html, "data-runner", "reconciler")["holder"] == "host-1-abc:1234abcd"
    assert cells(html, "data-runner", "exporter")["holder"] == "-"


# -- who may change what ---------------------------------------------------------------------


async def test_without_a_token_actions_are_off_and_refused(
    prefix: str, aredis: aioredis.Redis
) -> None:
    async with dashboard(CONTRACTS, aredis, prefix) as http:
        page = (await http.get("/queues/adm")).text
        refused = await http.post("/queues/adm/pause", data={"token": "anything-at-all-1234"})
    assert "pause-form" not in page
    assert "actions off" in page
    assert refused.status_code == 403
    assert "actions are off" in refused.text
    assert not await QueueAdmin(aredis, Adm, prefix=prefix).is_paused()


async def test_actions_need_the_configured_token(prefix: str, aredis: aioredis.Redis) -> None:
    admin = QueueAdmin(aredis, Adm, prefix=prefix)
    async with dashboard(CONTRACTS, aredis, prefix, token=TOKEN) as http:
        missing = await http.post("/queues/adm/pause", data={})
        wrong = await http.post("/queues/adm/pause", data={"token": TOKEN[:-1] + "x"})
        http.cookies.set("token", TOKEN)  # a cookie alone must not do: sites can make it sent
        cookie_only = await http.post("/queues/adm/pause")
        http.cookies.clear()
        assert not await admin.is_paused()
        done = await http.post("/queues/adm/pause", data={"token": TOKEN})
        assert await admin.is_paused()
        by_header = await http.post("/queues/adm/resume", headers={"x-streamq-token": TOKEN,
                                                                  "accept": "application/json"})
    assert [r.status_code for r in (missing, wrong, cookie_only)] == [403, 403, 403]
    assert "field &#39;token&#39;" in missing.text
    assert "wrong dashboard token" in wrong.text
    assert done.status_code == 303
    assert done.headers["location"].endswith("/queues/adm?done=paused")
    assert by_header.json() == {"queue": "adm", "done": "resumed", "count": None}
    assert not await admin.is_paused()


async def test_a_request_from_another_site_is_refused_even_with_the_token(
    prefix: str, aredis: aioredis.Redis
) -> None:
    async with dashboard(CONTRACTS, aredis, prefix, token=TOKEN) as http:
        foreign = await http.post("/queues/adm/pause", data={"token": TOKEN},
                                  headers={"origin": "https://evil.example"})
        own = await http.post("/queues/adm/pause", data={"token": TOKEN},
                              headers={"origin": "http://dash.test"})
        get = await http.get("/queues/adm/pause")
    assert foreign.status_code == 403
    assert "another site" in foreign.text
    assert own.status_code == 303
    assert get.status_code == 405  # state changes are POST only


async def test_read_only_shows_no_action_and_refuses_posts_with_the_token(
    redis_url: str, prefix: str, aredis: aioredis.Redis
) -> None:
    await make_dead_with_worker(redis_url, prefix, aredis, [(1, "permanent", 0)])
    async with dashboard(CONTRACTS, aredis, prefix, token=TOKEN, read_only=True) as http:
        pages = [(await http.get(p)).text for p in ("/queues/adm", "/queues/adm/dead")]
        pause = await http.post("/queues/adm/pause", data={"token": TOKEN})
        retry = await http.post("/queues/adm/dead/retry",
                                data={"token": TOKEN, "all": "1", "confirm": "yes"})
    for html in pages:
        assert "<form method=\"post\"" not in html
        assert "Retry…" not in html
        assert "read-only" in html
    assert pause.status_code == retry.status_code == 403
    assert "read-only" in pause.text
    assert not await QueueAdmin(aredis, Adm, prefix=prefix).is_paused()
    assert await DeadLetters(aredis, Adm, prefix=prefix).count() == 1


async def test_retry_and_purge_go_through_a_confirmation_step(
    redis_url: str, prefix: str, aredis: aioredis.Redis
) -> None:
    await make_dead_with_worker(redis_url, prefix, aredis,
                                [(1, "permanent", 0), (2, "permanent", 1), (3, "error", 0)])
    dead = DeadLetters(aredis, Adm, prefix=prefix)
    by_job = {d.job_id: d for d in await dead.list()}
    async with dashboard(CONTRACTS, aredis, prefix, token=TOKEN) as http:
        confirm = await http.get("/queues/adm/dead/confirm",
                                 params={"action": "retry", "ref": by_job["job-1"].ref})
        unconfirmed = await http.post("/queues/adm/dead/retry",
                                      data={"token": TOKEN, "ref": by_job["job-1"].ref})
        assert await dead.count() == 3
        retried = await http.post("/queues/adm/dead/retry", data={
            "token": TOKEN, "ref": by_job["job-1"].ref, "confirm": "yes"})
        purge_page = await http.get("/queues/adm/dead/confirm", params={"action": "purge",
                                                                        "all": "1"})
        purged = await http.post("/queues/adm/dead/purge",
                                 data={"token": TOKEN, "all": "1", "confirm": "yes"},
                                 follow_redirects=True)
    assert confirm.status_code == 200
    assert 'id="confirm-form"' in confirm.text
    assert by_job["job-1"].ref in confirm.text
    assert "job-1" in confirm.text
    assert unconfirmed.status_code == 400
    assert "confirm" in unconfirmed.text
    assert retried.status_code == 303
    assert "done=retried&n=1" in retried.headers["location"]
    assert "Purge 2 dead letter(s) of adm?" in purge_page.text
    assert "Deleted 2 dead letter(s) of adm." in purged.text
    assert await dead.count() == 0
    # The retried job is back on its shard, ready, with its id.
    s0 = shard_keys(prefix, index=0)
    entries = await aredis.xrange(s0.stream)
    assert [f[b"id"] for _, f in entries] == [b"job-1"]


async def test_pages_carry_headers_that_forbid_framing_inline_script_and_caching(
    prefix: str, aredis: aioredis.Redis
) -> None:
    async with dashboard(CONTRACTS, aredis, prefix) as http:
        page = await http.get("/")
        js = await http.get("/static/dashboard.js")
    assert "script-src 'self'" in page.headers["content-security-policy"]
    assert page.headers["x-frame-options"] == "DENY"
    assert page.headers["cache-control"] == "no-store"
    assert js.status_code == 200
    assert "data-refresh" in js.text
    assert "<script>" not in page.text  # no inline script: the CSP would block it


def test_a_short_token_or_no_contract_is_a_configuration_error(aredis: aioredis.Redis) -> None:
    with pytest.raises(ConfigurationError, match="at least 16 characters"):
        create_dashboard_app(CONTRACTS, aredis, token="short")
    with pytest.raises(ConfigurationError, match="ContractSet, an App"):
        create_dashboard_app([42], aredis)  # type: ignore[list-item]


def test_importing_streamq_imports_no_web_framework() -> None:
    code = textwrap.dedent("""
        import sys, streamq, streamq.dashboard
        print(sorted(m for m in ("starlette", "jinja2", "uvicorn") if m in sys.modules))
    """)
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         cwd=ROOT_DIR, check=True).stdout
    assert out.strip() == "[]"


async def test_rates_are_sampled_from_redis_counters(prefix: str, aredis: aioredis.Redis) -> None:
    from streamq.dashboard.rates import RateSampler

    now = [0.0]
    sampler = RateSampler(aredis, [Solo.primary], prefix=prefix, interval_s=1, window_s=300,
                          clock=lambda: now[0])
    await sampler.sample_once()
    assert sampler.rates("solo") is None  # one sample: no rate yet
    q = Queue(Solo, aredis, prefix=prefix)
    for n in range(6):
        await q.add(Solo.task, Task(n=n))
    stream = QueueKeys(prefix, "solo", 1).shards[0].stream
    (first, *_), = [await aredis.xrange(stream, count=2)]
    await aredis.xdel(stream, first[0])  # one entry settled (acked and deleted)
    now[0] = 30.0
    await sampler.sample_once()
    rates = sampler.rates("solo")
    assert rates is not None
    assert (rates.in_per_min, rates.out_per_min, rates.dead_per_min) == (12.0, 2.0, 0.0)
    assert rates.window_s == 30.0



async def test_mounted_under_a_path_its_links_and_actions_keep_that_path(
    prefix: str, aredis: aioredis.Redis
) -> None:
    import httpx
    from starlette.applications import Starlette
    from starlette.routing import Mount

    dash = create_dashboard_app(CONTRACTS, aredis, prefix=prefix, token=TOKEN)
    outer = Starlette(routes=[Mount("/ops/queues", dash)])
    try:
        async with httpx.AsyncClient(transport=httpx.ASGITransport(app=outer),
                                     base_url="http://host.test") as http:
            page = await http.get("/ops/queues/")
            done = await http.post("/ops/queues/queues/solo/pause", data={"token": TOKEN})
    finally:
        await dash.state.dashboard.sampler.close()
    assert 'href="http://host.test/ops/queues/queues/adm"' in page.text
    assert 'src="http://host.test/ops/queues/static/dashboard.js"' in page.text
    assert done.headers["location"] == "http://host.test/ops/queues/queues/solo?done=paused"
    assert await QueueAdmin(aredis, Solo, prefix=prefix).is_paused()


async def test_pages_answer_503_naming_redis_when_it_is_unreachable() -> None:
    from redis.asyncio.retry import Retry
    from redis.backoff import NoBackoff

    from streamq.testing import free_port

    # No retries: redis-py's default backoff would only make this test slow.
    down = aioredis.Redis(port=free_port(), socket_connect_timeout=1, retry=Retry(NoBackoff(), 0))
    try:
        async with dashboard(CONTRACTS, down, "t0") as http:
            page = await http.get("/")
            api = await http.get("/api/queues")
            dead = await http.get("/queues/adm/dead")
    finally:
        await down.aclose()
    assert [page.status_code, api.status_code, dead.status_code] == [503, 503, 503]
    assert "Redis is unreachable" in api.json()["error"]


async def test_past_the_counting_limit_reasons_are_offered_without_counts(
    redis_url: str, prefix: str, aredis: aioredis.Redis, monkeypatch: pytest.MonkeyPatch
) -> None:
    from streamq.dashboard import web

    await make_dead_with_worker(redis_url, prefix, aredis,
                                [(1, "permanent", 0), (2, "error", 1), (3, "error", 0)])
    monkeypatch.setattr(web, "MAX_COUNTED", 2)
    async with dashboard(CONTRACTS, aredis, prefix) as http:
        html = (await http.get("/queues/adm/dead")).text
    assert ">all (3)<" in html
    assert '<option value="error">error</option>' in html
    assert "(2)" not in html
    assert len(re.findall(r'<tr data-ref="', html)) == 3


async def test_job_lookup_shows_a_tracked_jobs_status(
    redis_url: str, prefix: str, aredis: aioredis.Redis
) -> None:
    await Queue(Solo, aredis, prefix=prefix).add(Solo.task, Task(n=1), job_id="later-1",
                                                 track=True, delay=600)
    q = Queue(Adm, aredis, prefix=prefix)
    await q.add(Adm.task, Task(n=2), job_id="done-2", track=True, keep_result=600)
    async with running_worker(redis_url, prefix) as h:
        await h.manager.run_until_idle(10)
    src = Source.of(CONTRACTS, aredis, prefix=prefix)
    later, done = await find_job(src, "later-1"), await find_job(src, "done-2")
    assert (later.state, later.status and later.status.queue) == ("delayed", "solo")
    assert done.state == "completed"
    assert done.dead_letters == ()
    async with dashboard(CONTRACTS, aredis, prefix) as http:
        html = (await http.get("/jobs", params={"id": "later-1"})).text
    assert "is <strong>delayed</strong>" in html
    assert re.search(r"<dt>due</dt><dd>\d{4}-\d\d-\d\d ", html)
