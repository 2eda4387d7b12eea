"""Every setting of ``python -m worker``, parsed up front into one frozen object.

Only :func:`worker.__main__.main` reads ``os.environ``; everything here takes a mapping, so
tests pass plain dicts. Parsing collects every problem before it fails, and each message names
its variable. ``docs/configuration.md`` lists every variable.

Example::

    app = load_app("examples.ingestion.app:app")
    settings = parse_settings(os.environ, lanes=app.lane_names())
"""

from __future__ import annotations

import importlib
import importlib.util
import os
import re
import traceback
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal, cast

from streamq import loader
from streamq.app import App
from streamq.errors import ConfigurationError, LoadError
from streamq.keys import DEFAULT_GROUP, DEFAULT_PREFIX
from streamq.loader import load_object
from streamq.options import Limiter
from streamq.runners import RunnerConfig
from streamq.schedules import SchedulerConfig, flag_name
from streamq.tls import TLSConfig, check_tls_url
from worker.loops import EVENT_LOOPS, EventLoop, uvloop_installed
from worker.redis_url import check_redis_url

__all__ = [
    "QUEUE_OPTIONS",
    "AppImportError",
    "QueueOverrides",
    "Settings",
    "SettingsError",
    "apply_app_config",
    "cpu_count",
    "enable_flag",
    "env_name",
    "load_app",
    "load_settings",
    "option_variable",
    "parse_settings",
    "worker_overrides",
]

LogFormat = Literal["json", "text", "auto"]
_TRUE = frozenset({"true", "1", "yes"})
_FALSE = frozenset({"false", "0", "no"})
_LEVELS = ("DEBUG", "INFO", "WARNING", "ERROR", "CRITICAL")
_FLAG_RE = re.compile(r"^QUEUE_CONSUMER_(?P<lane>.+)_IS_ENABLED$")
# Only the flag shape is ours: other RUNNER_* / SCHEDULE_* variables (a CI runner's
# RUNNER_OS, RUNNER_TEMP...) belong to someone else and are left alone.
_SCHEDULE_FLAG_RE = re.compile(r"^SCHEDULE_.+_IS_ENABLED$")
_RUNNER_FLAG_RE = re.compile(r"^RUNNER_.+_IS_ENABLED$")

DEFAULT_EMBEDDED_PORT = 6390
DEFAULT_DASHBOARD_PORT = 8081
MIN_DASHBOARD_TOKEN_CHARS = 16
MAX_PROCESSES = 1024
MAX_SETTLE_DELAY_S = 0.1


class SettingsError(ConfigurationError):
    """Raised when environment settings are missing, malformed or unknown.

    Attributes:
        problems: ``(variable, message)`` pairs, one per problem found.
    """

    def __init__(self, problems: Sequence[tuple[str, str]]) -> None:
        self.problems = list(problems)
        lines = "\n".join(f"  {var}: {msg}" for var, msg in self.problems)
        super().__init__(f"invalid worker settings:\n{lines}")

    @property
    def variables(self) -> list[str]:
        return [var for var, _ in self.problems]


# -- value parsers: each returns the value or raises ValueError with a short reason ---------
def _url_ish(value: str) -> str:
    value = value.strip()
    if not value.startswith(("http://", "https://")):
        raise ValueError("must be an http:// or https:// URL")
    return value


def parse_bool(raw: str) -> bool:
    low = raw.strip().lower()
    if low in _TRUE:
        return True
    if low in _FALSE:
        return False
    raise ValueError(f"expected true/false/1/0/yes/no, got {raw!r}")


def _int(raw: str, minimum: int, maximum: int | None = None) -> int:
    try:
        value = int(raw.strip(), 10)
    except ValueError:
        raise ValueError(f"expected an integer, got {raw!r}") from None
    if value < minimum or (maximum is not None and value > maximum):
        bound = f"{minimum}..{maximum}" if maximum is not None else f">= {minimum}"
        raise ValueError(f"expected an integer {bound}, got {value}")
    return value


