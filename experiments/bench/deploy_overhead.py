"""What a job costs in Flower deployment beyond its compute: the old path against the new.

    python experiments/bench/deploy_overhead.py [--models small,tiny] [--workers 4]
        [--jobs 6] [--rounds 1] [--variants old,new,warm-filedb,warm]
        [--echo-messages 0] [--out PATH]
    python experiments/bench/deploy_overhead.py --smoke   # check: tiny, warm, JSON to /dev/null

Runs ``fedlm deploy local``'s LocalDeployment (SuperLink + one SuperNode per
worker on loopback, TLS and SuperNode authentication on) with async SGD and
short jobs, for each model in these variants, interleaved ``--rounds`` times
(ABC CBA) so that they see the same machine load on average:

* ``old``: every message in a fresh ClientApp process (Flower's SuperExec) that
  imports torch and fedlm, plain ``flower-supernode`` (3 s sleep after an empty
  poll); the SuperExec task poll 0.2 s, telemetry off;
* ``new``: ``old`` with ``python -m fedlm.deploy.supernode`` (the SuperNode's
  waits capped), still a ClientApp process per message (until 2026-11 this
  variant and ``worker-process`` handed each job to a long-lived worker process
  per node, ``fedlm.deploy.node_worker``, since removed: the warm executor runs
  the job itself);
* ``warm-filedb``: ``new`` with the warm ClientApp executor
  (``fedlm.deploy.warm_executor``: no process per message, the job run in that
  process with torch, model and states kept warm; object pulls retried after
  20 ms, the ``pull-backoff`` patch of ``fedlm.flower.patches``);
* ``warm``: what ``fedlm deploy local`` does now: ``warm-filedb`` with the
  SuperLink's state and objects in memory (Flower's default) instead of a
  SQLite file (the four variants above keep the file, as before);
* also ``flower-defaults`` (old, task poll 1 s, telemetry on) and
  ``warm-insecure`` (warm without TLS and authentication).

Messages of every variant carry their tensors packed in one array
(``fedlm.flower.messages.pack``): that is the message format, not a setting.

Per job the run store gives the wall latency ``t_done - t_dispatch`` and the
job's own ``compute_seconds``; overhead = latency - compute. The SuperNode
logs, read with a timestamp as each line appears (10 ms), split the latency
into phases:

* ``poll_wait``: dispatch (the ServerApp pushing the message and its objects
  to the SuperLink) until the SuperNode pulls it;
* ``pull``: the SuperNode pulling the message's objects from the SuperLink;
* ``launch``: until the new ``flwr-clientapp`` process logs its start: the
  SuperExec's task poll, process start, importing flwr (warm executor: until
  it starts the task, 0 when it claimed it before the SuperNode had the
  objects);
* ``clientapp``: the ClientApp: pulling the message from the SuperNode, the
  job (a process per message: importing fedlm and torch, building the model
  first; warm: the job alone), pushing the reply to the SuperNode;
* ``push``: the SuperNode pushing the reply's objects to the SuperLink;
* ``server_notice``: until the ServerApp has pulled the reply and applied it;
* warm executor only, inside ``pull`` + ``clientapp``, its own timings:
  ``exec_pull`` (pull_task_input, overlapping the SuperNode's pull),
  ``exec_app`` (the ClientApp, the job included), ``exec_push`` (the reply to
  the SuperNode), ``exec_status``.

The first job of each worker (run start: FAB download, caches, the worker
process's start) is reported apart. Also measured: the idle CPU of a
SuperNode (with its SuperExec), process start + import times, and optionally
an echo app (``deploy_echo.py``). Writes experiments/results/deploy_overhead.json.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import shutil
import sqlite3
import statistics
import subprocess
import sys
import tempfile
import time
from importlib.metadata import version
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))

from fedlm import config_load  # noqa: E402
from fedlm.deploy.local import FAST_TASK_POLL, TASK_POLL_ENV, LocalDeployment  # noqa: E402
from fedlm.deploy.warm_executor import DEFAULT_POLL_S  # noqa: E402
from experiments.bench.deploy_echo import echo_round_trips  # noqa: E402
from experiments.supernode_logs import LogTail, node_events, warm_task_times  # noqa: E402

# ``old``, ``worker-process``, ``new`` and ``warm-filedb``: the SuperLink on a SQLite
# file, as fedlm deploy local had it until the warm executor
FILE_DB = dict(link_db_file=True)
VARIANTS = {
    # Flower as it comes: plain flower-superlink too (no owner token, subprocess isolation)
    "flower-defaults": dict(tls=True, auth=True, node_poll=False, warm_exec=False, **FILE_DB,
                            owner_token=False,
                            extra_env={"FLWR_TELEMETRY_ENABLED": "1", TASK_POLL_ENV: "1.0"}),
    "old": dict(tls=True, auth=True, node_poll=False, warm_exec=False, **FILE_DB, extra_env={}),
    "new": dict(tls=True, auth=True, node_poll=True, warm_exec=False, **FILE_DB, extra_env={}),
    "warm-filedb": dict(tls=True, auth=True, node_poll=True, warm_exec=True, **FILE_DB,
                        extra_env={}),
    # what fedlm deploy local does now: warm executor, SuperLink in memory
    "warm": dict(tls=True, auth=True, node_poll=True, warm_exec=True, link_db_file=False,
                 extra_env={}),
    "warm-insecure": dict(tls=False, auth=False, node_poll=True, warm_exec=True,
                          link_db_file=False, extra_env={}),
}
PHASES = ["poll_wait", "pull", "launch", "clientapp", "push", "server_notice"]
# inside "clientapp" with the warm executor: its own timings (seconds)
EXEC_PHASES = ["exec_pull", "exec_app", "exec_push", "exec_status"]


def group_cpu_seconds(pgid: int) -> float:
    """CPU seconds used so far by the live processes of process group ``pgid``."""
    total = 0
    for p in Path("/proc").iterdir():
        if p.name.isdigit():
            try:
                st = (p / "stat").read_text().rsplit(")", 1)[1].split()
            except OSError:
                continue
            if int(st[2]) == pgid:
                total += int(st[11]) + int(st[12])  # utime + stime, clock ticks
    return total / os.sysconf("SC_CLK_TCK")


def wait_online(dep: LocalDeployment, n: int, timeout: float = 120) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if sum(x.get("status") == "online" for x in dep.list_supernodes()) >= n:
            return
        time.sleep(0.5)
    raise RuntimeError(f"fewer than {n} SuperNodes online after {timeout:.0f} s")


def idle_cpu(dep: LocalDeployment, seconds: float = 10.0) -> float:
    """CPU cores a SuperNode (with its SuperExec) uses while it has no work, mean over nodes."""
    deadline = time.monotonic() + 60  # once every SuperExec has started (imports cost CPU)
    while time.monotonic() < deadline and not all(
            any(m in (dep.home / f"{n}.log").read_text(errors="replace")
                for m in ("Starting Flower SuperExec", "[fedlm warm executor] pid"))
            for n in dep.nodes):
        time.sleep(0.2)
    time.sleep(3.0)
    groups = [p.pid for p in dep.nodes.values()]
    c0 = [group_cpu_seconds(g) for g in groups]
    time.sleep(seconds)
    c1 = [group_cpu_seconds(g) for g in groups]
    return round(statistics.fmean(b - a for a, b in zip(c0, c1)) / seconds, 4)


def one_run(name: str, variant: dict, workers: int, jobs: int, work: Path,
            model: str = "tiny", idle_seconds: float = 10.0) -> dict:
    home, db = work / name / "home", work / name / "runs.db"
    shutil.rmtree(work / name, ignore_errors=True)
    sets = [f"model={model}", f"workers={workers}", f"updates={workers * jobs}", "inner.steps=3",
            "inner.batch_size=4", "eval.every=1000", "eval.batches=1", "data.seq_len=64",
            "strategy=async-sgd", "clock=wall", "seed=0"]
    cfg = config_load.load(None, sets)
    tail = LogTail(home)
    t0, load0 = time.time(), os.getloadavg()
    with LocalDeployment(home, workers, **variant) as dep:
        dep.start(cfg)
        wait_online(dep, workers)
        idle = idle_cpu(dep, idle_seconds)
        tail.start()
        proc = dep.run(sets, str(db), background=True)
        rc = proc.wait(timeout=1800)
        problems = dep.security_problems()
    tail.done.set()
    tail.join(timeout=5)
    if rc != 0:
        raise RuntimeError(f"{name}: flwr run exited with {rc}; see {home}")
    conn = sqlite3.connect(f"file:{db}?mode=ro", uri=True)
    rows = conn.execute("SELECT worker, job_id, t_dispatch, t_done, wall_arrival, compute_seconds "
                        "FROM updates ORDER BY job_id").fetchall()
    conn.close()
    offset = statistics.median(wa - td for _, _, _, td, wa, _ in rows)  # wall time of t = 0
    per_node = {w: node_events(tail.lines, f"supernode{w}") for w in range(workers)}
    warm = {w: warm_task_times(tail.lines, f"supernode{w}") for w in range(workers)}
    out, seen = [], {w: 0 for w in range(workers)}
    for w, job_id, td, tdone, _, comp in rows:
        k = seen[w]
        seen[w] += 1
        job = {"worker": w, "job_id": job_id, "first": k == 0, "latency": tdone - td,
               "compute": comp, "overhead": tdone - td - comp}
        ev = per_node[w][k] if k < len(per_node[w]) else {}
        if all(m in ev for m in ("recv", "recvd", "start", "send", "sent")):
            job |= {"poll_wait": ev["recv"] - (td + offset), "pull": ev["recvd"] - ev["recv"],
                    "launch": ev["start"] - ev["recvd"], "clientapp": ev["send"] - ev["start"],
                    "push": ev["sent"] - ev["send"], "server_notice": tdone + offset - ev["sent"]}
        if k < len(warm[w]):
            job |= warm[w][k]
        out.append(job)
    return {"variant": name, "model": model, "security_problems": problems, "seconds": time.time() - t0,
            "idle_cpu_per_supernode": idle,
            "loadavg_1_5_15_at_start": [round(x, 2) for x in load0],
            "loadavg_1_5_15_at_end": [round(x, 2) for x in os.getloadavg()], "jobs": out}


def summarize(runs: list[dict]) -> dict:
    def stats(xs: list[float]) -> dict:
        xs = sorted(xs)
        return {"n": len(xs), "mean": round(statistics.fmean(xs), 3),
                "median": round(statistics.median(xs), 3),
                "p90": round(xs[min(len(xs) - 1, int(0.9 * len(xs)))], 3)} if xs else {"n": 0}

    res = {}
    for name in dict.fromkeys(r["key"] for r in runs):
        jobs = [j for r in runs if r["key"] == name for j in r["jobs"]]
        steady = [j for j in jobs if not j["first"]]
        res[name] = {
            "overhead_steady": stats([j["overhead"] for j in steady]),
            "latency_steady": stats([j["latency"] for j in steady]),
            "compute_steady": stats([j["compute"] for j in steady]),
            "overhead_first_job": stats([j["overhead"] for j in jobs if j["first"]]),
            "phases_steady_mean": {p: round(statistics.fmean(j[p] for j in steady if p in j), 3)
                                   for p in PHASES + EXEC_PHASES
                                   if any(p in j for j in steady)},
            "phases_steady_median": {p: round(statistics.median(j[p] for j in steady if p in j),
                                              3)
                                     for p in PHASES + EXEC_PHASES
                                     if any(p in j for j in steady)},
            "idle_cpu_per_supernode": round(statistics.fmean(
                r["idle_cpu_per_supernode"] for r in runs if r["key"] == name), 4),
        }
    return res


def import_seconds(modules: str, n: int = 3) -> float:
    """A fresh Python process importing ``modules`` (median of ``n``)."""
    times = []
    for _ in range(n):
        t0 = time.perf_counter()
        subprocess.run([sys.executable, "-c", f"import {modules}"], cwd=ROOT, check=True)
        times.append(time.perf_counter() - t0)
    return round(statistics.median(times), 3)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--workers", type=int, default=4)
    ap.add_argument("--jobs", type=int, default=6, help="jobs per worker per run")
    ap.add_argument("--rounds", type=int, default=1, help="runs per variant, interleaved")
    ap.add_argument("--variants", default="old,new,warm-filedb,warm")
    ap.add_argument("--models", default="small,tiny")
    ap.add_argument("--echo-messages", type=int, default=0,
                    help="round trips per array count in the echo app (0: skip it)")
    ap.add_argument("--echo-rounds", type=int, default=2,
                    help="echo-app deployments per variant (flower-defaults, tuned), interleaved")
    ap.add_argument("--out", default=str(ROOT / "experiments/results/deploy_overhead.json"))
    ap.add_argument("--smoke", action="store_true", help="the test suite's check: tiny, warm")
    args = ap.parse_args()
    if args.smoke:  # warm, 1 worker, 2 jobs; 1 s idle, 1 import timing each; no echo (its own)
        vars(args).update(variants="warm", models="tiny", workers=1, jobs=2, rounds=1,
                          echo_messages=0, out=os.devnull)
    names = args.variants.split(",")
    load_start = os.getloadavg()
    runs = []
    with tempfile.TemporaryDirectory(prefix="fedlm-deploy-bench-") as tmp:
        order = [(m, n) for m in args.models.split(",") for n in names]
        for r in range(args.rounds):
            for model, name in (order if r % 2 == 0 else order[::-1]):  # ABC CBA: no drift
                t0 = time.time()
                run = one_run(f"{model}-{name}-{r}", VARIANTS[name], args.workers, args.jobs,
                              Path(tmp), model, 1.0 if args.smoke else 10.0)
                run["variant"], run["key"] = name, f"{model}/{name}"
                runs.append(run)
                print(f"{model} {name} round {r}: {time.time() - t0:.0f} s", flush=True)
        echo = None
        if args.echo_messages:
            from fedlm import model as model_lib
            state = model_lib.build("tiny", 64, 0).state_dict()
            floats, arrays = sum(t.numel() for t in state.values()), len(state)
            rtts: dict[str, dict[str, list[float]]] = {}
            for r in range(args.echo_rounds):
                for name in ("old", "new")[::1 if r % 2 == 0 else -1]:
                    got = echo_round_trips(VARIANTS[name], Path(tmp), floats, [1, arrays],
                                           args.echo_messages)
                    for k, v in got.items():
                        rtts.setdefault(name, {}).setdefault(k, []).extend(v)
                    print(f"echo app, {name} round {r}: "
                          + ", ".join(f"{k} arrays {statistics.fmean(v):.2f} s"
                                      for k, v in got.items()), flush=True)
            echo = {"floats": floats, "arrays": [1, arrays], "round_trip_seconds": {
                name: {k: {"mean": round(statistics.fmean(v), 3),
                           "median": round(statistics.median(v), 3), "n": len(v),
                           "all": [round(x, 3) for x in v]} for k, v in per.items()}
                for name, per in rtts.items()}}
    summary = summarize(runs)
    result = {
        "what": "per-job wall-clock overhead (latency - compute) of Flower deployment on "
                "loopback, async SGD, TLS + SuperNode auth; old path (a fresh ClientApp "
                "process runs each job) vs warm ClientApp executor running the job itself "
                "(no process per message; SuperLink in memory); phases from SuperNode "
                "logs",
        "goal": {"small/warm median steady overhead <= 3 s": (
            summary.get("small/warm", {}).get("overhead_steady", {}).get("median", 99) <= 3.0)},
        "loadavg_1_5_15": {"start": [round(x, 2) for x in load_start],
                           "end": [round(x, 2) for x in os.getloadavg()],
                           "note": "the 2 cores are shared with another engineer's runs"},
        "setup": {"workers": args.workers, "jobs_per_worker": args.jobs, "rounds": args.rounds,
                  "flwr": version("flwr"), "cpus": os.cpu_count(),
                  "python": platform.python_version(), "fast_task_poll_s": FAST_TASK_POLL,
                  "warm_executor_poll_s": DEFAULT_POLL_S,
                  "models": args.models.split(","),
                  "variants": {n: {k: v for k, v in VARIANTS[n].items()} for n in names}},
        # a fresh process up to `flwr-clientapp`'s first log line (the rest of
        # the "launch" phase is the SuperExec's task poll), and with fedlm's
        # ClientApp (torch) imported too
        "process_start_flwr_clientapp_seconds": import_seconds(
            "flwr.supernode.cli.flwr_clientapp", 1 if args.smoke else 3),
        "process_start_fedlm_client_app_seconds": import_seconds(
            "flwr.supernode.cli.flwr_clientapp, fedlm.flower.client_app", 1 if args.smoke else 3),
        "echo_app": echo,
        "summary": summary,
        "runs": [{**r, "jobs": [{k: (round(v, 4) if isinstance(v, float) else v)
                                 for k, v in j.items()} for j in r["jobs"]]} for r in runs],
    }
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    Path(args.out).write_text(json.dumps(result, indent=1) + "\n")
    print(f"{'model/variant':22} {'overhead/job (s)':>18} {'latency':>8} {'compute':>8}  phases (mean s)")
    for name, s in summary.items():
        ph = " ".join(f"{k}={v:.2f}" for k, v in s["phases_steady_mean"].items())
        print(f"{name:22} {s['overhead_steady'].get('mean', float('nan')):>9.2f} "
              f"(med {s['overhead_steady'].get('median', float('nan')):.2f}) "
              f"{s['latency_steady'].get('mean', float('nan')):>8.2f} "
              f"{s['compute_steady'].get('mean', float('nan')):>8.3f}  {ph}")
    print(f"wrote {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
