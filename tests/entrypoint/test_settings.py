"""Parsing ``python -m worker``'s environment: every value, every error path, exit code 2."""

from __future__ import annotations

import dataclasses
import sys
from pathlib import Path

import pytest

from streamq.options import Limiter
from worker.__main__ import main
from worker.settings import (
    Settings,
    SettingsError,
    cpu_count,
    enable_flag,
    load_app,
    load_settings,
    parse_settings,
    worker_overrides,
)

from .sample_app import app

APP = "tests.entrypoint.sample_app:app"
LANES = ["notes", "notes-secondary", "chores"]


def env(**extra: str) -> dict[str, str]:
    base = {"WORKER_APP": APP, "QUEUE_CONSUMER_NOTES_IS_ENABLED": "true"}
    base.update(extra)
    return base


def problems(e: dict[str, str], lanes: list[str] = LANES) -> dict[str, str]:
    with pytest.raises(SettingsError) as info:
        parse_settings(e, lanes=lanes)
    return dict(info.value.problems)


# -- values -------------------------------------------------------------------------------
@pytest.mark.parametrize("raw", ["true", "TRUE", "True", "1", "yes", "YES", " yes "])
def test_true_spellings_enable_a_queue(raw: str) -> None:
    s = parse_settings(env(QUEUE_CONSUMER_CHORES_IS_ENABLED=raw), lanes=LANES)
    assert s.queues == ("notes", "chores")


@pytest.mark.parametrize("raw", ["false", "FALSE", "0", "no", "No"])
def test_false_spellings_leave_a_queue_off(raw: str) -> None:
    s = parse_settings(env(QUEUE_CONSUMER_CHORES_IS_ENABLED=raw), lanes=LANES)
    assert s.queues == ("notes",)


@pytest.mark.parametrize("raw", ["on", "off", "y", "2", "enabled", "tru"])
def test_any_other_boolean_is_an_error_naming_the_variable(raw: str) -> None:
    found = problems(env(QUEUE_CONSUMER_CHORES_IS_ENABLED=raw))
    assert "QUEUE_CONSUMER_CHORES_IS_ENABLED" in found
    assert repr(raw) in found["QUEUE_CONSUMER_CHORES_IS_ENABLED"]


@pytest.mark.parametrize("var", ["REDIS_CLUSTER", "ALLOW_UNSAFE_EVICTION"])
def test_malformed_global_boolean_is_an_error(var: str) -> None:
    assert var in problems(env(**{var: "perhaps"}))


def test_defaults_when_only_a_flag_is_given() -> None:
    s = parse_settings(env(), lanes=LANES)
    assert s == Settings(app=APP, redis_url=None, queues=("notes",))
    assert s.redis_prefix == "streamq"
    assert s.worker_group == "streamq"
    assert s.log_format == "auto"
    assert s.log_level == "INFO"
    assert s.metrics_port is None
    assert s.data_dir == Path(".streamq")
    assert s.embedded_port == 6390
    assert (s.liveness_redis_timeout_s, s.liveness_wedge_timeout_s) == (30.0, 60.0)
    assert (s.processes, s.event_loop, s.refuse_incompatible_contract) == (1, "auto", True)
    assert s.embedded


def test_every_global_variable_is_parsed() -> None:
    s = parse_settings(
        env(
            REDIS_URL="redis://db:6379/0",  # a cluster has only database 0
            REDIS_PREFIX="acme",
            REDIS_CLUSTER="yes",
            WORKER_GROUP="ingest",
            LOG_FORMAT="JSON",
            LOG_LEVEL="debug",
            METRICS_PORT="9100",
            METRICS_HOST="127.0.0.1",
            ALLOW_UNSAFE_EVICTION="1",
            STREAMQ_DATA_DIR="/var/lib/q",
            STREAMQ_EMBEDDED_PORT="7000",
            LIVENESS_REDIS_TIMEOUT="12.5",
            LIVENESS_WEDGE_TIMEOUT="90",
            WORKER_PROCESSES="3",
            WORKER_EVENT_LOOP="AsyncIO",
            WORKER_REFUSE_INCOMPATIBLE_CONTRACT="false",
        ),
        lanes=LANES,
    )
    assert s.redis_url == "redis://db:6379/0"
    assert (s.redis_prefix, s.redis_cluster, s.worker_group) == ("acme", True, "ingest")
    assert (s.log_format, s.log_level) == ("json", "DEBUG")
    assert (s.metrics_port, s.metrics_host) == (9100, "127.0.0.1")
    assert s.allow_unsafe_eviction is True
    assert (s.data_dir, s.embedded_port) == (Path("/var/lib/q"), 7000)
    assert (s.liveness_redis_timeout_s, s.liveness_wedge_timeout_s) == (12.5, 90.0)
    assert (s.processes, s.event_loop) == (3, "asyncio")
    assert s.refuse_incompatible_contract is False
    assert not s.embedded


