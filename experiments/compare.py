"""Run a set of `fedlm run` arms and tabulate them against the first (the reference).

    python experiments/compare.py experiments/archive/configs/async_comparison.toml

The TOML has ``base`` (a list of --set overrides shared by all arms), ``db``,
``out`` (a markdown file), optionally ``backend`` ("flower", the default, or
"inprocess") and ``[[arm]]`` entries with ``label`` and ``set``. Each arm is a
real `fedlm run`. The table gives final validation perplexity, virtual time,
idle fraction, the bytes workers uploaded, and the virtual time each arm
needed to first reach the reference arm's final perplexity.
"""

from __future__ import annotations

import argparse
import subprocess
import sys
import time
import tomllib
from pathlib import Path

from fedlm import store
from fedlm.sweep.report import time_to_reach, value_at


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("spec")
    ap.add_argument("--rerun", action="store_true",
                    help="run every arm again (default: reuse finished runs of the same label)")
    args = ap.parse_args()
    spec = tomllib.loads(Path(args.spec).read_text())
    db, out = spec["db"], Path(spec["out"])
    rows = []
    for arm in spec["arm"]:
        done = [r for r in (store.list_runs(db) if Path(db).exists() else [])
                if r["name"] == arm["label"] and r["status"] == "finished"]
        if done and not args.rerun:
            rows.append((arm, store.summarize(db, done[-1]["id"]), float("nan")))
            print(f"== {arm['label']}: reusing run {done[-1]['id']}", flush=True)
            continue
        cmd = [sys.executable, "-m", "fedlm", "run", "--quiet", "--db", db,
               "--backend", spec.get("backend", "flower")]
        for kv in [*spec.get("base", []), *arm["set"], f"name={arm['label']}"]:
            cmd += ["--set", kv]
        print(f"== {arm['label']}: {' '.join(cmd[3:])}", flush=True)
        t0 = time.time()
        proc = subprocess.run(cmd, capture_output=True, text=True)
        if proc.returncode != 0:
            print(proc.stdout[-2000:], proc.stderr[-2000:], file=sys.stderr)
            return 1
        run_id = max(r["id"] for r in store.list_runs(db))
        rows.append((arm, store.summarize(db, run_id), time.time() - t0))
        print(f"   run {run_id}: final ppl {rows[-1][1].final_perplexity:.3f}, "
              f"virtual {rows[-1][1].virtual_time:.0f} s, real {rows[-1][2]:.0f} s", flush=True)

    ref = rows[0][1]
    lines = [f"# {spec.get('title', 'Comparison')}", "", spec.get("description", "").strip(), "",
             f"Reference: **{rows[0][0]['label']}** (final perplexity "
             f"{ref.final_perplexity:.3f}). Run store: `{db}`.", "",
             "| arm | final ppl | best ppl | updates | local steps | virtual time (s) "
             "| reference's ppl at that virtual time | time to reference ppl (s) "
             "| idle fraction | uploaded (MB) | real time (s) |",
             "|---|---|---|---|---|---|---|---|---|---|---|"]
    for arm, s, real in rows:
        reach = time_to_reach(db, s.run_id, ref.final_perplexity)
        at = value_at(db, ref.run_id, s.virtual_time)
        lines.append(f"| {arm['label']} | {s.final_perplexity:.3f} | {s.best_perplexity:.3f} | "
                     f"{s.updates} | {s.local_steps} | {s.virtual_time:.0f} | "
                     f"{'-' if at is None else f'{at:.3f}'} | "
                     f"{'-' if reach is None else f'{reach:.0f}'} | "
                     f"{100 * s.idle_fraction:.1f}% | {uploaded(db, s.run_id) / 1e6:,.1f} | "
                     f"{s.wall_time:.0f} |")
    lines += ["", "Arms:", ""] + [f"- **{a['label']}**: `{' '.join(a['set'])}`" for a, _, _ in rows]
    lines += ["", f"Shared settings: `{' '.join(spec.get('base', []))}`", ""]
    if spec.get("discussion"):
        lines += ["## Reading", "", spec["discussion"].strip(), ""]
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text("\n".join(lines))
    print(out.read_text())
    return 0


def uploaded(db: str, run_id: int) -> float:
    """Bytes the workers' finished jobs sent up, as encoded on the wire."""
    return store.uploaded_bytes(db, run_id)


if __name__ == "__main__":
    sys.exit(main())