def _seconds(raw: str, *, positive: bool = True) -> float:
    try:
        value = float(raw.strip())
    except ValueError:
        raise ValueError(f"expected a number of seconds, got {raw!r}") from None
    if value != value or value in (float("inf"), float("-inf")):
        raise ValueError(f"expected a finite number of seconds, got {raw!r}")
    if value < 0 or (positive and value == 0):
        raise ValueError(f"expected a number of seconds {'> 0' if positive else '>= 0'}, "
                         f"got {raw!r}")
    return value


def _optional_seconds(raw: str) -> float | None:
    return None if raw.strip().lower() == "none" else _seconds(raw)


def _settle_delay(raw: str) -> float:
    value = _seconds(raw, positive=False)
    if value > MAX_SETTLE_DELAY_S:
        raise ValueError(f"expected a number of seconds 0..{MAX_SETTLE_DELAY_S} (at most "
                         f"100 ms), got {raw!r}")
    return value


def cpu_count() -> int:
    """The CPUs this process may run on (its affinity mask), at least 1.

    Not a container's CPU quota: under a CPU limit, give ``WORKER_PROCESSES`` a number.
    """
    try:
        return max(1, len(os.sched_getaffinity(0)))
    except (AttributeError, OSError):  # not Linux
        return max(1, os.cpu_count() or 1)


def _processes(raw: str) -> int:
    if raw.strip().lower() == "auto":
        return cpu_count()
    try:
        return _int(raw, 1, MAX_PROCESSES)
    except ValueError:
        raise ValueError(f"expected an integer 1..{MAX_PROCESSES} or auto, got {raw!r}") from None


@dataclass(frozen=True, slots=True)
class QueueOption:
    """One ``QUEUE_<QUEUE>_<OPTION>`` override: the option field it sets and its parser."""

    field: str
    parse: Callable[[str], Any]
    doc: str


QUEUE_OPTIONS: dict[str, QueueOption] = {
    "CONCURRENCY": QueueOption("concurrency", lambda r: _int(r, 1), "int >= 1"),
    "PREFETCH": QueueOption("prefetch", lambda r: _int(r, 0), "int >= 0"),
    "LOCK_DURATION": QueueOption("lock_duration", _seconds, "seconds"),
    "LOCK_RENEW_INTERVAL": QueueOption("lock_renew_interval", _seconds, "seconds"),
    "STALLED_INTERVAL": QueueOption("stalled_interval", _seconds, "seconds"),
    "MAX_STALLED_COUNT": QueueOption("max_stalled_count", lambda r: _int(r, 0), "int >= 0"),
    "ATTEMPTS": QueueOption("attempts", lambda r: _int(r, 1), "int >= 1"),
    "TIMEOUT": QueueOption("timeout", _optional_seconds, "seconds, or none"),
    "SHUTDOWN_TIMEOUT": QueueOption(
        "shutdown_timeout", lambda r: _seconds(r, positive=False), "seconds >= 0"
    ),
    "BLOCK_TIMEOUT": QueueOption("block_timeout", _seconds, "seconds"),
    "PROMOTE_INTERVAL": QueueOption("promote_interval", _seconds, "seconds"),
    "DEAD_LETTER_CAP": QueueOption("dead_letter_cap", lambda r: _int(r, 0), "int >= 0"),
    "SETTLE_DELAY": QueueOption("settle_delay", _settle_delay, "seconds 0..0.1"),
    "LIMITER_MAX": QueueOption("limiter_max", lambda r: _int(r, 0), "int >= 0 (0: no limit)"),
    "LIMITER_DURATION": QueueOption("limiter_duration", _seconds, "seconds"),
    "TENANT_CONCURRENCY": QueueOption(
        "tenant_concurrency", lambda r: _int(r, 0) or None, "int >= 0 (0: no cap)"
    ),
}
"""``QUEUE_<QUEUE>_<OPTION>`` suffixes and the worker option each one sets."""


def env_name(lane: str) -> str:
    """A lane's name in variable names: upper-cased, ``-`` as ``_``."""
    return lane.upper().replace("-", "_")


def enable_flag(lane: str) -> str:
    """The variable that enables a consumer for ``lane``."""
    return f"QUEUE_CONSUMER_{env_name(lane)}_IS_ENABLED"


def option_variable(lane: str, option: str) -> str:
    """The variable of one override, e.g. ``QUEUE_INGESTION_CONCURRENCY``."""
    return f"QUEUE_{env_name(lane)}_{option}"


