"""The guide pages cannot rot: their Python compiles, and the files of "Add a queue in seven
steps" import and run against a real Redis (and a real HTTP endpoint for its service)."""

from __future__ import annotations

import ast
import importlib
import importlib.util
import json
import re
import sys
import threading
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import pytest

from streamq import PermanentError, snapshot

ROOT = Path(__file__).resolve().parents[1]
DOCS = ROOT / "docs"
GUIDES = ("add-a-queue.md", "coming-from.md")
FENCE = re.compile(r"^```(\w*)\n(.*?)^```", re.M | re.S)
FILE_HEADER = re.compile(r"\A# ((?:myapp|tests)/[\w/]+\.py)\n")


def blocks(page: str, lang: str = "python") -> list[str]:
    return [body for kind, body in FENCE.findall((DOCS / page).read_text()) if kind == lang]


def page_files(page: str) -> dict[str, str]:
    """The blocks that open with a ``# myapp/...py`` comment: path -> source."""
    return {m.group(1): body for body in blocks(page) if (m := FILE_HEADER.match(body))}


@pytest.mark.parametrize("page", GUIDES)
def test_every_python_block_of_the_guides_compiles(page: str) -> None:
    found = blocks(page)
    if page == "add-a-queue.md":
        assert len(found) >= 8
    for i, body in enumerate(found):
        compile(body, f"{page}[{i}]", "exec", flags=ast.PyCF_ALLOW_TOP_LEVEL_AWAIT)


@pytest.fixture
def myapp(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[Path]:
    """The page's files written out as a package ``myapp`` (and its test module) on sys.path;
    forgotten again afterwards."""
    files = page_files("add-a-queue.md")
    assert {"myapp/contracts.py", "myapp/producer.py", "myapp/services.py", "myapp/worker.py",
            "tests/test_webhooks.py"} <= set(files)
    (tmp_path / "myapp").mkdir()
    (tmp_path / "tests").mkdir()
    (tmp_path / "myapp" / "__init__.py").write_text("")
    for path, body in files.items():
        (tmp_path / path).write_text(body)
    monkeypatch.syspath_prepend(str(tmp_path))
    importlib.invalidate_caches()
    yield tmp_path
    for name in [n for n in sys.modules if n == "myapp" or n.startswith("myapp.")]:
        del sys.modules[name]


def load_module(path: Path, name: str) -> Any:
    spec = importlib.util.spec_from_file_location(name, path)
    assert spec is not None
    assert spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


async def test_add_a_queue_page_runs_end_to_end_against_redis(
    myapp: Path, redis_url: str, prefix: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    # Step 7's test, as the page writes it: producer, dedup, processor, dead letter.
    page_test = load_module(myapp / "tests" / "test_webhooks.py", "add_a_queue_page_test")
    await page_test.test_webhook_is_delivered_once_and_a_refused_one_is_dead_lettered(
        redis_url=redis_url, prefix=prefix, monkeypatch=monkeypatch
    )


def test_add_a_queue_page_contract_routes_noisy_accounts_to_the_secondary_lane(
    myapp: Path,
) -> None:
    contracts = importlib.import_module("myapp.contracts")
    producer = importlib.import_module("myapp.producer")
    webhooks = contracts.Webhooks
    assert webhooks.shard_names() == ["webhooks", "webhooks-1", "webhooks-2", "webhooks-3"]
    assert webhooks.secondary.name == "webhooks-secondary"
    noisy = contracts.SendWebhook(account_id="acct-bulk-importer", event_id="e", url="u")
    quiet = contracts.SendWebhook(account_id="acct-1", event_id="e", url="u")
    assert producer.is_noisy(webhooks.send_webhook, noisy)
    assert not producer.is_noisy(webhooks.send_webhook, quiet)


class Endpoint(BaseHTTPRequestHandler):
    """/ok answers 204, /gone 410, /down 503; every request is recorded."""

    seen: list[tuple[str, str, dict[str, Any]]] = []

    def do_POST(self) -> None:
        body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
        self.seen.append((self.path, self.headers["Idempotency-Key"], body))
        code = {"/ok": 204, "/gone": 410, "/down": 503}[self.path]
        self.send_response(code)
        self.send_header("Content-Length", "0")
        self.end_headers()

    def log_message(self, format: str, *args: Any) -> None:
        pass


@pytest.fixture
def endpoint() -> Iterator[str]:
    Endpoint.seen = []
    server = ThreadingHTTPServer(("127.0.0.1", 0), Endpoint)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    yield f"http://127.0.0.1:{server.server_address[1]}"
    server.shutdown()
    server.server_close()


def test_add_a_queue_page_service_posts_and_sorts_failures(myapp: Path, endpoint: str) -> None:
    contracts = importlib.import_module("myapp.contracts")
    services = importlib.import_module("myapp.services")

    def hook(path: str) -> Any:
        return contracts.SendWebhook(account_id="a", event_id="e1", url=endpoint + path,
                                     body={"kind": "created"})

    services.deliver(hook("/ok"), idempotency_key="a:e1")
    assert Endpoint.seen == [("/ok", "a:e1", {"event_id": "e1", "kind": "created"})]
    with pytest.raises(PermanentError, match="410"):
        services.deliver(hook("/gone"), idempotency_key="a:e1")
    with pytest.raises(services.EndpointDown, match="503"):
        services.deliver(hook("/down"), idempotency_key="a:e1")


def test_add_a_queue_page_worker_settings_are_valid(myapp: Path) -> None:
    from worker.settings import load_settings, worker_overrides

    [env_block] = [b for b in blocks("add-a-queue.md", "") if "WORKER_APP=" in b]
    env = dict(line.split("=", 1) for line in env_block.splitlines() if "=" in line)
    settings, app = load_settings(env)
    assert set(settings.queues) == {"webhooks", "webhooks-secondary"}
    assert worker_overrides(settings, app)["webhooks-secondary"]["concurrency"] == 5


def test_add_a_queue_page_compat_test_passes_on_its_own_snapshot(
    myapp: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    contracts = importlib.import_module("myapp.contracts")
    (myapp / "contracts.snapshot.json").write_text(json.dumps(snapshot(contracts.CONTRACTS)))
    monkeypatch.chdir(myapp)
    [source] = [b for b in blocks("add-a-queue.md") if "def test_contracts_stay_compatible" in b]
    namespace: dict[str, Any] = {}
    exec(compile(source, "add-a-queue.md", "exec"), namespace)
    namespace["test_contracts_stay_compatible_with_the_released_snapshot"]()
