"""Least-privilege Redis ACLs for streamq's three roles, and a worker's start-up check.

Each role gets the commands it actually sends (Lua scripts run with their caller's
permissions, so every command inside a script counts) on the keys under its prefix only:

==========  ================================================================================
role        who
==========  ================================================================================
producer    :class:`~streamq.Queue` / :class:`~streamq.SyncQueue`: ``add``, delayed adds,
            ``add_bulk``, dedup, the contract fingerprint
worker      :class:`~streamq.WorkerManager` / ``python -m worker``: reading, settling, retries,
            dead letters, reclaim, promotion, renewal, heartbeats, health, schedules, runners
operator    the ``streamq`` CLI, :class:`~streamq.QueueAdmin`, :class:`~streamq.DeadLetters`,
            :class:`~streamq.Schedules`, the web dashboard: depth, consumers, pause/resume,
            dead letters
==========  ================================================================================

The rules are data (:data:`ROLE_COMMANDS`), so the documentation, the tests and the check a
worker runs at start come from one place.

Example::

    for line in (acl_setuser(role, prefix="myapp", user=f"myapp-{role}") for role in ROLES):
        print(line)   # ACL SETUSER myapp-worker reset on >PASSWORD ~myapp:* ...
"""

from __future__ import annotations

import logging
import re
from typing import Any, Literal, get_args

import redis
import redis.asyncio as aioredis
from redis.exceptions import ResponseError

from streamq._redis import Call, map_error, run_calls
from streamq.errors import (
    ConfigurationError,
    PermissionsMissing,
    RedisRefused,
    RedisUnavailable,
)
from streamq.keys import check_prefix
from streamq.scripts import script

__all__ = [
    "CLUSTER_COMMANDS",
    "COMMANDS",
    "ROLES",
    "ROLE_COMMANDS",
    "Role",
    "acl_key_pattern",
    "acl_rules",
    "acl_setuser",
    "check_permissions",
    "missing_permissions",
    "role_commands",
]

_log = logging.getLogger("streamq.security")

Role = Literal["producer", "worker", "operator"]
ROLES: tuple[Role, ...] = get_args(Role)

_K = "\0key"  # stands for the probe key in COMMANDS

COMMANDS: dict[str, tuple[str, ...]] = {
    # connection and server: no key
    "ping": (),
    "time": (),
    "wait": ("0", "1"),
    "multi": (),
    "exec": (),
    "discard": (),
    # scripts: every transition is a script run by SHA, loaded again after a restart
    "evalsha": ("0" * 40, "1", _K),
    "script|load": ("return 1",),
    # streams
    "xadd": (_K, "*", "f", "v"),
    "xreadgroup": ("GROUP", "g", "c", "STREAMS", _K, ">"),
    "xgroup|create": (_K, "g", "0", "MKSTREAM"),
    "xgroup|delconsumer": (_K, "g", "c"),
    "xinfo|groups": (_K,),
    "xinfo|consumers": (_K, "g"),
    "xinfo|stream": (_K,),
    "xpending": (_K, "g"),
    "xack": (_K, "g", "0-1"),
    "xdel": (_K, "0-1"),
    "xclaim": (_K, "g", "c", "0", "0-1"),
    "xautoclaim": (_K, "g", "c", "0", "0-0"),
    "xrange": (_K, "-", "+"),
    "xrevrange": (_K, "+", "-"),
    "xlen": (_K,),
    "xtrim": (_K, "MAXLEN", "0"),
    # sorted sets: delayed jobs, schedule ticks
    "zadd": (_K, "1", "m"),
    "zrange": (_K, "0", "-1"),
    "zrangebyscore": (_K, "-inf", "+inf"),
    "zrem": (_K, "m"),
    "zcard": (_K,),
    "zscore": (_K, "m"),
    "zmscore": (_K, "m"),
    "zremrangebyscore": (_K, "-inf", "0"),
    # hashes: meta, jobs, starts, workers, limiter, schedules, leases
    "hset": (_K, "f", "v"),
    "hget": (_K, "f"),
    "hmget": (_K, "f"),
    "hdel": (_K, "f"),
    "hgetall": (_K,),
    "hincrby": (_K, "f", "1"),
    # strings: dedup markers, settle memos, fencing tokens, runner data
    "get": (_K,),
    "set": (_K, "v"),
    "del": (_K,),
    "exists": (_K,),
    "type": (_K,),
    "incr": (_K,),
    "pexpire": (_K, "1000"),
    "pttl": (_K,),
    # lists: a tracked job's final record, which result() waits on
    "rpush": (_K, "v"),
    "lindex": (_K, "0"),
    "blmove": (_K, _K, "LEFT", "LEFT", "0"),
    # a Redis Cluster client: the slot map, and the command table it finds keys with
    "cluster|slots": (),
    "command": (),
}
"""Every command streamq sends, in ACL syntax, with the arguments a permission probe uses
(the key is a probe key under the prefix; no probe runs a command)."""