@dataclass(frozen=True, slots=True)
class QueueOverrides:
    """Option overrides of one lane, as given by ``QUEUE_<QUEUE>_<OPTION>`` variables.

    ``values`` maps :class:`streamq.options.WorkerOptions` field names to parsed values, plus
    ``limiter_max`` / ``limiter_duration``, which :meth:`worker_options` folds into a
    ``Limiter``. ``variables`` maps each field back to its variable, for error messages.
    """

    values: Mapping[str, Any] = field(default_factory=dict)
    variables: Mapping[str, str] = field(default_factory=dict)


@dataclass(frozen=True, slots=True)
class Settings:
    """Everything ``python -m worker`` is configured with. Built by :func:`parse_settings`."""

    app: str
    redis_url: str | None
    redis_prefix: str = DEFAULT_PREFIX
    redis_cluster: bool = False
    redis_tls: TLSConfig | None = None
    worker_group: str = DEFAULT_GROUP
    processes: int = 1
    event_loop: EventLoop = "auto"
    log_format: LogFormat = "auto"
    log_level: str = "INFO"
    metrics_port: int | None = None
    metrics_host: str = "0.0.0.0"
    allow_unsafe_eviction: bool = False
    refuse_incompatible_contract: bool = True
    data_dir: Path = Path(".streamq")
    embedded_port: int = DEFAULT_EMBEDDED_PORT
    liveness_redis_timeout_s: float = 30.0
    liveness_wedge_timeout_s: float = 60.0
    otlp_endpoint: str | None = None
    otel_service_name: str = "streamq-worker"
    queues: tuple[str, ...] = ()
    overrides: Mapping[str, QueueOverrides] = field(default_factory=dict)
    scheduler_enabled: bool = True
    disabled_schedules: frozenset[str] = frozenset()
    runners_enabled: Mapping[str, bool] = field(default_factory=dict)
    dashboard_enabled: bool = False
    dashboard_host: str = "127.0.0.1"
    dashboard_port: int = DEFAULT_DASHBOARD_PORT
    dashboard_token: str | None = field(default=None, repr=False)
    dashboard_read_only: bool = False

    @property
    def embedded(self) -> bool:
        """True when no ``REDIS_URL`` is set: the worker uses a local embedded Redis."""
        return self.redis_url is None


class _Reader:
    """Reads variables from a mapping, collecting problems instead of stopping at the first."""

    def __init__(self, env: Mapping[str, str]) -> None:
        self.env = env
        self.problems: list[tuple[str, str]] = []

    def get(self, name: str, parse: Callable[[str], Any], default: Any) -> Any:
        raw = self.env.get(name)
        if raw is None:
            return default
        if raw.strip() == "":
            self.problems.append((name, "is set but empty; give a value or unset it"))
            return default
        try:
            return parse(raw)
        except ValueError as exc:
            self.problems.append((name, str(exc)))
            return default

    def choice(self, name: str, choices: Sequence[str], default: str, *, upper: bool) -> str:
        def parse(raw: str) -> str:
            value = raw.strip().upper() if upper else raw.strip().lower()
            if value not in choices:
                raise ValueError(f"expected one of {', '.join(choices)}, got {raw!r}")
            return value

        result: str = self.get(name, parse, default)
        return result


_TLS_FILES = ("REDIS_TLS_CA_FILE", "REDIS_TLS_CERT_FILE", "REDIS_TLS_KEY_FILE")


def _pem_file(raw: str) -> str:
    path = Path(raw.strip())
    if not path.is_file():
        raise ValueError(f"no such file: {str(path)!r}")
    try:
        with path.open("rb"):
            pass
    except OSError as exc:
        raise ValueError(f"cannot read {str(path)!r}: {exc.strerror}") from None
    return str(path)