def test_settings_are_frozen() -> None:
    s = parse_settings(env(), lanes=LANES)
    with pytest.raises(dataclasses.FrozenInstanceError):
        s.redis_prefix = "other"  # type: ignore[misc]


@pytest.mark.parametrize(
    ("var", "raw", "says"),
    [
        ("METRICS_PORT", "abc", "integer"),
        ("METRICS_PORT", "70000", "1..65535"),
        ("METRICS_PORT", "0", "1..65535"),
        ("STREAMQ_EMBEDDED_PORT", "6390.5", "integer"),
        ("LIVENESS_REDIS_TIMEOUT", "soon", "seconds"),
        ("LIVENESS_WEDGE_TIMEOUT", "-1", "> 0"),
        ("LIVENESS_WEDGE_TIMEOUT", "nan", "finite"),
        ("LOG_FORMAT", "xml", "json, text, auto"),
        ("LOG_LEVEL", "LOUD", "DEBUG"),
        ("REDIS_PREFIX", "", "empty"),
        ("REDIS_URL", "  ", "empty"),
        ("WORKER_PROCESSES", "two", "an integer 1..1024 or auto, got 'two'"),
        ("WORKER_PROCESSES", "0", "1..1024 or auto"),
        ("WORKER_PROCESSES", "2.5", "1..1024 or auto"),
        ("WORKER_PROCESSES", "5000", "1..1024 or auto"),
        ("WORKER_PROCESSES", "", "empty"),
        ("WORKER_EVENT_LOOP", "trio", "auto, asyncio, uvloop"),
        ("WORKER_REFUSE_INCOMPATIBLE_CONTRACT", "maybe", "true/false"),
    ],
)
def test_malformed_global_value_is_named(var: str, raw: str, says: str) -> None:
    found = problems(env(**{var: raw}))
    assert var in found
    assert says in found[var]


# -- per-queue overrides ------------------------------------------------------------------
@pytest.mark.parametrize(
    ("suffix", "raw", "field", "value"),
    [
        ("CONCURRENCY", "8", "concurrency", 8),
        ("LOCK_DURATION", "1.5", "lock_duration", 1.5),
        ("LOCK_RENEW_INTERVAL", "0.5", "lock_renew_interval", 0.5),
        ("STALLED_INTERVAL", "2", "stalled_interval", 2.0),
        ("MAX_STALLED_COUNT", "0", "max_stalled_count", 0),
        ("ATTEMPTS", "7", "attempts", 7),
        ("TIMEOUT", "30", "timeout", 30.0),
        ("TIMEOUT", "none", "timeout", None),
        ("SHUTDOWN_TIMEOUT", "0", "shutdown_timeout", 0.0),
        ("BLOCK_TIMEOUT", "0.5", "block_timeout", 0.5),
        ("PROMOTE_INTERVAL", "0.1", "promote_interval", 0.1),
        ("DEAD_LETTER_CAP", "1000", "dead_letter_cap", 1000),
        ("PREFETCH", "3", "prefetch", 3),
        ("PREFETCH", "0", "prefetch", 0),
        ("SETTLE_DELAY", "0", "settle_delay", 0.0),
        ("SETTLE_DELAY", "0.01", "settle_delay", 0.01),
    ],
)
def test_queue_option_is_parsed_into_the_lanes_overrides(
    suffix: str, raw: str, field: str, value: object
) -> None:
    s = parse_settings(env(**{f"QUEUE_NOTES_{suffix}": raw}), lanes=LANES)
    assert s.overrides["notes"].values == {field: value}
    assert s.overrides["notes"].variables == {field: f"QUEUE_NOTES_{suffix}"}
    assert worker_overrides(s, app)["notes"] == {field: value}


