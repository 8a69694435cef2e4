"""The live plan page, ``GET /ui``, in a real headless Chromium (Debian's ``chromium``, driven by
Playwright with ``executable_path``): it asks for the API key the service requires, shows the live
plan's levels, workers, PASM and leader, and follows the plan when it changes (a second worker
joins a Redis deployment). The page itself loads nothing from elsewhere (an air-gapped cluster).
"""

from __future__ import annotations

import re
import shutil
import time

import pytest

httpx = pytest.importorskip("httpx")

CHROMIUM = "/usr/bin/chromium"
KEY = "ui-test-key"


def test_the_page_is_self_contained(live_service):
    from tests.fixtures_service import service_settings

    server = live_service(service_settings(stand_in_scale=0.0005))
    r = httpx.get(f"{server.url}/ui")
    assert r.status_code == 200 and r.headers["content-type"].startswith("text/html")
    assert "default-src 'self'" in r.headers["content-security-policy"]
    page = r.text
    assert not re.search(r"""(src|href)\s*=\s*["']?(https?:)?//""", page, re.I), "loads something from elsewhere"
    assert not re.search(r"""\bimport\s*\(|<script[^>]+src=|<link[^>]+href=""", page, re.I)
    fetched = set(re.findall(r"""(?:getJson|fetch)\("([^"]+)\"""", page))
    assert fetched == {"/v1/plan", "/v1/cluster", "/metrics"}


def _wait(pred, timeout: float = 30.0, interval: float = 0.1):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        v = pred()
        if v:
            return v
        time.sleep(interval)
    raise AssertionError("condition not met in time")


@pytest.fixture
def browser():
    sync_api = pytest.importorskip("playwright.sync_api", reason="playwright is not installed (the dev extra)")
    if shutil.which(CHROMIUM) is None:
        pytest.skip("Debian's chromium is not installed (apt-get install chromium)")
    with sync_api.sync_playwright() as p:
        b = p.chromium.launch(executable_path=CHROMIUM, args=["--no-sandbox", "--disable-gpu"])
        try:
            yield b
        finally:
            b.close()


@pytest.mark.integration
def test_the_page_shows_the_live_plan_and_follows_it(redis_server, live_service, worker_procs, browser, tmp_path):
    from tests.fixtures_service import service_settings

    settings = service_settings(redis_url=redis_server.url, workers=0, api_keys=[KEY])
    server = live_service(settings, ready=False)
    auth = {"Authorization": f"Bearer {KEY}"}

    def plan_with(n_workers: int):
        r = httpx.get(f"{server.url}/v1/plan", headers=auth, timeout=5)
        if r.status_code != 200:
            return None
        plan = r.json()
        return plan if sum(plan["counts"].values()) == n_workers else None

    worker_procs(redis_server.url, "w1")
    plan = _wait(lambda: plan_with(1), timeout=90)

    page = browser.new_page()
    page.goto(f"{server.url}/ui?refresh=0.5")
    page.wait_for_selector("#auth.shown", timeout=15000)  # 401: the page asks for the key
    page.fill("#key", KEY)
    page.click("#auth button")
    # (polled from here: the page's Content-Security-Policy forbids the eval wait_for_function uses)
    _wait(lambda: page.eval_on_selector_all("#levels tbody tr", "rs => rs.length") > 0)

    rows = page.eval_on_selector_all("#levels tbody tr", "rs => rs.map(r => r.dataset.level)")
    assert rows == plan["levels"]
    assert page.eval_on_selector_all("#pasm td.cell", "cs => cs.length") == len(plan["levels"]) ** 2
    shown = page.eval_on_selector_all("#levels tbody tr", "rs => rs.map(r => +r.querySelector('.workers').textContent)")
    assert sum(shown) == 1
    version = int(page.inner_text("#plan-version"))
    assert version >= plan["version"]
    cluster = httpx.get(f"{server.url}/v1/cluster", headers=auth, timeout=5).json()
    assert page.inner_text("#leader") == cluster["leader"]["router"]
    assert page.inner_text("#plan-policy") == plan["policy"]

    # the plan changes: a second worker joins and the next plan assigns it
    worker_procs(redis_server.url, "w2")
    changed = _wait(lambda: plan_with(2), timeout=90)
    _wait(lambda: sum(page.eval_on_selector_all("#levels .workers", "cs => cs.map(c => +c.textContent)")) == 2)
    assert int(page.inner_text("#plan-version")) >= changed["version"] > version

    def page_matches_api() -> bool:
        shown = dict(
            zip(
                page.eval_on_selector_all("#levels tbody tr", "rs => rs.map(r => r.dataset.level)"),
                page.eval_on_selector_all("#levels .workers", "cs => cs.map(c => +c.textContent)"),
                strict=True,
            )
        )
        latest = httpx.get(f"{server.url}/v1/plan", headers=auth, timeout=5).json()
        return shown == latest["counts"] and int(page.inner_text("#plan-version")) == latest["version"]

    _wait(page_matches_api, timeout=15)  # the page shows what the API says (a poll behind at most)
    assert "error" not in page.get_attribute("#status", "class")
    page.screenshot(path=str(tmp_path / "ui.png"), full_page=True)