def _tls_variables(r: _Reader, redis_url: str | None) -> TLSConfig | None:
    """``REDIS_TLS_*`` as a :class:`TLSConfig` (None when none is set); every problem is
    collected, and a TLS setting beside a plaintext (or no) ``REDIS_URL`` is one of them."""
    ca, cert, key = (r.get(name, _pem_file, None) for name in _TLS_FILES)
    verify = r.get("REDIS_TLS_VERIFY", parse_bool, True)
    given = [n for n in (*_TLS_FILES, "REDIS_TLS_VERIFY") if n in r.env]
    if key is not None and cert is None and "REDIS_TLS_CERT_FILE" not in r.env:
        r.problems.append(("REDIS_TLS_KEY_FILE", "is set without REDIS_TLS_CERT_FILE, the "
                                                 "client certificate it belongs to"))
        return None
    tls = TLSConfig(ca_file=ca, cert_file=cert, key_file=key, verify=verify) if given else None
    if redis_url is None:
        for name in given:
            where = "" if "REDIS_URL" in r.env else " (no REDIS_URL: the embedded Redis)"
            r.problems.append((name, f"needs a rediss:// REDIS_URL{where}"))
        return None
    try:
        check_tls_url(redis_url, tls)
    except ConfigurationError as exc:
        plaintext = tls is not None and not redis_url.startswith("rediss")
        r.problems.append((given[0] if plaintext else "REDIS_URL", str(exc)))
    return tls


def _match_lane(rest: str, lanes: Mapping[str, str]) -> list[tuple[str, str]]:
    """Every ``(lane, option)`` split of ``<LANE>_<OPTION>`` whose lane is known, longest
    lane first (``INGESTION_SECONDARY_CONCURRENCY`` is the secondary lane's concurrency)."""
    found = []
    for env_lane, lane in sorted(lanes.items(), key=lambda kv: -len(kv[0])):
        if rest.startswith(env_lane + "_"):
            found.append((lane, rest[len(env_lane) + 1 :]))
    return found


def _queue_variables(
    env: Mapping[str, str], lanes: Sequence[str], reader: _Reader
) -> tuple[tuple[str, ...], dict[str, QueueOverrides]]:
    by_env = {env_name(lane): lane for lane in lanes}
    known = ", ".join(lanes) or "(none)"
    enabled: list[str] = []
    values: dict[str, dict[str, Any]] = {}
    variables: dict[str, dict[str, str]] = {}
    for name in sorted(k for k in env if k.startswith("QUEUE_")):
        flag = _FLAG_RE.match(name)
        if flag:
            lane = by_env.get(flag["lane"])
            if lane is None:
                reader.problems.append(
                    (name, f"unknown queue {flag['lane']!r}; queues with a processor: {known}")
                )
            elif reader.get(name, parse_bool, False):
                enabled.append(lane)
            continue
        matches = _match_lane(name[len("QUEUE_") :], by_env)
        if not matches:
            reader.problems.append(
                (name, f"unknown queue in variable name; queues with a processor: {known}")
            )
            continue
        hit = next(((lane, opt) for lane, opt in matches if opt in QUEUE_OPTIONS), None)
        if hit is None:
            lane, opt = matches[0]
            reader.problems.append(
                (name, f"unknown option {opt!r} for queue {lane!r}; known options: "
                       f"{', '.join(QUEUE_OPTIONS)}")
            )
            continue
        lane, opt = hit
        spec = QUEUE_OPTIONS[opt]
        sentinel = object()
        value = reader.get(name, spec.parse, sentinel)
        if value is not sentinel:
            values.setdefault(lane, {})[spec.field] = value
            variables.setdefault(lane, {})[spec.field] = name
    # Keep the app's lane order, so consumers start in a predictable order.
    ordered = tuple(lane for lane in lanes if lane in enabled)
    overrides = {
        lane: QueueOverrides(values[lane], variables[lane]) for lane in values
    }
    return ordered, overrides


def _schedule_variables(
    env: Mapping[str, str], schedules: Sequence[str], reader: _Reader
) -> frozenset[str]:
    """The schedules disabled by ``SCHEDULE_<NAME>_IS_ENABLED=false``."""
    by_flag = {flag_name(name): name for name in schedules}
    known = ", ".join(schedules) or "(none: the app declares no schedule)"
    disabled = set()
    for name in sorted(k for k in env if _SCHEDULE_FLAG_RE.match(k)):
        schedule = by_flag.get(name)
        if schedule is None:
            reader.problems.append((name, f"unknown schedule; declared schedules: {known}"))
        elif not reader.get(name, parse_bool, True):
            disabled.add(schedule)
    return frozenset(disabled)


