"""A web dashboard for streamq queues: depth, rates, consumers, dead letters, schedules.

Install the ``dashboard`` extra (``pip install 'streamq[dashboard]'``: Starlette, Jinja2 and
uvicorn), then run ``streamq dashboard --contracts myapp.contracts:CONTRACTS`` or let
``python -m worker`` serve it (``DASHBOARD_IS_ENABLED=true``). ``docs/dashboard.md`` shows
every page.

Reading is open to whoever reaches the port; retry, purge, pause and resume need the token
the dashboard was given and are off without one (see :mod:`streamq.dashboard.security`).
Payload fields a contract names in ``secret_fields`` are never shown.

Example::

    import redis.asyncio as aioredis
    import uvicorn
    from streamq.dashboard import create_app

    client = aioredis.Redis.from_url("redis://localhost:6379/0")
    app = create_app(CONTRACTS, client, token=os.environ["DASHBOARD_TOKEN"])
    uvicorn.run(app, host="127.0.0.1", port=8081)

Importing this package does not import Starlette: :func:`create_app` does, and says which
extra to install when it is missing.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import TYPE_CHECKING, Any

from streamq.errors import ConfigurationError
from streamq.keys import DEFAULT_GROUP, DEFAULT_PREFIX

if TYPE_CHECKING:
    from starlette.applications import Starlette

    from streamq.app import App
    from streamq.contracts import ContractSet, QueueContract

__all__ = ["create_app"]

DEFAULT_REFRESH_S = 5.0
DEFAULT_RATE_WINDOW_S = 300.0
DEFAULT_SAMPLE_INTERVAL_S = 10.0


def create_app(
    contracts: ContractSet | App[Any] | type[QueueContract] | Iterable[type[QueueContract]],
    redis: Any,
    *,
    token: str | None = None,
    read_only: bool = False,
    prefix: str = DEFAULT_PREFIX,
    group: str = DEFAULT_GROUP,
    refresh_s: float = DEFAULT_REFRESH_S,
    rate_window_s: float = DEFAULT_RATE_WINDOW_S,
    sample_interval_s: float = DEFAULT_SAMPLE_INTERVAL_S,
) -> Starlette:
    """The dashboard as a Starlette (ASGI) application.

    Args:
        contracts: the application's contracts: a ``ContractSet``, one contract or a list of
            them, or the ``App`` itself (then its schedules and runners are shown too).
        redis: a ``redis.asyncio.Redis`` (or ``RedisCluster``) client; the caller closes it.
        token: the secret that retry, purge, pause and resume require (at least 16
            characters). Without one, those actions are off.
        read_only: show no action at all and refuse every state-changing request, token or
            not.
        prefix: the key prefix shared with producers and workers.
        group: the workers' consumer group.
        refresh_s: how often open pages refresh their figures (0: never).
        rate_window_s: how far back the jobs-per-minute rates look.
        sample_interval_s: how often the rate counters are read from Redis.

    Raises:
        ConfigurationError: the ``dashboard`` extra is not installed, a token is too short,
            or ``contracts`` holds no queue contract.
    """
    try:
        from streamq.dashboard import web
    except ImportError as exc:
        raise ConfigurationError(
            f"the dashboard needs the 'dashboard' extra: pip install 'streamq[dashboard]' "
            f"({exc})"
        ) from exc
    from streamq.dashboard.data import Source
    from streamq.dashboard.rates import RateSampler
    from streamq.dashboard.security import Access

    for name, value in (("refresh_s", refresh_s), ("rate_window_s", rate_window_s),
                        ("sample_interval_s", sample_interval_s)):
        if not isinstance(value, int | float) or value < 0 or (value == 0 and name != "refresh_s"):
            raise ConfigurationError(f"dashboard {name} must be a positive number, got {value!r}")
    access = Access(token=token, read_only=read_only)
    src = Source.of(contracts, redis, prefix=prefix, group=group)
    sampler = RateSampler(redis, src.lanes(), prefix=prefix, interval_s=sample_interval_s,
                          window_s=rate_window_s)
    return web.build(src, access, refresh_s=refresh_s, sampler=sampler)
