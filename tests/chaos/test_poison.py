"""Poison entries never crash or wedge a worker (DESIGN.md §6).

Entries that are not valid jobs (written by a buggy or foreign producer straight into the
stream) are dead-lettered at once with their reason, never retried, while the good jobs
around them in the same stream are all processed.
"""

from __future__ import annotations

import json
from typing import Any

from streamq import Queue
from tests.chaos.harness import Workers, completed_jobs
from tests.support.chaos_app import BUGGY_N, Chaos, Work


def _envelope(tag: str, **over: str | bytes) -> dict[str, str | bytes]:
    fields: dict[str, str | bytes] = {
        "due": "",
        "id": f"poison-{tag}",
        "name": "work",
        "ts": "1700000000000",
        "attempt": "1",
        "payload": json.dumps({"n": 1}),
        "baggage": "",
        "trace": "",
    }
    fields.update(over)
    fields["poison"] = tag
    return fields


POISON: dict[str, tuple[dict[str, str | bytes], str]] = {
    "bad_json": (_envelope("bad_json", payload="{not json"), "invalid_payload"),
    "wrong_type": (_envelope("wrong_type", payload='{"n": "abc"}'), "invalid_payload"),
    "missing_required": (_envelope("missing_required", payload="{}"), "invalid_payload"),
    "array_payload": (_envelope("array_payload", payload="[1, 2]"), "invalid_payload"),
    "payload_not_utf8": (_envelope("payload_not_utf8", payload=b"\xff\xfe"), "invalid_payload"),
    "validator_bug": (_envelope("validator_bug", payload=json.dumps({"n": BUGGY_N})),
                      "invalid_payload"),
    "unknown_job": (_envelope("unknown_job", name="no-such-job"), "unknown_job"),
    "name_not_utf8": (_envelope("name_not_utf8", name=b"\xff\xfe"), "invalid_payload"),
    "bad_attempt": (_envelope("bad_attempt", attempt="abc"), "invalid_payload"),
    "zero_attempt": (_envelope("zero_attempt", attempt="0"), "invalid_payload"),
    "bad_ts": (_envelope("bad_ts", ts="soon"), "invalid_payload"),
    "bad_due": (_envelope("bad_due", due="tomorrow"), "invalid_payload"),
    "bad_baggage": (_envelope("bad_baggage", baggage="not json"), "invalid_payload"),
    "trace_not_object": (_envelope("trace_not_object", trace="[1]"), "invalid_payload"),
    "deep_baggage": (_envelope("deep_baggage", baggage="[" * 100_000 + "]" * 100_000),
                     "invalid_payload"),
    "deep_payload": (_envelope("deep_payload", payload='{"n": 1, "x": ' + "[" * 100_000
                               + "]" * 100_000 + "}"), "invalid_payload"),
    "missing_fields": ({"id": "poison-missing", "name": "work", "poison": "missing_fields"},
                       "invalid_payload"),
    "foreign_entry": ({"hello": "world", "poison": "foreign_entry"}, "invalid_payload"),
}


async def test_poison_entries_are_dead_lettered_and_good_jobs_around_them_processed(
    workers: Workers, queue: Queue[Chaos], aredis: Any
) -> None:
    pinned = queue.for_key("one-stream")
    stream = workers.shard(queue.shard_for("one-stream")).stream
    await aredis.xgroup_create(stream, "streamq", id="0", mkstream=True)
    good: list[str] = []
    for i, (fields, _reason) in enumerate(POISON.values()):
        good.append(await pinned.add(Chaos.work, Work(n=i)))
        await aredis.xadd(stream, fields)
    good.append(await pinned.add(Chaos.work, Work(n=len(POISON))))

    a = await workers.start("a", concurrency=2)

    await workers.wait_for(
        lambda: set(completed_jobs(workers.log)) == set(good),
        timeout_s=10,
        what="every good job completed",
    )
    dead = await workers.wait_for(
        lambda: _tagged(workers.dead_letters(aredis), len(POISON)),
        timeout_s=10,
        what="every poison entry dead-lettered",
    )
    assert {tag: d["reason"] for tag, d in dead.items()} == {
        tag: reason for tag, (_f, reason) in POISON.items()
    }
    for d in dead.values():
        assert d["error"], f"a dead letter says why: {d}"
    await workers.wait_for(lambda: workers.drained(aredis), timeout_s=5, what="stream drained")
    assert len(workers.log.records("dead", consumer="a")) == len(POISON)
    assert len(workers.log.records("start")) == len(good), "no poison entry ever ran"

    # Still consuming: a job added now is taken at once.
    later = await queue.add(Chaos.work, Work(n=-1))
    await workers.wait_record("end", job=later, outcome="completed", timeout_s=5)
    assert a.alive


async def _tagged(letters: Any, expected: int) -> dict[str, dict[str, str]] | None:
    by_tag = {d["poison"]: d for d in await letters if "poison" in d}
    return by_tag if len(by_tag) == expected else None
