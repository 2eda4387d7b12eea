"""What a failure of ``python -m worker`` means: its exit code and one line naming the fix.

Exit 2 is bad configuration, something a person has to change (a variable, the app, the
Redis it points at); exit 1 is Redis being unreachable, or the worker failing. redis-py and
the runtime raise the same refusal in several shapes (a redis-py class, a mapped streamq
error whose cause is the redis-py one, the reply text), so the whole chain is searched.

Example::

    failure = explain(exc, settings)
    log.error("cannot start: %s", failure.message, extra={"variable": failure.variable})
    return failure.code
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass

import redis
from redis.exceptions import (
    AuthenticationError,
    AuthenticationWrongNumberOfArgsError,
    MovedError,
    NoPermissionError,
    RedisClusterException,
)

from streamq.errors import (
    ConfigurationError,
    ContractError,
    ForeignConsumerGroup,
    IncompatibleContract,
    PermissionsMissing,
    RedisRefused,
    RedisUnavailable,
    RegistrationError,
    StartupHookFailed,
    StreamqError,
    UnsafeRedisConfig,
)
from worker.redis_url import database, location
from worker.settings import Settings

__all__ = ["EXIT_FAILED", "EXIT_OK", "EXIT_USAGE", "Failure", "explain"]

EXIT_OK = 0
EXIT_FAILED = 1
EXIT_USAGE = 2
_OVERRIDE_CONTRACT = "WORKER_REFUSE_INCOMPATIBLE_CONTRACT"


@dataclass(frozen=True, slots=True)
class Failure:
    """How the process ends: ``code``, a one-line ``message``, the ``variable`` to change.

    ``unexpected`` failures (not a known refusal) are logged with their traceback. A failure
    of the app's own code (a startup hook) has a ``cause``, whose traceback is logged before
    the message; ``subject`` names that code.
    """

    code: int
    message: str
    variable: str | None = None
    unexpected: bool = False
    cause: BaseException | None = None
    subject: str = ""


def explain(exc: BaseException, settings: Settings) -> Failure:
    """The :class:`Failure` that ``exc``, raised while starting or running, stands for."""
    if isinstance(exc, StartupHookFailed):
        # The hook's own failure, whatever it is: its ConnectionRefusedError is its database
        # refusing, not Redis, so the cause chain is not searched for a Redis refusal.
        cause = exc.__cause__
        if cause is None:
            message = _line(exc)
        else:
            text = " ".join(str(cause).split())
            what = f"{type(cause).__name__}: {text}" if text else type(cause).__name__
            message = f"startup hook {exc.hook} failed: {what}"
        return Failure(EXIT_FAILED, message, cause=cause if cause is not None else exc,
                       subject=f"startup hook {exc.hook}")
    where = location(settings.redis_url, settings.embedded_port)
    found = _refusal(exc, settings, where) or _typed(exc, settings)
    if found is not None:
        return found
    if any(isinstance(e, _UNREACHABLE) for e in _chain(exc)):
        return Failure(EXIT_FAILED, f"cannot reach Redis at {where}: {_line(exc)}")
    if isinstance(exc, StreamqError):
        return Failure(EXIT_FAILED, f"worker failed: {_line(exc)}")
    return Failure(EXIT_FAILED, f"worker failed: {type(exc).__name__}: {_line(exc)}",
                   unexpected=True)


_UNREACHABLE = (RedisUnavailable, redis.ConnectionError, redis.TimeoutError, ConnectionError,
                TimeoutError, RedisClusterException)


def _refusal(exc: BaseException, s: Settings, where: str) -> Failure | None:
    """A refusal Redis gave at connection time, from its text anywhere in the chain."""
    for e in _chain(exc):
        text = " ".join(str(e).split())
        if "'cluster|slots' command" in text or "'command' command" in text:
            # redis-py's cluster client then says "Cluster mode is not enabled": not so.
            return Failure(EXIT_USAGE,
                           f"{where} refused the ACL user of REDIS_URL a command a cluster "
                           f"client needs ({text}); grant +cluster|slots and +command "
                           "besides the worker role's (docs/security.md)", "REDIS_URL")
    for e in _chain(exc):
        text = " ".join(str(e).split())
        tls = _tls_refusal(text, where)
        if tls is not None:
            return tls
        if "Cluster mode is not enabled" in text:
            return Failure(EXIT_USAGE,
                           f"REDIS_CLUSTER=true but {where} is not a Redis Cluster node "
                           "(cluster mode is not enabled on it); unset REDIS_CLUSTER, or "
                           "point REDIS_URL at a node of the cluster", "REDIS_CLUSTER")
        if "DB index is out of range" in text:
            return Failure(EXIT_USAGE,
                           f"REDIS_URL selects database {_db(s)}, which {where} refuses "
                           "(DB index is out of range); use an index below the server's "
                           "'databases' setting (16 by default)", "REDIS_URL")
        if "SELECT is not allowed in cluster mode" in text:
            return Failure(EXIT_USAGE,
                           f"REDIS_URL selects database {_db(s)}, but {where} is a Redis "
                           "Cluster node, which has only database 0; use /0 and set "
                           "REDIS_CLUSTER=true", "REDIS_URL")
        if (isinstance(e, MovedError) or text.startswith("MOVED ")) and not s.redis_cluster:
            return Failure(EXIT_USAGE,
                           f"{where} is a Redis Cluster node (it answered MOVED); set "
                           "REDIS_CLUSTER=true", "REDIS_CLUSTER")
        if isinstance(e, AuthenticationError | AuthenticationWrongNumberOfArgsError) or (
            text.startswith(("WRONGPASS", "NOAUTH"))
        ):
            return Failure(EXIT_USAGE,
                           f"{where} refused the credentials of REDIS_URL: {text}; check the "
                           "user and password in REDIS_URL", "REDIS_URL")
        if isinstance(e, NoPermissionError) or text.startswith("NOPERM"):
            return Failure(EXIT_USAGE,
                           f"{where} refused a command streamq needs: {text}; give the ACL "
                           "user of REDIS_URL the stream, hash, sorted-set, string and "
                           f"scripting commands on the keys under REDIS_PREFIX "
                           f"({s.redis_prefix!r})", "REDIS_URL")
        if text.startswith("WRONGTYPE"):
            return Failure(EXIT_USAGE,
                           f"a key under REDIS_PREFIX ({s.redis_prefix!r}) holds another type "
                           f"of value ({text}); another application uses this prefix: give "
                           "the queues their own REDIS_PREFIX", "REDIS_PREFIX")
    return None


def _tls_refusal(text: str, where: str) -> Failure | None:
    """A TLS handshake that failed for a reason the configuration must fix."""
    if "CERTIFICATE_VERIFY_FAILED" in text or "certificate verify failed" in text:
        if "mismatch" in text or "not valid for" in text:
            return Failure(EXIT_USAGE,
                           f"{where} presented a TLS certificate for another host name "
                           f"({text}); use a REDIS_URL host the certificate names",
                           "REDIS_URL")
        return Failure(EXIT_USAGE,
                       f"{where} presented a TLS certificate that cannot be verified "
                       f"({text}); set REDIS_TLS_CA_FILE to the CA that signed it",
                       "REDIS_TLS_CA_FILE")
    if "certificate required" in text or "CERTIFICATE_REQUIRED" in text:
        return Failure(EXIT_USAGE,
                       f"{where} requires a client certificate (mutual TLS): set "
                       "REDIS_TLS_CERT_FILE (and REDIS_TLS_KEY_FILE)", "REDIS_TLS_CERT_FILE")
    return None


def _typed(exc: BaseException, s: Settings) -> Failure | None:
    """A streamq error that means the configuration must change."""
    if isinstance(exc, UnsafeRedisConfig):
        return Failure(EXIT_USAGE, f"{_line(exc)} (ALLOW_UNSAFE_EVICTION=true starts anyway)",
                       "ALLOW_UNSAFE_EVICTION")
    if isinstance(exc, ForeignConsumerGroup):
        message = _line(exc)
        if "WORKER_GROUP" not in message:
            message += (f" (this worker's group: WORKER_GROUP={s.worker_group!r}; use the "
                        "group the other workers use, or remove the other group)")
        return Failure(EXIT_USAGE, message, "WORKER_GROUP")
    if isinstance(exc, PermissionsMissing):
        return Failure(EXIT_USAGE,
                       f"{_line(exc)} (the user is the ACL user of REDIS_URL; docs/security.md "
                       "shows every role's rules)", "REDIS_URL")
    if isinstance(exc, RedisRefused):
        return Failure(EXIT_USAGE,
                       f"Redis refused a call for good: {_line(exc)}; fix the access REDIS_URL "
                       f"gives, or the keys under REDIS_PREFIX ({s.redis_prefix!r})",
                       "REDIS_URL")
    if isinstance(exc, IncompatibleContract):
        changes = "; ".join(exc.changes)
        message = (f"the app's contracts (WORKER_APP={s.app}) are incompatible: {_line(exc)}"
                   + (f" ({changes})" if changes else ""))
        if _OVERRIDE_CONTRACT not in message:
            message += f" ({_OVERRIDE_CONTRACT}=false starts anyway, logging the changes)"
        return Failure(EXIT_USAGE, message, "WORKER_APP")
    if isinstance(exc, RegistrationError | ContractError):
        return Failure(EXIT_USAGE,
                       f"the app (WORKER_APP={s.app}) is invalid: {type(exc).__name__}: "
                       f"{_line(exc)}", "WORKER_APP")
    if isinstance(exc, ConfigurationError):
        return Failure(EXIT_USAGE, _line(exc))
    return None


def _chain(exc: BaseException) -> Iterator[BaseException]:
    """``exc``, then its causes and contexts (each once)."""
    seen: set[int] = set()
    todo: list[BaseException] = [exc]
    while todo:
        e = todo.pop(0)
        if id(e) in seen:
            continue
        seen.add(id(e))
        yield e
        todo.extend(x for x in (e.__cause__, e.__context__) if x is not None)


def _db(s: Settings) -> int:
    return database(s.redis_url) if s.redis_url else 0


def _line(exc: BaseException) -> str:
    return " ".join(str(exc).split()) or type(exc).__name__
