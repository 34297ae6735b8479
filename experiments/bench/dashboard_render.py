"""How fast the dashboard renders a big run: 1k, 10k and 100k intervals.

    python experiments/bench/dashboard_render.py
    python experiments/bench/dashboard_render.py --smoke   # 1k intervals only, nothing written

Writes synthetic runs with fedlm's own store (16 workers, intervals of every
kind, 50 evaluations), then measures (a) one full script run in Streamlit's
AppTest (server side: queries + chart specs) and (b) a real headless Chromium
loading the page until every visible chart is drawn (five: the perplexity
tab in view, the timeline and the three per-worker charts). Prints a table and writes
experiments/results/dashboard_render.json.
"""

from __future__ import annotations

import argparse
import json
import os
import socket
import subprocess
import sys
import tempfile
import time
import urllib.request
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))

from fedlm.config import Config  # noqa: E402
from fedlm.store import IntervalKind, RunWriter  # noqa: E402

KINDS = [IntervalKind.DOWNLOAD, IntervalKind.COMPUTE, IntervalKind.UPLOAD, IntervalKind.IDLE]


def make_db(path: Path, n: int) -> None:
    w = RunWriter(path, name=f"{n} intervals", strategy="async-sgd", local_steps="fixed",
                  profile="very", model="tiny", workers=16, seed=0, clock="virtual",
                  config_json=Config().to_json())
    w.add_workers({"worker": k, "node_id": None, "step_time": 1.0 + k, "jitter": 0.0,
                   "region": "local", "latency": 0.0, "down_bw": 1e9, "up_bw": 1e9,
                   "shard_sequences": 10} for k in range(16))
    w.add_intervals((i % 16, KINDS[i % 4], float(i), i + 0.9, i // 64, i) for i in range(n))
    for v in range(0, 500, 10):
        w.add_metric(version=v, virtual_time=float(v), wall_time=0.0, tokens=v, jobs=v,
                     loss=5.0 / (1 + v / 100), perplexity=2.0 ** (5.0 / (1 + v / 100)),
                     bits_per_byte=1.0)
    w.finish(status="finished", virtual_time=float(n), updates=500, final_hash="x")
    w.close()


def apptest_seconds(db: Path) -> float:
    from streamlit.testing.v1 import AppTest

    os.environ["FEDLM_DB"] = str(db)
    at = AppTest.from_file(str(ROOT / "dashboard" / "app.py"), default_timeout=120)
    t0 = time.perf_counter()
    at.run()
    assert not at.exception, at.exception
    return time.perf_counter() - t0


def browser_seconds(db: Path) -> float:
    from playwright.sync_api import sync_playwright

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    proc = subprocess.Popen([sys.executable, "-m", "streamlit", "run",
                             str(ROOT / "dashboard" / "app.py"), "--server.headless=true",
                             f"--server.port={port}", "--server.address=127.0.0.1",
                             "--browser.gatherUsageStats=false", "--", "--db", str(db)],
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        for _ in range(300):
            try:
                urllib.request.urlopen(f"http://127.0.0.1:{port}/_stcore/health", timeout=1)
                break
            except OSError:
                time.sleep(0.2)
        with sync_playwright() as p:
            b = p.chromium.launch(executable_path="/usr/bin/chromium", args=[
                "--headless", "--no-sandbox", "--disable-gpu", "--disable-background-networking",
                "--disable-component-update", "--disable-sync", "--no-first-run"])
            page = b.new_page(viewport={"width": 1500, "height": 2400})
            t0 = time.perf_counter()
            page.goto(f"http://127.0.0.1:{port}/", timeout=120_000)
            page.wait_for_function("document.querySelectorAll("
                                   "'[data-testid=\"stVegaLiteChart\"] canvas, "
                                   "[data-testid=\"stVegaLiteChart\"] svg').length >= 5",
                                   timeout=120_000)
            seconds = time.perf_counter() - t0
            b.close()
        return seconds
    finally:
        proc.terminate()
        proc.wait(timeout=15)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--smoke", action="store_true", help="the test suite's check: 1k "
                    "intervals only (AppTest and Chromium), nothing written")
    args = ap.parse_args()
    rows = []
    with tempfile.TemporaryDirectory() as tmp:
        for n in ((1_000,) if args.smoke else (1_000, 10_000, 100_000)):
            db = Path(tmp) / f"r{n}.db"
            make_db(db, n)
            rows.append({"intervals": n, "apptest_s": round(apptest_seconds(db), 3),
                         "browser_s": round(browser_seconds(db), 3)})
            print(rows[-1], flush=True)
    print(f"\n{'intervals':>10} {'AppTest run (s)':>16} {'Chromium to charts (s)':>23}")
    for r in rows:
        print(f"{r['intervals']:>10,} {r['apptest_s']:>16.2f} {r['browser_s']:>23.2f}")
    text = json.dumps({"machine": f"{os.cpu_count()} cores", "rows": rows}, indent=2)
    if args.smoke:
        print(f"smoke: nothing written ({len(text)} bytes of JSON)")
        return
    out = ROOT / "experiments" / "results" / "dashboard_render.json"
    out.write_text(text)
    print(f"wrote {out}")


if __name__ == "__main__":
    main()
