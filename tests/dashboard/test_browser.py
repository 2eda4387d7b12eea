"""The dashboard in a real browser (headless Chromium driven by Selenium) against a real
``python -m worker`` serving it (``DASHBOARD_IS_ENABLED``) and a real Redis.

One browser for the module. With ``DASHBOARD_SCREENSHOTS=<dir>`` the pages are also saved
there as PNG (``docs/img`` holds the ones the docs show).
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
import time
import urllib.error
import urllib.parse
import urllib.request
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
import redis

from streamq import SyncQueue
from streamq.keys import QueueKeys, RunnerKeys
from streamq.testing import free_port
from tests.dashboard.dash_app import Card, Charge, Pay
from tests.dashboard.support import TOKEN
from tests.entrypoint.helpers import ROOT, WorkerProcess, clean_env, http_get, wait_for

CHROMIUM = shutil.which("chromium") or shutil.which("chromium-browser")
CHROMEDRIVER = shutil.which("chromedriver")
if CHROMIUM is None or CHROMEDRIVER is None:
    pytest.skip(
        "browser tests need the system packages chromium and chromium-driver "
        "(scripts/test installs them with apt-get where it can)",
        allow_module_level=True,
    )

from selenium import webdriver  # noqa: E402
from selenium.common.exceptions import StaleElementReferenceException  # noqa: E402
from selenium.webdriver.chrome.service import Service  # noqa: E402
from selenium.webdriver.common.by import By  # noqa: E402
from selenium.webdriver.remote.webdriver import WebDriver  # noqa: E402
from selenium.webdriver.support.ui import WebDriverWait  # noqa: E402

GROUP = "streamq"
WAIT_S = 30.0  # generous: both cores may be busy


@pytest.fixture(scope="module")
def mprefix() -> str:
    return f"t{uuid.uuid4().hex[:10]}"


@pytest.fixture(scope="module")
def r(redis_server: Any) -> Iterator[redis.Redis]:
    client = redis.Redis(port=redis_server.port)
    yield client
    client.close()


@pytest.fixture(scope="module")
def worker(redis_server: Any, mprefix: str, tmp_path_factory: pytest.TempPathFactory,
           ) -> Iterator[str]:
    """``python -m worker`` consuming ``pay`` and serving the dashboard; yields its base URL."""
    port = free_port()
    env = clean_env(
        WORKER_APP="tests.dashboard.dash_app:app",
        REDIS_URL=redis_server.url,
        REDIS_PREFIX=mprefix,
        QUEUE_CONSUMER_PAY_IS_ENABLED="true",
        DASHBOARD_IS_ENABLED="true",
        DASHBOARD_PORT=str(port),
        DASHBOARD_TOKEN=TOKEN,
        LOG_FORMAT="json",
    )
    proc = WorkerProcess(env, tmp_path_factory.mktemp("worker") / "worker.log")
    try:
        proc.wait_consuming(WAIT_S)
        wait_for(lambda: http_get(port, "/api/queues")[0] == 200, WAIT_S, "the dashboard")
        yield f"http://127.0.0.1:{port}"
    finally:
        proc.terminate()
        proc.kill()


@pytest.fixture(scope="module")
def browser() -> Iterator[WebDriver]:
    options = webdriver.ChromeOptions()
    options.binary_location = str(CHROMIUM)
    for arg in ("--headless=new", "--no-sandbox", "--disable-dev-shm-usage", "--disable-gpu",
                "--window-size=1280,860"):
        options.add_argument(arg)
    driver = webdriver.Chrome(service=Service(str(CHROMEDRIVER)), options=options)
    driver.set_page_load_timeout(WAIT_S)
    yield driver
    driver.quit()


def shot(driver: WebDriver, name: str) -> None:
    """Save the page as ``<DASHBOARD_SCREENSHOTS>/<name>.png`` when that is set."""
    folder = os.environ.get("DASHBOARD_SCREENSHOTS")
    if folder:
        Path(folder).mkdir(parents=True, exist_ok=True)
        driver.save_screenshot(str(Path(folder) / f"{name}.png"))


def until(driver: WebDriver, condition: Callable[[WebDriver], Any], what: str) -> Any:
    # Live refresh replaces parts of the page: an element found a moment ago may be gone.
    wait = WebDriverWait(driver, WAIT_S, ignored_exceptions=[StaleElementReferenceException])
    return wait.until(condition, f"timed out waiting for {what}")


def row(driver: WebDriver, attr: str, value: str) -> dict[str, str]:
    """The cells of one table row, read in one script: live refresh may replace the row
    between two WebDriver calls."""
    script = """
        const tr = document.querySelector(`tr[${arguments[0]}="${arguments[1]}"]`);
        if (!tr) { return null; }
        const out = {};
        tr.querySelectorAll("td[data-field]").forEach(
            td => { out[td.getAttribute("data-field")] = td.innerText.trim(); });
        return out;
    """

    def read(d: WebDriver) -> list[dict[str, str]] | None:
        cells = d.execute_script(script, attr, value)
        return None if cells is None else [cells]

    found: list[dict[str, str]] = until(driver, read, f"the row {attr}={value}")
    return found[0]


def text_of(driver: WebDriver, element_id: str) -> str:
    return until(driver, lambda d: d.find_element(By.ID, element_id).text,  # type: ignore[no-any-return]
                 f"#{element_id}")


def type_token(driver: WebDriver, token: str) -> None:
    field = driver.find_element(By.NAME, "token")
    field.clear()
    field.send_keys(token)


def keys(prefix: str, lane: str = "pay", shards: int = 2) -> QueueKeys:
    return QueueKeys(prefix, lane, shards)


def redis_depth(r: redis.Redis, prefix: str, lane: str, shards: int) -> dict[str, int]:
    """Depth computed straight from Redis: XLEN minus XPENDING, ZCARD, XLEN dead."""
    out = {"ready": 0, "in_flight": 0, "delayed": 0, "dead": 0}
    for s in keys(prefix, lane, shards).shards:
        try:
            pending = int(r.xpending(s.stream, GROUP)["pending"])
        except redis.ResponseError:
            pending = 0
        out["ready"] += int(r.xlen(s.stream)) - pending
        out["in_flight"] += pending
        out["delayed"] += int(r.zcard(s.delayed))
        out["dead"] += int(r.xlen(s.dead))
    return out


# -- tests -------------------------------------------------------------------------------------


def test_pages_render_and_their_figures_match_redis(
    worker: str, browser: WebDriver, r: redis.Redis, mprefix: str
) -> None:
    q = SyncQueue(Pay, r, prefix=mprefix)
    _enqueue_secondary(r, mprefix, 3)  # no worker consumes the secondary lane: they stay ready
    for n in range(2):
        q.add(Pay.charge, Charge(order=f"later-{n}"), delay=3600)
    lease = RunnerKeys(mprefix, "reconciler").lease
    wait_for(lambda: r.hget(lease, "holder"), WAIT_S, "the runner's lease")

    browser.get(worker + "/")
    shown = {lane: row(browser, "data-queue", lane) for lane in ("pay", "pay-secondary")}
    assert {k: int(shown["pay-secondary"][k]) for k in ("ready", "in_flight", "delayed", "dead")
            } == redis_depth(r, mprefix, "pay-secondary", 1) == {
                "ready": 3, "in_flight": 0, "delayed": 0, "dead": 0}
    assert {k: int(shown["pay"][k]) for k in ("ready", "in_flight", "delayed", "dead")
            } == redis_depth(r, mprefix, "pay", 2)
    assert shown["pay"]["delayed"] == "2"
    assert browser.find_element(By.ID, "mode").text == "actions need the token"
    shot(browser, "overview")

    browser.find_element(By.LINK_TEXT, "pay").click()
    until(browser, lambda d: d.find_elements(By.ID, "consumers"), "the queue page")
    consumers = set(r.hkeys(keys(mprefix).workers))
    assert consumers, "the worker records a heartbeat"
    for name in consumers:
        assert row(browser, "data-consumer", name.decode())["pending"] == "0"
    assert browser.find_elements(By.ID, "pause-form")
    shot(browser, "queue")

    browser.find_element(By.LINK_TEXT, "Schedules & runners").click()
    until(browser, lambda d: d.find_elements(By.ID, "runners"), "the schedules page")
    assert row(browser, "data-runner", "reconciler")["holder"] == r.hget(lease, "holder").decode()
    assert row(browser, "data-schedule", "nightly")["state"] == "active"
    shot(browser, "schedules")


def test_a_dead_letter_is_shown_redacted_and_retried_through_the_browser(
    worker: str, browser: WebDriver, r: redis.Redis, mprefix: str
) -> None:
    q = SyncQueue(Pay, r, prefix=mprefix)
    q.add(Pay.charge, Charge(order="o-1", kind="heal", amount_cents=4200,
                             api_key="sk_live_SECRET_key", card=Card(number="4242SECRET4242",
                                                                     holder="Ada")),
          job_id="order-1")
    dead = [s.dead for s in keys(mprefix).shards]
    wait_for(lambda: sum(int(r.xlen(k)) for k in dead) == 1, WAIT_S, "the job to die")

    browser.get(worker + "/queues/pay/dead")
    assert browser.find_elements(By.CSS_SELECTOR, f'tr[data-ref="{_ref(r, mprefix)}"]')
    shot(browser, "dead-letters")
    browser.find_element(By.CSS_SELECTOR, 'tr[data-ref] td a').click()
    payload = until(browser, lambda d: d.find_element(By.ID, "payload"), "the dead letter").text
    assert '"api_key": "***"' in payload
    assert '"number": "***"' in payload
    assert '"holder": "Ada"' in payload
    assert "SECRET" not in browser.page_source
    shot(browser, "dead-letter")

    search = browser.find_element(By.CSS_SELECTOR, "form.lookup input[name=id]")
    search.send_keys("order-1")
    search.submit()
    state = until(browser, lambda d: d.find_element(By.ID, "job-state"), "the lookup").text
    assert state == "Job order-1 is dead: 1 dead letter(s)."
    browser.find_element(By.CSS_SELECTOR, "#job-dead-letters a").click()

    r.set(f"{mprefix}:healed", "1")  # the card processor is back: a retry will succeed
    browser.find_element(By.ID, "retry-one").click()
    until(browser, lambda d: d.find_elements(By.ID, "confirm-form"), "the confirmation page")
    assert "Retry 1 dead letter(s) of pay?" in browser.page_source
    type_token(browser, TOKEN)
    shot(browser, "confirm-retry")
    browser.find_element(By.ID, "confirm-button").click()
    notice = until(browser, lambda d: d.find_element(By.ID, "notice"), "the notice").text
    assert notice == "Re-enqueued 1 job(s) of pay from its dead letters."
    wait_for(lambda: r.sismember(f"{mprefix}:done", "order-1"), WAIT_S, "the retried job to run")
    assert sum(int(r.xlen(k)) for k in dead) == 0
    browser.get(worker + "/jobs?id=order-1")
    assert text_of(browser, "job-state").startswith(
        "Not found: no job order-1 in the tracked jobs and the dead letters of 2 queue(s).")


def test_pause_and_resume_through_the_browser(
    worker: str, browser: WebDriver, r: redis.Redis, mprefix: str
) -> None:
    meta = keys(mprefix).meta
    browser.get(worker + "/queues/pay")
    type_token(browser, TOKEN)
    browser.find_element(By.ID, "pause-button").click()
    until(browser, lambda d: d.find_elements(By.ID, "notice"), "the pause notice")
    assert r.hget(meta, "paused") == b"1"
    assert text_of(browser, "paused-badge") == "paused"

    # The page remembered the token for this tab: resume needs no typing.
    assert browser.find_element(By.NAME, "token").get_attribute("value") == TOKEN
    browser.find_element(By.ID, "resume-button").click()
    until(browser, lambda d: "Resumed pay." in d.find_element(By.ID, "notice").text, "resume")
    assert r.hget(meta, "paused") is None
    until(browser, lambda d: not d.find_elements(By.ID, "paused-badge"), "the badge to go")


def test_a_wrong_token_is_refused_and_changes_nothing(
    worker: str, browser: WebDriver, r: redis.Redis, mprefix: str
) -> None:
    browser.get(worker + "/queues/pay")
    type_token(browser, "not-the-token-at-all")
    browser.find_element(By.ID, "pause-button").click()
    error = until(browser, lambda d: d.find_element(By.ID, "error"), "the refusal").text
    assert error == "wrong dashboard token (field 'token')"
    assert r.hget(keys(mprefix).meta, "paused") is None


def test_a_read_only_dashboard_shows_no_action_refuses_posts_and_refreshes_live(
    redis_server: Any, browser: WebDriver, r: redis.Redis, mprefix: str, tmp_path: Path
) -> None:
    log = tmp_path / "dashboard.log"
    with open(log, "wb") as out:
        proc = subprocess.Popen(
            [sys.executable, "-m", "streamq", "dashboard", "--contracts",
             "tests.dashboard.dash_app:app", "--redis-url", redis_server.url, "--prefix",
             mprefix, "--port", "0", "--read-only", "--refresh", "1"],
            cwd=ROOT, stdout=out, stderr=subprocess.STDOUT,
            env={**clean_env(), "STREAMQ_DASHBOARD_TOKEN": TOKEN},
        )
    try:
        m = wait_for(lambda: re.search(r"http://127\.0\.0\.1:(\d+)/ \(read-only\)",
                                       log.read_text()), WAIT_S, "the dashboard to serve")
        base = f"http://127.0.0.1:{m.group(1)}"
        browser.get(base + "/queues/pay")
        assert browser.find_element(By.ID, "mode").text == "read-only"
        assert not browser.find_elements(By.ID, "pause-form")
        browser.get(base + "/queues/pay/dead")
        assert not browser.find_elements(By.PARTIAL_LINK_TEXT, "Retry")

        status, body = _post(base + "/queues/pay/pause", {"token": TOKEN})
        assert status == 403
        assert "read-only" in body
        assert r.hget(keys(mprefix).meta, "paused") is None

        browser.get(base + "/")
        before = int(row(browser, "data-queue", "pay-secondary")["ready"])
        _enqueue_secondary(r, mprefix, 2)
        until(browser, lambda d: int(row(d, "data-queue", "pay-secondary")["ready"])
              == before + 2, "the figures to refresh without a reload")
    finally:
        proc.terminate()
        proc.wait(WAIT_S)


# -- helpers -----------------------------------------------------------------------------------


def _enqueue_secondary(r: redis.Redis, prefix: str, n: int) -> None:
    """Jobs on the secondary lane, which no worker of this module consumes."""
    q = SyncQueue(Pay, r, prefix=prefix, secondary=True)
    for i in range(n):
        q.add(Pay.charge, Charge(order=f"s-{time.monotonic_ns()}-{i}"))


def _ref(r: redis.Redis, prefix: str) -> str:
    for s in keys(prefix).shards:
        newest = r.xrevrange(s.dead, count=1)
        if newest:
            return f"{s.name}/{newest[0][0].decode()}"
    raise AssertionError("no dead letter")


def _post(url: str, form: dict[str, str]) -> tuple[int, str]:
    data = urllib.parse.urlencode(form).encode()
    try:
        with urllib.request.urlopen(urllib.request.Request(url, data=data), timeout=WAIT_S) as rp:
            return rp.status, rp.read().decode()
    except urllib.error.HTTPError as exc:
        return exc.code, exc.read().decode()