# Tracked jobs (streamq.jobstatus), from Queue and QueueAdmin: job_status.lua and cancel.lua
# look a job up by id (its record, its entry, its delayed member, its final record) and a
# cancel removes it; result() blocks on the final record (BLMOVE); workers write that record.
_JOB_CONTROL = frozenset({
    "hget", "hset", "hdel", "xpending", "xrange", "xdel", "zscore", "zrem", "del",
    "rpush", "lindex", "blmove", "pexpire",
})
_PRODUCER = _JOB_CONTROL | frozenset({
    "ping", "time", "evalsha", "script|load",
    "xadd",                      # a ready job without a dedup id: one plain XADD
    "set", "zadd", "hset",       # enqueue.lua: dedup marker, delayed job; the fingerprint
    "type",                      # enqueue.lua: refuses a key of another type before writing
    "zrange", "hmget",           # tenant_flags.lua: the flagged tenants it routes
    "wait",                      # a durable add: how many replicas have it
})
# tenant_flag.lua: flag or unflag a tenant (a processor's job.flag_tenant, an operator)
_TENANT_FLAG = frozenset({
    "zadd", "zrange", "zrangebyscore", "zrem", "zremrangebyscore", "zscore",
    "hset", "hget", "hdel", "del", "pexpire",
})
_WORKER = _PRODUCER | _TENANT_FLAG | frozenset({
    "multi", "exec", "discard",  # health reads a lane's depth as one snapshot
    "exists",                    # tenant_slot_*.lua: the per-tenant concurrency cap
    "xreadgroup", "xgroup|create", "xgroup|delconsumer", "xinfo|groups", "xinfo|consumers",
    "xpending", "xack", "xdel", "xclaim", "xautoclaim", "xrange", "xlen",
    "zrange", "zrangebyscore", "zrem", "zcard", "zmscore",
    "hget", "hmget", "hdel", "hgetall", "hincrby",
    "get", "del", "incr", "pexpire", "pttl",
})
_OPERATOR = _TENANT_FLAG | _JOB_CONTROL | frozenset({
    "ping", "time", "multi", "exec", "discard", "evalsha", "script|load",
    "xlen", "xpending", "xinfo|groups", "xinfo|consumers", "xrange", "xrevrange", "xdel",
    "xtrim", "xadd",
    "zcard", "zscore",
    "hset", "hget", "hmget", "hdel", "hgetall",
    "xinfo|stream", "pttl",  # the web dashboard: job rates, singleton runners' leases
})

CLUSTER_COMMANDS = frozenset({"cluster|slots", "command"})
"""What every role needs besides its own commands on a Redis Cluster: redis-py's cluster
client reads the slot map (``CLUSTER SLOTS``) and the command table (``COMMAND``)."""

ROLE_COMMANDS: dict[Role, frozenset[str]] = {
    "producer": _PRODUCER,
    "worker": _WORKER,
    "operator": _OPERATOR,
}
"""The commands each role needs, in ACL syntax (``"xgroup|create"`` is one subcommand)."""

_GLOB = re.compile(r"([*?\[\]\\])")


def acl_key_pattern(prefix: str) -> str:
    """``~<prefix>:*``: every key streamq builds for ``prefix`` (glob characters escaped)."""
    check_prefix(prefix)
    return "~" + _GLOB.sub(r"\\\1", prefix) + ":*"


def _role(role: str) -> Role:
    if role not in ROLES:
        raise ConfigurationError(f"unknown role {role!r}; roles: {', '.join(ROLES)}")
    return role