def _runner_variables(
    env: Mapping[str, str], runners: Sequence[str], reader: _Reader
) -> dict[str, bool]:
    """Every declared runner: whether ``RUNNER_<NAME>_IS_ENABLED`` (default true) runs it."""
    by_flag = {RunnerConfig.flag(name): name for name in runners}
    known = ", ".join(runners) or "(none: the app declares no runner)"
    for name in sorted(k for k in env if _RUNNER_FLAG_RE.match(k)):
        if name not in by_flag:
            reader.problems.append((name, f"unknown runner; declared runners: {known}"))
    return {name: bool(reader.get(flag, parse_bool, True)) for flag, name in by_flag.items()}


def parse_settings(
    env: Mapping[str, str],
    *,
    lanes: Iterable[str],
    schedules: Iterable[str] = (),
    runners: Iterable[str] = (),
) -> Settings:
    """Parse every setting from ``env``; ``lanes`` are the lane names that have a processor,
    ``schedules`` and ``runners`` the names of the app's schedules and runners.

    Raises:
        SettingsError: a variable is missing, empty, malformed or unknown, or nothing would
            run (no queue enabled, and no runner or schedule either). The message names
            every variable at fault.
    """
    lanes = list(lanes)
    schedules = list(schedules)
    runners = list(runners)
    r = _Reader(env)
    app = r.get("WORKER_APP", str.strip, None)
    if app is None and "WORKER_APP" not in env:
        r.problems.append(("WORKER_APP", "is required, e.g. WORKER_APP=myapp.worker:app"))
    cluster = r.get("REDIS_CLUSTER", parse_bool, False)
    redis_url = r.get("REDIS_URL", lambda v: check_redis_url(v, cluster=cluster), None)
    if cluster and redis_url is None and "REDIS_URL" not in env:
        r.problems.append(("REDIS_CLUSTER", "needs REDIS_URL (the embedded Redis is one node)"))
    redis_tls = _tls_variables(r, redis_url)
    queues, overrides = _queue_variables(env, lanes, r)
    scheduler_enabled = r.get("SCHEDULER_IS_ENABLED", parse_bool, True)
    disabled_schedules = _schedule_variables(env, schedules, r)
    runners_enabled = _runner_variables(env, runners, r)
    settings = Settings(
        app=app or "",
        redis_url=redis_url,
        redis_prefix=r.get("REDIS_PREFIX", str.strip, DEFAULT_PREFIX),
        redis_cluster=cluster,
        redis_tls=redis_tls,
        worker_group=r.get("WORKER_GROUP", str.strip, DEFAULT_GROUP),
        processes=r.get("WORKER_PROCESSES", _processes, 1),
        event_loop=_event_loop(r),
        log_format=cast(LogFormat, r.choice("LOG_FORMAT", ("json", "text", "auto"), "auto",
                                            upper=False)),
        log_level=r.choice("LOG_LEVEL", _LEVELS, "INFO", upper=True),
        metrics_port=r.get("METRICS_PORT", lambda v: _int(v, 1, 65535), None),
        metrics_host=r.get("METRICS_HOST", str.strip, "0.0.0.0"),
        allow_unsafe_eviction=r.get("ALLOW_UNSAFE_EVICTION", parse_bool, False),
        refuse_incompatible_contract=r.get(
            "WORKER_REFUSE_INCOMPATIBLE_CONTRACT", parse_bool, True
        ),
        data_dir=r.get("STREAMQ_DATA_DIR", lambda v: Path(v.strip()), Path(".streamq")),
        embedded_port=r.get(
            "STREAMQ_EMBEDDED_PORT", lambda v: _int(v, 1, 65535), DEFAULT_EMBEDDED_PORT
        ),
        liveness_redis_timeout_s=r.get("LIVENESS_REDIS_TIMEOUT", _seconds, 30.0),
        liveness_wedge_timeout_s=r.get("LIVENESS_WEDGE_TIMEOUT", _seconds, 60.0),
        # The standard OpenTelemetry variables: exporting starts when an endpoint is set and
        # the SDK is not disabled (the exporter reads OTEL_EXPORTER_OTLP_HEADERS itself).
        otlp_endpoint=None
        if r.get("OTEL_SDK_DISABLED", parse_bool, False)
        else r.get("OTEL_EXPORTER_OTLP_ENDPOINT", _url_ish, None),
        otel_service_name=r.get("OTEL_SERVICE_NAME", str.strip, "streamq-worker"),
        queues=queues,
        overrides=overrides,
        scheduler_enabled=scheduler_enabled,
        disabled_schedules=disabled_schedules,
        runners_enabled=runners_enabled,
        **_dashboard_variables(r),
    )
    # A process of runners (or schedules) alone consumes no queue: that is a deployment, not
    # a mistake. Only a process with nothing at all to run is refused.
    schedules_run = scheduler_enabled and any(n not in disabled_schedules for n in schedules)
    if not queues and not r.problems and not schedules_run and not any(
        runners_enabled.values()
    ):
        flags = "\n    ".join(f"{enable_flag(lane)}=true" for lane in lanes) or "(none)"
        also = (" (and every runner and schedule is disabled)" if runners or schedules
                else "")
        r.problems.append((
            "QUEUE_CONSUMER_*_IS_ENABLED",
            f"no queue is enabled{also}; set at least one of:\n    {flags}",
        ))
    if r.problems:
        raise SettingsError(r.problems)
    return settings


