"""dead_retry.lua through its wrapper: reply codes, the re-added fields, records left alone."""

from __future__ import annotations

from typing import Any

import redis.asyncio as aioredis

from streamq import ops
from streamq._redis import run_calls
from streamq.envelope import FIELD_NAMES, encode_fields, flat_fields
from streamq.keys import ShardKeys


def dead_record(job_id: str, *, attempt: int = 3, due: str = "123") -> list[Any]:
    values = encode_fields(
        job_id=job_id,
        name="work",
        timestamp_ms=42,
        payload_json='{"n":1}',
        attempt=attempt,
        retry_baggage={"errors": [{"attempt": 1, "type": "E", "message": "m", "at": 1}]},
        trace_context={"traceparent": "00-abc-def-01"},
    )
    values[0] = due
    return [*flat_fields(values), "reason", "error", "attempts", str(attempt), "failed_at", "9"]


async def test_dead_retry_re_adds_the_envelope_with_attempt_1_due_now_and_reports_each_id(
    prefix: str, aredis: aioredis.Redis
) -> None:
    sk = ShardKeys(prefix, "q", 0)
    flat = dead_record("job-1")
    good = (await aredis.execute_command("XADD", sk.dead, "*", *flat)).decode()
    not_a_job = (
        await aredis.execute_command(
            "XADD", sk.dead, "*", "reason", "lost_payload", "entry", "1-0", "error", "x"
        )
    ).decode()

    (reply,) = await run_calls(aredis, [ops.dead_retry(sk, [good, "1-1", not_a_job, good])])

    assert reply == [1, 0, -1, 0]
    ((_eid, fields),) = await aredis.xrange(sk.stream)
    got = {k.decode(): v.decode() for k, v in fields.items()}
    assert list(got) == list(FIELD_NAMES)
    expected = dict(zip(flat[0::2], flat[1::2], strict=False))
    for name in FIELD_NAMES:
        want = {"due": "", "attempt": "1"}.get(name, expected[name])
        assert got[name] == want, name
    assert [e[0].decode() for e in await aredis.xrange(sk.dead)] == [not_a_job]


async def test_dead_retry_keeps_a_record_missing_an_envelope_field(
    prefix: str, aredis: aioredis.Redis
) -> None:
    sk = ShardKeys(prefix, "q", 0)
    flat = dead_record("job-2")
    i = flat.index("trace")
    del flat[i : i + 2]
    eid = (await aredis.execute_command("XADD", sk.dead, "*", *flat)).decode()
    (reply,) = await run_calls(aredis, [ops.dead_retry(sk, [eid])])
    assert reply == [-1]
    assert await aredis.xlen(sk.dead) == 1
    assert await aredis.xlen(sk.stream) == 0