def role_commands(role: Role, *, cluster: bool = False) -> frozenset[str]:
    """The commands ``role`` needs, plus :data:`CLUSTER_COMMANDS` on a Redis Cluster."""
    commands = ROLE_COMMANDS[_role(role)]
    return commands | CLUSTER_COMMANDS if cluster else commands


def acl_rules(role: Role, *, prefix: str, cluster: bool = False) -> list[str]:
    """The ACL rules of ``role`` for the keys under ``prefix``, as ``ACL SETUSER`` words.

    They start from nothing (``resetkeys``, ``resetchannels``, ``-@all``) so they can be
    applied to an existing user; the password and ``on`` are the caller's. ``cluster=True``
    adds what a Redis Cluster client needs (:data:`CLUSTER_COMMANDS`).

    Example::

        await client.execute_command("ACL", "SETUSER", "myapp-worker", "on", ">s3cret",
                                     *acl_rules("worker", prefix="myapp"))

    Raises:
        ConfigurationError: unknown role, or a prefix streamq refuses.
    """
    commands = sorted(role_commands(role, cluster=cluster))
    return ["resetkeys", acl_key_pattern(prefix), "resetchannels", "-@all",
            *(f"+{c}" for c in commands)]


def acl_setuser(
    role: Role, *, prefix: str, user: str, password: str = "PASSWORD", cluster: bool = False
) -> str:
    """One ``ACL SETUSER`` line creating (or resetting) ``user`` with ``role``'s rules.

    ``password`` defaults to a placeholder to replace; the line is what ``docs/security.md``
    shows.
    """
    return " ".join(["ACL", "SETUSER", user, "reset", "on", f">{password}",
                     *acl_rules(role, prefix=prefix, cluster=cluster)])


def _probe_key(prefix: str) -> str:
    return f"{prefix}:{{streamq-permission-check}}:probe"


def _probes(role: Role, prefix: str, cluster: bool) -> list[tuple[str, list[str]]]:
    key = _probe_key(prefix)
    out: list[tuple[str, list[str]]] = []
    for name in sorted(role_commands(role, cluster=cluster)):
        args = [key if a == _K else a for a in COMMANDS[name]]
        out.append((name, [*name.split("|"), *args]))
    return out


def _is_cluster(client: Any) -> bool:
    return isinstance(client, aioredis.RedisCluster | redis.RedisCluster)


def _username(client: Any) -> str | None:
    """The ACL user a plain client logs in as (``default`` without one); None on a cluster."""
    pool = getattr(client, "connection_pool", None)
    if pool is None or _is_cluster(client):
        return None
    return str(pool.connection_kwargs.get("username") or "default")


def _refused_name(reply: str) -> str | None:
    """What a NOPERM reply names, in ACL syntax: ``+evalsha``, ``~<key>``, or ``~`` for
    "one of the keys" (a script's KEYS)."""
    m = re.search(r"to run the '([^']+)' command", reply)
    if m:
        return f"+{m[1]}"
    m = re.search(r"to access the '([^']+)' key", reply)
    if m:
        return f"~{m[1]}"
    return "~" if "to access one of the keys" in reply else None


def _denial(name: str, reply: str, prefix: str) -> str:
    """A refused probe as what to grant: the command, or the prefix's key pattern."""
    return acl_key_pattern(prefix) if "key" in reply and "command" not in reply else f"+{name}"


async def _dryrun(client: Any, user: str, role: Role, prefix: str) -> list[str] | None:
    """Missing permissions by ``ACL DRYRUN``; None when this user may not run it."""
    probes = _probes(role, prefix, cluster=False)
    try:
        # One first: a least-privilege user is refused ACL DRYRUN, and each refusal costs a
        # command and an ACL LOG update.
        first = await client.execute_command("ACL", "DRYRUN", user, *probes[0][1])
    except Exception as exc:
        down = map_error(exc)
        if isinstance(down, RedisUnavailable):
            raise down from exc
        return None  # no ACL DRYRUN for this user (NOPERM), or none on this server
    pipe = client.pipeline(transaction=False)
    for _, words in probes[1:]:
        pipe.execute_command("ACL", "DRYRUN", user, *words)
    try:
        replies = [first, *await pipe.execute(raise_on_error=False)]
    except Exception as exc:
        mapped = map_error(exc)
        if mapped is None or mapped is exc:
            raise
        raise mapped from exc
    missing: list[str] = []
    for (name, _), reply in zip(probes, replies, strict=True):
        if isinstance(reply, BaseException):
            down = map_error(reply)
            if isinstance(down, RedisUnavailable):
                raise down from reply
            return None  # a probe ACL DRYRUN cannot answer (a newer command): ask the script
        text = reply.decode() if isinstance(reply, bytes) else str(reply)
        if text != "OK":
            missing.append(_denial(name, text, prefix))
    return sorted(set(missing))