def _dashboard_token(raw: str) -> str:
    if len(raw) < MIN_DASHBOARD_TOKEN_CHARS or raw != raw.strip():
        raise ValueError(f"give at least {MIN_DASHBOARD_TOKEN_CHARS} characters without "
                         "surrounding spaces (the value is not shown)")
    return raw


def _dashboard_variables(r: _Reader) -> dict[str, Any]:
    """``DASHBOARD_*``: the dashboard this process serves beside its consumers."""
    enabled = r.get("DASHBOARD_IS_ENABLED", parse_bool, False)
    if enabled and not _installed("starlette", "jinja2", "uvicorn"):
        r.problems.append(("DASHBOARD_IS_ENABLED", "the dashboard needs the 'dashboard' extra: "
                                                   "pip install 'streamq[dashboard]'"))
    return {
        "dashboard_enabled": enabled,
        "dashboard_host": r.get("DASHBOARD_HOST", str.strip, "127.0.0.1"),
        "dashboard_port": r.get("DASHBOARD_PORT", lambda v: _int(v, 1, 65535),
                                DEFAULT_DASHBOARD_PORT),
        "dashboard_token": r.get("DASHBOARD_TOKEN", _dashboard_token, None),
        "dashboard_read_only": r.get("DASHBOARD_READ_ONLY", parse_bool, False),
    }


def _installed(*modules: str) -> bool:
    return all(importlib.util.find_spec(m) is not None for m in modules)


def _event_loop(r: _Reader) -> EventLoop:
    choice = cast(EventLoop, r.choice("WORKER_EVENT_LOOP", EVENT_LOOPS, "auto", upper=False))
    if choice == "uvloop" and not uvloop_installed():
        r.problems.append((
            "WORKER_EVENT_LOOP",
            "uvloop is not installed: pip install 'streamq[uvloop]', or set "
            "WORKER_EVENT_LOOP=auto (uvloop when installed) or asyncio",
        ))
    return choice


class AppImportError(SettingsError):
    """Raised when importing the app's module raised (anything but the module being absent).

    Attributes:
        error: the exception the user's code raised; :meth:`user_traceback` shows where.
    """

    def __init__(self, ref: str, error: BaseException) -> None:
        self.error = error
        what = " ".join(str(error).split()) or "(no message)"
        super().__init__([(
            "WORKER_APP",
            f"cannot load {ref}: importing it raised {type(error).__name__}: {what}",
        )])

    def user_traceback(self) -> str:
        """The traceback from the user's module on (importlib's and this module's frames
        left out)."""
        frames = [
            f for f in traceback.extract_tb(self.error.__traceback__)
            if not f.filename.startswith(("<frozen ", _IMPORTLIB))
            and f.filename not in (__file__, loader.__file__)
        ]
        lines = traceback.format_list(frames)
        if lines:
            lines.insert(0, "Traceback (most recent call last):\n")
        lines.extend(traceback.format_exception_only(type(self.error), self.error))
        return "".join(lines)


_IMPORTLIB = str(Path(importlib.__file__).parent)