@pytest.mark.parametrize(
    ("var", "raw", "says"),
    [
        ("QUEUE_NOTES_CONCURRENCY", "many", "integer"),
        ("QUEUE_NOTES_CONCURRENCY", "0", ">= 1"),
        ("QUEUE_NOTES_CONCURRENCY", "2.5", "integer"),
        ("QUEUE_NOTES_ATTEMPTS", "0", ">= 1"),
        ("QUEUE_NOTES_MAX_STALLED_COUNT", "-1", ">= 0"),
        ("QUEUE_NOTES_LOCK_DURATION", "30s", "seconds"),
        ("QUEUE_NOTES_LOCK_DURATION", "0", "> 0"),
        ("QUEUE_NOTES_LOCK_DURATION", "inf", "finite"),
        ("QUEUE_NOTES_STALLED_INTERVAL", "-2", "seconds"),
        ("QUEUE_NOTES_TIMEOUT", "never", "seconds"),
        ("QUEUE_NOTES_LIMITER_MAX", "x", "integer"),
        ("QUEUE_NOTES_LIMITER_DURATION", "0", "> 0"),
        ("QUEUE_NOTES_CONCURRENCY", "", "empty"),
        ("QUEUE_NOTES_PREFETCH", "-1", ">= 0"),
        ("QUEUE_NOTES_PREFETCH", "a few", "integer"),
        ("QUEUE_NOTES_SETTLE_DELAY", "0.5", "at most 100 ms"),
        ("QUEUE_NOTES_SETTLE_DELAY", "-0.001", ">= 0"),
        ("QUEUE_NOTES_SETTLE_DELAY", "2ms", "seconds"),
    ],
)
def test_malformed_queue_option_is_named(var: str, raw: str, says: str) -> None:
    found = problems(env(**{var: raw}))
    assert list(found) == [var]
    assert says in found[var]


def test_secondary_lane_has_its_own_flag_and_overrides() -> None:
    s = parse_settings(
        env(
            QUEUE_CONSUMER_NOTES_SECONDARY_IS_ENABLED="true",
            QUEUE_NOTES_SECONDARY_CONCURRENCY="3",
            QUEUE_NOTES_CONCURRENCY="9",
        ),
        lanes=LANES,
    )
    assert s.queues == ("notes", "notes-secondary")
    assert s.overrides["notes-secondary"].values == {"concurrency": 3}
    assert s.overrides["notes"].values == {"concurrency": 9}


def test_enabled_queues_keep_the_apps_lane_order() -> None:
    s = parse_settings(
        {"WORKER_APP": APP, "QUEUE_CONSUMER_CHORES_IS_ENABLED": "1",
         "QUEUE_CONSUMER_NOTES_SECONDARY_IS_ENABLED": "1", "QUEUE_CONSUMER_NOTES_IS_ENABLED": "1"},
        lanes=LANES,
    )
    assert s.queues == ("notes", "notes-secondary", "chores")


@pytest.mark.parametrize(
    "var",
    ["QUEUE_NOPE_CONCURRENCY", "QUEUE_CONSUMER_NOPE_IS_ENABLED", "QUEUE_NOTES", "QUEUE_"],
)
def test_unknown_queue_is_an_error_listing_the_known_queues(var: str) -> None:
    found = problems(env(**{var: "1"}))
    assert var in found
    assert "unknown queue" in found[var]
    assert "notes, notes-secondary, chores" in found[var]


@pytest.mark.parametrize("var", ["QUEUE_NOTES_SPEED", "QUEUE_NOTES_SECONDARY_CONCURENCY"])
def test_unknown_option_is_an_error_listing_the_known_options(var: str) -> None:
    found = problems(env(**{var: "1"}))
    assert var in found
    assert "unknown option" in found[var]
    assert "CONCURRENCY" in found[var]


def test_no_queue_enabled_lists_every_flag_that_would_enable_one() -> None:
    found = problems({"WORKER_APP": APP, "QUEUE_CONSUMER_NOTES_IS_ENABLED": "false"})
    message = found["QUEUE_CONSUMER_*_IS_ENABLED"]
    for lane in LANES:
        assert f"{enable_flag(lane)}=true" in message
    assert enable_flag("notes-secondary") == "QUEUE_CONSUMER_NOTES_SECONDARY_IS_ENABLED"


