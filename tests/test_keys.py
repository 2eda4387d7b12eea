"""The key layout: one hash tag (one cluster slot) per shard, stable shard naming and hashing."""

from __future__ import annotations

import re

import pytest
from redis.crc import key_slot

from streamq.keys import QueueKeys, ShardKeys, shard_index, shard_name


def _slot(key: str) -> int:
    return key_slot(key.encode("utf-8"))


def _tag(key: str) -> str:
    m = re.search(r"\{([^}]+)\}", key)
    assert m, f"{key} has no hash tag"
    return m.group(1)


def _shard_keys(sk: ShardKeys, job_ids=("j1", "x" * 200, "a:b", "{weird}", "ü")) -> list[str]:
    return [*sk.all_static(), *(sk.dedup(j) for j in job_ids), sk.settled("tok"), sk.result("j")]


@pytest.mark.parametrize("prefix", ["streamq", "app:prod", "t"])
@pytest.mark.parametrize("queue", ["ingest", "heavy-exports", "q1"])
@pytest.mark.parametrize("index", [0, 1, 7, 31])
def test_every_key_of_one_shard_shares_one_hash_tag_and_one_slot(prefix, queue, index):
    sk = ShardKeys(prefix, queue, index)
    keys = _shard_keys(sk)

    assert {_tag(k) for k in keys} == {f"{queue}:{index}"}
    assert len({_slot(k) for k in keys}) == 1
    assert sk.tag == f"{{{queue}:{index}}}"


def test_shard_keys_cover_the_documented_layout():
    sk = ShardKeys("p", "ingest", 2)
    assert sk.stream == "p:{ingest:2}:stream"
    assert sk.delayed == "p:{ingest:2}:delayed"
    assert sk.jobs == "p:{ingest:2}:jobs"
    assert sk.dead == "p:{ingest:2}:dead"
    assert sk.dedup("abc") == "p:{ingest:2}:dedup:abc"
    assert sk.starts == "p:{ingest:2}:starts"
    assert sk.settled("t1") == "p:{ingest:2}:settled:t1"
    assert len(set(sk.all_static())) == 6


def test_queue_wide_keys_share_the_queue_tag():
    qk = QueueKeys("p", "ingest", 4)
    keys = [qk.meta, qk.limiter, qk.workers]

    assert {_tag(k) for k in keys} == {"ingest"}
    assert len({_slot(k) for k in keys}) == 1
    assert qk.meta == "p:{ingest}:meta"
    assert qk.limiter == "p:{ingest}:limiter"
    assert qk.workers == "p:{ingest}:workers"


def test_shards_of_one_queue_have_their_own_tags_and_spread_over_slots():
    qk = QueueKeys("p", "ingest", 16)
    tags = [_tag(sk.stream) for sk in qk.shards]
    assert tags == [f"ingest:{i}" for i in range(16)]
    assert len({_slot(sk.stream) for sk in qk.shards}) > 8
    assert [sk.index for sk in qk.shards] == list(range(16))


def test_keys_of_two_queues_never_collide():
    a, b = QueueKeys("p", "a", 2), QueueKeys("p", "a-1", 2)
    all_a = {k for sk in a.shards for k in sk.all_static()} | {a.meta, a.limiter}
    all_b = {k for sk in b.shards for k in sk.all_static()} | {b.meta, b.limiter}
    assert not all_a & all_b


def test_shard_names_are_the_queue_then_queue_dash_index():
    assert shard_name("ingest", 0) == "ingest"
    assert shard_name("ingest", 1) == "ingest-1"
    assert shard_name("ingest", 12) == "ingest-12"
    assert [sk.name for sk in QueueKeys("p", "ingest", 3).shards] == [
        "ingest",
        "ingest-1",
        "ingest-2",
    ]


# int(sha256(key).hexdigest()[:8], 16), pinned: these must never change (other processes,
# versions and languages pick the same shard for the same key).
GOLDEN = [
    # key, hash prefix as int, % 4, % 8, % 16
    ("project-1", 2738763219, 3, 3, 3),
    ("project-2", 757001348, 0, 4, 4),
    ("tenant:acme", 3472105197, 1, 5, 13),
    ("a", 3398926610, 2, 2, 2),
    ("b", 1042540566, 2, 6, 6),
    ("", 3820012610, 2, 2, 2),
    ("42", 1934056628, 0, 4, 4),
    ("user@example.com", 3033113225, 1, 1, 9),
    ("évènement", 1045233867, 3, 3, 11),
    ("0123456789abcdef", 2678018321, 1, 1, 1),
]


@pytest.mark.parametrize(("key", "h", "m4", "m8", "m16"), GOLDEN)
def test_shard_index_golden_values(key, h, m4, m8, m16):
    assert shard_index(key, 1) == 0
    assert shard_index(key, 4) == m4
    assert shard_index(key, 8) == m8
    assert shard_index(key, 16) == m16
    assert shard_index(key, 2**32) == h


def test_for_key_picks_the_shard_of_shard_index():
    qk = QueueKeys("p", "ingest", 8)
    for key, _h, _m4, m8, _m16 in GOLDEN:
        sk = qk.for_key(key)
        assert sk.index == m8
        assert sk.name == shard_name("ingest", m8)


@pytest.mark.parametrize("bad", ["", "app{x}", "{app}", "a}b"])
def test_prefix_with_braces_or_empty_is_refused_so_shards_keep_their_own_slots(bad: str) -> None:
    from streamq.errors import ConfigurationError
    from streamq.keys import QueueKeys

    with pytest.raises(ConfigurationError, match="prefix"):
        QueueKeys(bad, "q", 2)