def load_app(ref: str) -> App:
    """Import ``package.module:attribute`` and return the :class:`~streamq.app.App` it names
    (with :func:`streamq.loader.load_object`, the loader of every entry point).

    Raises:
        SettingsError: the reference is malformed, the module does not exist, or the
            attribute is missing or not an ``App``.
        AppImportError: importing the module raised (a ``SettingsError`` too).
    """
    try:
        obj = load_object(ref)
    except LoadError as exc:
        if exc.reason == "raised" and exc.error is not None:
            raise AppImportError(ref, exc.error) from exc.error
        raise SettingsError([("WORKER_APP", str(exc))]) from exc
    if not isinstance(obj, App):
        raise SettingsError(
            [("WORKER_APP", f"{ref} is a {type(obj).__name__}, not a streamq App")]
        )
    return obj


def worker_overrides(settings: Settings, app: App) -> dict[str, dict[str, Any]]:
    """Each enabled lane's ``WorkerOptions`` overrides, checked against the app's options.

    ``LIMITER_MAX`` / ``LIMITER_DURATION`` become a ``Limiter`` (a missing half comes from the
    processor's own limiter; ``LIMITER_MAX=0`` removes it).

    Raises:
        SettingsError: an override is inconsistent with the others or with the processor's
            options (e.g. a renew interval not shorter than the lock); names the variables.
    """
    out: dict[str, dict[str, Any]] = {}
    problems: list[tuple[str, str]] = []
    for lane in settings.queues:
        given = settings.overrides.get(lane)
        reg = app.registration(lane)
        if given is None or reg is None:
            continue
        kwargs = {k: v for k, v in given.values.items() if not k.startswith("limiter_")}
        try:
            if "limiter_max" in given.values or "limiter_duration" in given.values:
                kwargs["limiter"] = _limiter(given, reg.options.limiter)
            reg.options.merged(**kwargs)
        except ConfigurationError as exc:
            names = ", ".join(sorted(given.variables.values()))
            problems.append((names, str(exc)))
            continue
        out[lane] = kwargs
    if problems:
        raise SettingsError(problems)
    return out


def _limiter(given: QueueOverrides, current: Limiter | None) -> Limiter | None:
    max_jobs = given.values.get("limiter_max")
    duration = given.values.get("limiter_duration")
    if max_jobs == 0:
        return None
    if max_jobs is None:
        if current is None:
            raise ConfigurationError(
                "a LIMITER_DURATION needs a LIMITER_MAX too: the processor has no limiter "
                "to take the maximum from"
            )
        max_jobs = current.max_jobs
    if duration is None:
        duration = current.duration if current is not None else 1.0
    return Limiter(max_jobs, duration)


def load_settings(env: Mapping[str, str]) -> tuple[Settings, App]:
    """Load the app named by ``WORKER_APP``, parse every other setting against its lanes and
    check the per-queue overrides against its processors' options.

    Raises:
        SettingsError: as :func:`parse_settings`, :func:`load_app` and
            :func:`worker_overrides`.
    """
    ref = env.get("WORKER_APP")
    if ref is None or not ref.strip():
        what = "is required" if ref is None else "is set but empty"
        raise SettingsError([("WORKER_APP", f"{what}; e.g. WORKER_APP=myapp.worker:app")])
    app = load_app(ref.strip())
    settings = parse_settings(env, lanes=app.lane_names(), schedules=list(app.schedules),
                              runners=list(app.runners))
    worker_overrides(settings, app)
    return settings, app


def apply_app_config(settings: Settings, app: App) -> None:
    """Set ``app.scheduler_config`` and ``app.runner_config`` from the ``SCHEDULER_*``,
    ``SCHEDULE_<NAME>_IS_ENABLED`` and ``RUNNER_<NAME>_IS_ENABLED`` settings; an app without
    schedules (runners) keeps its default.

    Raises:
        ConfigurationError: the settings name a schedule or runner the app does not declare
            (settings parsed against another app).
    """
    if app.schedules:
        app.scheduler_config = SchedulerConfig(enabled=settings.scheduler_enabled,
                                               disabled=settings.disabled_schedules)
    if app.runners:
        app.runner_config = RunnerConfig(enabled=dict(settings.runners_enabled))