def test_every_problem_is_reported_at_once() -> None:
    found = problems(env(METRICS_PORT="x", QUEUE_NOPE_CONCURRENCY="1",
                         QUEUE_NOTES_ATTEMPTS="zero", LOG_LEVEL="loud"))
    assert set(found) == {"METRICS_PORT", "QUEUE_NOPE_CONCURRENCY", "QUEUE_NOTES_ATTEMPTS",
                          "LOG_LEVEL"}


def test_cluster_without_redis_url_is_an_error() -> None:
    assert "REDIS_CLUSTER" in problems(env(REDIS_CLUSTER="true"))


# -- overrides checked against the processors' options -----------------------------------
def test_limiter_variables_become_a_limiter() -> None:
    s = parse_settings(env(QUEUE_NOTES_LIMITER_MAX="50", QUEUE_NOTES_LIMITER_DURATION="2"),
                       lanes=LANES)
    assert worker_overrides(s, app)["notes"] == {"limiter": Limiter(50, 2.0)}


def test_limiter_max_alone_keeps_the_processors_duration() -> None:
    s = parse_settings(
        {"WORKER_APP": APP, "QUEUE_CONSUMER_CHORES_IS_ENABLED": "1",
         "QUEUE_CHORES_LIMITER_MAX": "7"},
        lanes=LANES,
    )
    assert worker_overrides(s, app)["chores"] == {"limiter": Limiter(7, 1.0)}


def test_limiter_max_zero_removes_the_limiter() -> None:
    s = parse_settings(
        {"WORKER_APP": APP, "QUEUE_CONSUMER_CHORES_IS_ENABLED": "1",
         "QUEUE_CHORES_LIMITER_MAX": "0"},
        lanes=LANES,
    )
    assert worker_overrides(s, app)["chores"] == {"limiter": None}


def test_limiter_duration_without_any_maximum_is_an_error() -> None:
    s = parse_settings(env(QUEUE_NOTES_LIMITER_DURATION="2"), lanes=LANES)
    with pytest.raises(SettingsError) as info:
        worker_overrides(s, app)
    assert info.value.variables == ["QUEUE_NOTES_LIMITER_DURATION"]


def test_inconsistent_overrides_name_every_variable_involved() -> None:
    s = parse_settings(
        env(QUEUE_NOTES_LOCK_DURATION="1", QUEUE_NOTES_LOCK_RENEW_INTERVAL="2"), lanes=LANES
    )
    with pytest.raises(SettingsError) as info:
        worker_overrides(s, app)
    assert info.value.variables == [
        "QUEUE_NOTES_LOCK_DURATION, QUEUE_NOTES_LOCK_RENEW_INTERVAL"
    ]
    assert "lock_renew_interval" in str(info.value)


# -- the app ------------------------------------------------------------------------------
def test_load_settings_takes_the_lanes_from_the_app() -> None:
    s, loaded = load_settings(env(QUEUE_CONSUMER_NOTES_SECONDARY_IS_ENABLED="yes"))
    assert loaded is app
    assert s.queues == ("notes", "notes-secondary")


@pytest.mark.parametrize(
    ("ref", "says"),
    [
        ("tests.entrypoint.sample_app", "package.module:attribute"),
        (":app", "package.module:attribute"),
        ("tests.entrypoint.no_such_module:app", "cannot import"),
        ("tests.entrypoint.sample_app:missing", "no attribute"),
        ("tests.entrypoint.sample_app:not_an_app", "not a streamq App"),
    ],
)
def test_bad_worker_app_is_named(ref: str, says: str) -> None:
    with pytest.raises(SettingsError) as info:
        load_app(ref)
    assert info.value.variables == ["WORKER_APP"]
    assert says in str(info.value)


@pytest.mark.parametrize("value", [None, ""])
def test_missing_worker_app_is_an_error(value: str | None) -> None:
    e = env()
    if value is None:
        del e["WORKER_APP"]
    else:
        e["WORKER_APP"] = value
    with pytest.raises(SettingsError) as info:
        load_settings(e)
    assert info.value.variables == ["WORKER_APP"]


