"""How the dashboard is started: ``DASHBOARD_*`` in ``python -m worker`` (one process or a
supervised fleet) and ``streamq dashboard``; each mistake is refused, naming what is wrong."""

from __future__ import annotations

import socket
import uuid
from pathlib import Path
from typing import Any

import pytest

from streamq.cli import main as streamq_main
from tests.dashboard.support import TOKEN
from tests.entrypoint.helpers import Supervised, clean_env, http_get, run_worker, wait_for
from tests.support.redis_server import free_port
from worker.settings import SettingsError, parse_settings

BASE = {"WORKER_APP": "tests.dashboard.dash_app:app", "QUEUE_CONSUMER_PAY_IS_ENABLED": "true"}


def test_dashboard_variables_are_parsed_and_the_token_never_shown() -> None:
    settings = parse_settings({**BASE, "DASHBOARD_IS_ENABLED": "true", "DASHBOARD_PORT": "9123",
                               "DASHBOARD_TOKEN": TOKEN, "DASHBOARD_READ_ONLY": "yes"},
                              lanes=["pay"])
    assert (settings.dashboard_enabled, settings.dashboard_host, settings.dashboard_port,
            settings.dashboard_token, settings.dashboard_read_only) == (
        True, "127.0.0.1", 9123, TOKEN, True)
    assert TOKEN not in repr(settings)
    assert parse_settings(BASE, lanes=["pay"]).dashboard_enabled is False


def test_malformed_dashboard_variables_are_refused_naming_them() -> None:
    with pytest.raises(SettingsError) as caught:
        parse_settings({**BASE, "DASHBOARD_IS_ENABLED": "sure", "DASHBOARD_PORT": "99999",
                        "DASHBOARD_TOKEN": "short-secret"}, lanes=["pay"])
    assert caught.value.variables == ["DASHBOARD_IS_ENABLED", "DASHBOARD_PORT",
                                      "DASHBOARD_TOKEN"]
    assert "short-secret" not in str(caught.value)


def test_worker_exits_2_naming_dashboard_port_when_it_is_taken(
    redis_server: Any, tmp_path: Path
) -> None:
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        done = run_worker(clean_env(**BASE, REDIS_URL=redis_server.url,
                                    REDIS_PREFIX=f"t{uuid.uuid4().hex[:8]}",
                                    DASHBOARD_IS_ENABLED="true", DASHBOARD_PORT=str(port),
                                    LOG_FORMAT="json"))
    assert done.returncode == 2
    assert "DASHBOARD_PORT: cannot serve the dashboard" in done.stderr + done.stdout


def test_a_supervised_fleet_serves_one_dashboard_from_the_supervisor(
    redis_server: Any, tmp_path: Path
) -> None:
    port = free_port()
    fleet = Supervised(clean_env(**BASE, REDIS_URL=redis_server.url, WORKER_PROCESSES="2",
                                 REDIS_PREFIX=f"t{uuid.uuid4().hex[:8]}", LOG_FORMAT="json",
                                 DASHBOARD_IS_ENABLED="true", DASHBOARD_PORT=str(port)),
                       tmp_path / "fleet.log")
    try:
        fleet.wait_all_consuming()
        body = wait_for(lambda: _api(port), 30, "the supervisor's dashboard")
        assert '"queue":"pay"' in body
        assert any(r.get("message") == "serving the dashboard" and r.get("port") == port
                   for r in fleet.events())
        assert fleet.stop() == 0
    finally:
        fleet.kill()


def _api(port: int) -> str | None:
    try:
        status, body = http_get(port, "/api/queues")
    except OSError:  # not listening yet
        return None
    return body if status == 200 else None


def test_streamq_dashboard_refuses_bad_contracts_and_a_taken_port(
    redis_url: str, capsys: pytest.CaptureFixture[str]
) -> None:
    assert streamq_main(["dashboard", "--contracts", "no_such_module:X",
                         "--redis-url", redis_url]) == 2
    assert "--contracts: cannot import 'no_such_module'" in capsys.readouterr().err
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        assert streamq_main(["dashboard", "--contracts", "tests.dashboard.dash_app:app",
                             "--redis-url", redis_url, "--port", str(port)]) == 2
    assert f"cannot serve on 127.0.0.1:{port}" in capsys.readouterr().err
    assert streamq_main(["dashboard", "--contracts", "tests.dashboard.dash_app:app",
                         "--redis-url", redis_url, "--token", "short"]) == 2
    assert "at least 16 characters" in capsys.readouterr().err


def test_streamq_dashboard_exits_1_when_redis_is_unreachable(
    capsys: pytest.CaptureFixture[str]
) -> None:
    url = f"redis://127.0.0.1:{free_port()}/0"
    assert streamq_main(["dashboard", "--contracts", "tests.dashboard.dash_app:app",
                         "--redis-url", url]) == 1
    assert "cannot reach Redis" in capsys.readouterr().err


def test_streamq_dashboard_takes_the_contracts_from_the_environment_like_streamq(
    capsys: pytest.CaptureFixture[str]
) -> None:
    url = f"redis://127.0.0.1:{free_port()}/0"  # nothing there: loading comes first
    env = {"REDIS_URL": url, "STREAMQ_CONTRACTS": "no_such_module:CONTRACTS"}
    assert streamq_main(["dashboard"], env) == 2
    assert "STREAMQ_CONTRACTS: cannot import 'no_such_module'" in capsys.readouterr().err
    assert streamq_main(["dashboard"], {"REDIS_URL": url}) == 2
    assert "no contracts: pass --contracts" in capsys.readouterr().err
    env = {"REDIS_URL": url, "WORKER_APP": "tests.dashboard.dash_app:app"}
    assert streamq_main(["dashboard"], env) == 1  # the app loaded; Redis is not there
    assert "cannot reach Redis" in capsys.readouterr().err
