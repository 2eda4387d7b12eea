"""The web dashboard runs with the operator role's ACL user: every page, the rate sampler and
the actions use only the commands that role grants."""

from __future__ import annotations

import uuid

import httpx
import redis.asyncio as aioredis

from streamq import App, DeadLetters, Queue, QueueAdmin, create_dashboard_app
from streamq.keys import RunnerKeys
from tests.admin.contracts import Adm, Solo, Task
from tests.admin.test_deadletters import raw_dead, shard_keys
from tests.dashboard.support import TOKEN
from tests.security.conftest import MakeUser


async def test_every_page_and_action_of_the_dashboard_works_as_the_operator(
    make_user: MakeUser, admin: aioredis.Redis
) -> None:
    prefix = f"t{uuid.uuid4().hex[:8]}"
    app = App([Adm, Solo])

    @app.runner("reconciler", singleton=True, every=60)
    async def reconcile(ctx: object) -> None:
        pass

    dead_id = await raw_dead(admin, shard_keys(prefix), "dead-1")  # as a worker would
    await Queue(Solo, admin, prefix=prefix).add(Solo.task, Task(n=1))
    await admin.hset(RunnerKeys(prefix, "reconciler").lease,
                     mapping={"holder": "w-1:abcd", "token": "3"})
    operator = aioredis.Redis.from_url(make_user("operator", prefix))
    try:
        web = create_dashboard_app(app, operator, prefix=prefix, token=TOKEN)
        sampler = web.state.dashboard.sampler
        await sampler.sample_once()  # XINFO STREAM: the rates
        assert sampler.samples["adm"]
        async with httpx.AsyncClient(transport=httpx.ASGITransport(app=web),
                                     base_url="http://dash.test") as http:
            for path in ("/", "/api/queues", "/queues/adm", "/queues/adm/dead",
                         f"/queues/adm/dead/adm/{dead_id}", "/jobs?id=dead-1", "/schedules",
                         "/queues/adm/dead/confirm?action=retry&ref=adm/" + dead_id):
                page = await http.get(path)
                assert page.status_code == 200, (path, page.text[-400:])
            assert "w-1:abcd" in (await http.get("/schedules")).text
            paused = await http.post("/queues/solo/pause", data={"token": TOKEN})
            retried = await http.post("/queues/adm/dead/retry", data={
                "token": TOKEN, "ref": f"adm/{dead_id}", "confirm": "yes"})
            assert (paused.status_code, retried.status_code) == (303, 303)
    finally:
        await sampler.close()
        await operator.aclose()
    assert await QueueAdmin(admin, Solo, prefix=prefix).is_paused()
    assert await DeadLetters(admin, Adm, prefix=prefix).count() == 0