# -- main() -------------------------------------------------------------------------------
@pytest.mark.parametrize(
    ("extra", "variable"),
    [
        ({"QUEUE_CONSUMER_NOTES_IS_ENABLED": "sure"}, "QUEUE_CONSUMER_NOTES_IS_ENABLED"),
        ({"QUEUE_NOTES_CONCURRENCY": "lots"}, "QUEUE_NOTES_CONCURRENCY"),
        ({"QUEUE_NOTES_LOCK_DURATION": "long"}, "QUEUE_NOTES_LOCK_DURATION"),
        ({"QUEUE_GHOST_CONCURRENCY": "1"}, "QUEUE_GHOST_CONCURRENCY"),
        ({"QUEUE_NOTES_COLOUR": "red"}, "QUEUE_NOTES_COLOUR"),
        ({"QUEUE_CONSUMER_NOTES_IS_ENABLED": "no"}, "QUEUE_CONSUMER_NOTES_IS_ENABLED=true"),
        ({"WORKER_APP": "nowhere:app"}, "WORKER_APP"),
    ],
)
def test_main_exits_2_naming_the_variable(
    extra: dict[str, str], variable: str, capsys: pytest.CaptureFixture[str]
) -> None:
    # A closed port: exiting 2 proves nothing tried to connect first (that would exit 1).
    assert main(env(REDIS_URL="redis://127.0.0.1:1/0", **extra)) == 2
    err = capsys.readouterr().err
    assert variable in err
    assert err.startswith("python -m worker: invalid worker settings:")


# -- OpenTelemetry's standard variables ----------------------------------------------------
def test_otlp_endpoint_and_service_name_come_from_the_standard_otel_variables() -> None:
    s = parse_settings(
        env(OTEL_EXPORTER_OTLP_ENDPOINT="http://collector:4318", OTEL_SERVICE_NAME="ingest"),
        lanes=LANES,
    )
    assert (s.otlp_endpoint, s.otel_service_name) == ("http://collector:4318", "ingest")


def test_no_otlp_export_without_an_endpoint_or_when_the_sdk_is_disabled() -> None:
    assert parse_settings(env(), lanes=LANES).otlp_endpoint is None
    disabled = env(OTEL_EXPORTER_OTLP_ENDPOINT="http://collector:4318", OTEL_SDK_DISABLED="true")
    assert parse_settings(disabled, lanes=LANES).otlp_endpoint is None


def test_an_otlp_endpoint_that_is_not_a_url_is_an_error_naming_the_variable() -> None:
    got = problems(env(OTEL_EXPORTER_OTLP_ENDPOINT="collector:4318"))
    assert "OTEL_EXPORTER_OTLP_ENDPOINT" in got
    assert "http" in got["OTEL_EXPORTER_OTLP_ENDPOINT"]


# -- processes, event loop, contract refusal ------------------------------------------------
def test_worker_processes_auto_is_one_per_usable_cpu() -> None:
    s = parse_settings(env(WORKER_PROCESSES=" Auto "), lanes=LANES)
    assert s.processes == cpu_count() >= 1


def test_uvloop_asked_for_but_not_installed_is_named(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(sys.modules, "uvloop", None)  # what an absent module looks like
    found = problems(env(WORKER_EVENT_LOOP="uvloop"))
    assert list(found) == ["WORKER_EVENT_LOOP"]
    assert "pip install 'streamq[uvloop]'" in found["WORKER_EVENT_LOOP"]
    # auto falls back to asyncio's loop instead
    assert parse_settings(env(WORKER_EVENT_LOOP="auto"), lanes=LANES).event_loop == "auto"


def test_tenant_concurrency_variable_sets_the_cap_and_zero_removes_it() -> None:
    s = parse_settings(env(QUEUE_NOTES_TENANT_CONCURRENCY="3"), lanes=LANES)
    assert worker_overrides(s, app)["notes"] == {"tenant_concurrency": 3}
    s = parse_settings(env(QUEUE_NOTES_TENANT_CONCURRENCY="0"), lanes=LANES)
    assert worker_overrides(s, app)["notes"] == {"tenant_concurrency": None}
    assert "QUEUE_NOTES_TENANT_CONCURRENCY" in problems(env(QUEUE_NOTES_TENANT_CONCURRENCY="-1"))
