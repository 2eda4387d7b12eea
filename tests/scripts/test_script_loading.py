"""Scripts are loaded once and called by SHA; after SCRIPT FLUSH a batch reloads and no call
runs twice. Every script states its KEYS, ARGV and reply, and builds no key itself."""

from __future__ import annotations

import re
from importlib import resources

import pytest

from streamq import ops
from streamq._redis import run_calls, run_calls_sync
from streamq.scripts import SCRIPT_NAMES, script
from tests.scripts.helpers import item, run1, shard


def _lua_files() -> dict[str, str]:
    pkg = resources.files("streamq.scripts")
    return {f.name: f.read_text(encoding="utf-8") for f in pkg.iterdir() if f.name.endswith(".lua")}


def _header(source: str) -> str:
    lines = []
    for line in source.splitlines():
        if not line.startswith("--"):
            break
        lines.append(line)
    return "\n".join(lines)


async def _stats(r) -> dict[str, int]:
    info = await r.info("commandstats")
    return {k: int(v["calls"]) for k, v in info.items() if k in ("cmdstat_eval", "cmdstat_evalsha")}


async def test_scripts_are_called_by_sha_not_by_source(aredis, prefix):
    sk = shard(prefix)
    await run1(aredis, ops.enqueue(sk, [item("warm")], dedup_window_ms=1))  # loaded by now
    before = await _stats(aredis)

    await run_calls(aredis, [ops.enqueue(sk, [item(f"j{i}")], dedup_window_ms=1) for i in range(5)])

    after = await _stats(aredis)
    # >= : a thread another test left running may share this server; none of it uses EVAL.
    assert after.get("cmdstat_evalsha", 0) - before.get("cmdstat_evalsha", 0) >= 5
    assert after.get("cmdstat_eval", 0) == before.get("cmdstat_eval", 0)
    sha = script("enqueue").sha
    assert await aredis.script_exists(sha) == [True]


async def test_after_script_flush_the_next_batch_reloads_and_runs_each_call_once(aredis, prefix):
    s0, s1 = shard(prefix, index=0), shard(prefix, index=1)
    await run1(aredis, ops.promote(s0))
    await aredis.script_flush()

    replies = await run_calls(
        aredis,
        [
            ops.enqueue(s0, [item("a")], dedup_window_ms=1),
            ops.promote(s1),
            ops.enqueue(s1, [item("b"), item("c")], dedup_window_ms=1),
        ],
    )

    assert replies[0] == [True]
    assert replies[1].moved == 0
    assert replies[2] == [True, True]
    assert await aredis.xlen(s0.stream) == 1
    assert await aredis.xlen(s1.stream) == 2
    assert await aredis.script_exists(script("enqueue").sha, script("promote").sha) == [True, True]


async def test_a_call_that_ran_is_not_repeated_when_another_call_of_the_batch_got_noscript(
    aredis, prefix
):
    sk = shard(prefix)
    await aredis.script_flush()
    await aredis.script_load(script("enqueue").source)  # enqueue loaded, promote not

    replies = await run_calls(
        aredis, [ops.enqueue(sk, [item("once")], dedup_window_ms=1), ops.promote(sk)]
    )

    assert replies[0] == [True]
    assert await aredis.xlen(sk.stream) == 1  # the enqueue ran exactly once
    assert await aredis.script_exists(script("promote").sha) == [True]


def test_sync_runner_reloads_after_script_flush_and_runs_each_call_once(sredis, prefix):
    sk = shard(prefix)
    sredis.script_flush()

    replies = run_calls_sync(sredis, [ops.enqueue(sk, [item("s")], dedup_window_ms=1)])

    assert replies == [[True]]
    assert sredis.xlen(sk.stream) == 1


def test_every_script_in_the_package_is_known_to_the_loader():
    names = {n.removesuffix(".lua") for n in _lua_files()}
    assert names == {*SCRIPT_NAMES, "_prelude"}


@pytest.mark.parametrize("name", SCRIPT_NAMES)
def test_every_script_opens_with_a_header_naming_keys_argv_and_reply(name):
    header = _header(_lua_files()[f"{name}.lua"])
    assert header.startswith(f"-- {name}:"), "the header starts with the script's name"
    assert "KEYS[1]" in header
    assert "ARGV[" in header
    assert "Returns:" in header


def test_prelude_opens_with_a_comment_saying_what_it_is():
    assert _header(_lua_files()["_prelude.lua"]).startswith("-- Shared helpers")


# Commands whose key is not their first argument, and commands that take no key.
_KEY_AT = {"XGROUP": 1, "XINFO": 1}
_NO_KEY = {"TIME"}
_CALL = re.compile(r"(?:redis\.call\(|pcall\(redis\.call,)\s*'(\w+)'\s*,?([^)]*)\)")


def _key_vars(source: str) -> set[str]:
    """Names bound to KEYS[...] (``local a, b = KEYS[1], ARGV[1]``); prelude helpers receive
    the stream as their ``stream`` parameter and a final record's key as ``final``."""
    names = {"stream", "final"}
    for lhs, rhs in re.findall(r"local\s+([\w, ]+?)\s*=\s*([^\n]+)", source):
        for name, value in zip(lhs.split(","), rhs.split(","), strict=False):
            if value.strip().startswith("KEYS["):
                names.add(name.strip())
    return names


@pytest.mark.parametrize("name", [*SCRIPT_NAMES, "_prelude"])
def test_no_script_builds_a_key_every_key_comes_from_keys(name):
    source = _lua_files()[f"{name}.lua"]
    code = "\n".join(line.split("--", 1)[0] for line in source.splitlines())
    keys = _key_vars(code)

    assert not re.search(r"KEYS\[[^\]]*\]\s*\.\.|\.\.\s*KEYS\[", code), "KEYS concatenated"
    for var in keys:
        assert not re.search(rf"\b{var}\s*\.\.|\.\.\s*{var}\b", code), f"{var} concatenated"
    assert not re.search(r"\.\.\s*':'|':'\s*\.\.", code), "a ':'-joined name is built"

    calls = _CALL.findall(code)
    # acl_check only asks redis.acl_check_cmd about commands; it runs none.
    assert calls or name in ("_prelude", "acl_check")
    for cmd, args in calls:
        if cmd.upper() in _NO_KEY:
            continue
        key = [a.strip() for a in args.split(",")][_KEY_AT.get(cmd.upper(), 0)]
        assert key in keys or key.startswith("KEYS["), f"{cmd} on {key!r}, not a KEYS value"