async def _by_script(client: Any, role: Role, prefix: str) -> list[str] | None:
    """Missing permissions by the ``acl_check`` script; None before Redis 7."""
    probes = _probes(role, prefix, cluster=_is_cluster(client))
    args: list[str | int] = []
    for _, words in probes:
        args += [len(words), *words]
    call = Call(script("acl_check"), (_probe_key(prefix),), args)
    try:
        (reply,) = await run_calls(client, [call])
    except Exception as exc:
        mapped = map_error(exc)
        if isinstance(mapped, RedisRefused):
            # The check itself needs EVALSHA, SCRIPT LOAD and the key pattern: say which.
            named = _refused_name(mapped.reply)
            if named is not None:
                return [acl_key_pattern(prefix) if named.startswith("~") else named]
        if mapped is exc or not isinstance(exc, ResponseError):
            raise
        if mapped is not None:
            raise mapped from exc
        return None  # no redis.acl_check_cmd (Redis before 7.0): the server cannot tell
    missing = [f"+{name}" for (name, _), ok in zip(probes, reply, strict=True) if int(ok) == 0]
    return missing


async def missing_permissions(
    client: Any, role: Role, *, prefix: str, user: str | None = None
) -> list[str] | None:
    """The permissions ``role`` needs that the client's ACL user lacks (empty: none).

    On a cluster client :data:`CLUSTER_COMMANDS` are checked too. Asks ``ACL DRYRUN`` when
    the user may run it (not on a cluster), otherwise a script calling
    ``redis.acl_check_cmd`` (which needs only ``EVALSHA`` and ``SCRIPT LOAD``, both in every
    role): either way nothing is run, not even on the probe key. Returns None when the
    server cannot tell (Redis before 7.0). Each item is in ACL syntax: ``"+xautoclaim"``,
    or the key pattern (``"~myapp:*"``) when keys under the prefix are refused.

    Args:
        client: an async ``redis.asyncio.Redis`` or ``RedisCluster``.
        role: ``"producer"``, ``"worker"`` or ``"operator"``.
        prefix: the key prefix the role works under.
        user: the ACL user to check with ``ACL DRYRUN`` (default: the client's own). For
            another user than the client's, only ``ACL DRYRUN`` can tell: without it the
            answer is None.
    """
    role = _role(role)
    own = _username(client)
    who = user or own
    if who is not None:
        missing = await _dryrun(client, who, role, prefix)
        if missing is not None:
            return missing
    if user is not None and user != own:
        return None  # the script can only answer for the client's own user
    return await _by_script(client, role, prefix)


async def check_permissions(
    client: Any, role: Role, *, prefix: str, user: str | None = None
) -> None:
    """Refuse to go on when the client's ACL user lacks what ``role`` needs.

    Logs a warning and returns when the server cannot tell (Redis before 7.0): the first
    refused call then says what is missing instead.

    Raises:
        PermissionsMissing: listing every missing permission and the line that grants them.
        RedisUnavailable: Redis could not be reached.
    """
    missing = await missing_permissions(client, role, prefix=prefix, user=user)
    who = user or _username(client) or "the client's user"
    if missing is None:
        _log.warning("cannot check the ACL permissions of the %s role (Redis before 7.0); "
                     "the first refused call will say what is missing", role,
                     extra={"role": role, "user": who})
        return
    if missing:
        raise PermissionsMissing(
            f"the Redis ACL user {who!r} lacks permissions the {role} role needs: "
            f"{' '.join(missing)}; grant them with ACL SETUSER {who} {' '.join(missing)} "
            f"(streamq.security.acl_rules({role!r}, prefix={prefix!r}) lists the whole role)",
            role=role, user=who, missing=missing,
        )

