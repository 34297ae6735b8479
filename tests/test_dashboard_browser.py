"""The dashboard in a real headless Chromium, served by `streamlit run` on loopback."""

import os
import shutil
import socket
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

import pytest

from tests.conftest import tiny_config
from tests.support import run_engine

ROOT = Path(__file__).resolve().parent.parent
CHROMIUM = "/usr/bin/chromium"
SCREENSHOT_DIR = Path(os.environ.get("FEDLM_ARTIFACTS", ROOT / "runs" / "artifacts"))


def require_browser() -> None:
    """Skip without Debian's chromium and playwright (fail in CI, where make installs them)."""
    missing = [what for what, ok in [("Debian chromium", Path(CHROMIUM).exists()),
                                     ("playwright", shutil.which("playwright") is not None)]
               if not ok]
    if missing:
        if os.environ.get("CI"):
            pytest.fail(f"missing in CI: {', '.join(missing)} (make install should add them)")
        pytest.skip(f"missing: {', '.join(missing)}")


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.fixture
def served_dashboard(tmp_path):
    require_browser()
    db = tmp_path / "runs.db"
    hetero = "fleet.step_times=[1.0, 2.0, 4.0]"
    run_engine(tiny_config("strategy=diloco", hetero, "name=sync-diloco"), db)
    run_engine(tiny_config("strategy=delayed-nesterov", hetero, "updates=12", "eval.every=4",
                           "name=async-dn"), db)
    port = _free_port()
    proc = subprocess.Popen(
        [sys.executable, "-m", "streamlit", "run", str(ROOT / "dashboard" / "app.py"),
         "--server.headless=true", f"--server.port={port}", "--server.address=127.0.0.1",
         "--browser.gatherUsageStats=false", "--", "--db", str(db)],
        stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, cwd=tmp_path)
    try:
        deadline = time.monotonic() + 60
        while True:
            try:
                urllib.request.urlopen(f"http://127.0.0.1:{port}/_stcore/health", timeout=2)
                break
            except OSError:
                if time.monotonic() > deadline or proc.poll() is not None:
                    raise RuntimeError("streamlit did not become healthy within 60 s")
                time.sleep(0.2)
        yield f"http://127.0.0.1:{port}/"
    finally:
        proc.terminate()
        try:
            proc.wait(timeout=15)
        except subprocess.TimeoutExpired:
            proc.kill()


def test_dashboard_renders_in_chromium(served_dashboard):
    from playwright.sync_api import sync_playwright

    with sync_playwright() as p:
        browser = p.chromium.launch(executable_path=CHROMIUM, args=[
            "--headless", "--no-sandbox", "--disable-gpu", "--disable-background-networking",
            "--disable-component-update", "--disable-sync", "--no-first-run"])
        try:
            page = browser.new_page(viewport={"width": 1500, "height": 2400})
            t0 = time.perf_counter()
            page.goto(served_dashboard, timeout=60_000)
            page.wait_for_function(
                "document.querySelectorAll('[data-testid=\"stVegaLiteChart\"]').length >= 6",
                timeout=60_000)
            print(f"\ncharts visible after {time.perf_counter() - t0:.2f} s")
            page.wait_for_timeout(1000)  # let the last charts paint before the screenshot
            text = page.inner_text("body")
            assert "#2 async-dn" in text
            for w in range(3):
                assert f"worker {w}" in text  # the per-worker table
            assert "latest perplexity" in text and "idle fraction" in text
            ppl = page.locator('[data-testid="stMetric"]').filter(has_text="latest perplexity")
            value = float(ppl.locator('[data-testid="stMetricValue"]').inner_text())
            assert 1.0 < value < 300.0
            SCREENSHOT_DIR.mkdir(parents=True, exist_ok=True)
            shot = SCREENSHOT_DIR / "dashboard.png"
            page.screenshot(path=str(shot), full_page=True)
            assert shot.stat().st_size > 50_000
        finally:
            browser.close()
