"""What a job costs in Flower deployment beyond its compute, and what the tuning saves.

    python experiments/bench/deploy_overhead.py [--workers 2] [--jobs 4] [--rounds 2]

Runs ``fedlm deploy local``'s LocalDeployment (SuperLink + one SuperNode per
worker on loopback) with a ``tiny`` model and async SGD, so that a job's
compute is a fraction of a second, in these variants, interleaved ``--rounds``
times so that they see the same machine load on average:

* ``flower-defaults``: TLS + SuperNode auth, Flower's own settings (SuperExec
  task poll every 1 s, telemetry on);
* ``tuned``: what ``fedlm deploy local`` sets: TLS + SuperNode auth, the
  supported ``FLWR_SUPEREXEC_TASK_POLL_INTERVAL=0.2`` (SuperNodes only) and
  ``FLWR_TELEMETRY_ENABLED=0``;
* ``tuned-insecure``: the same without TLS and authentication (what they cost).

Per job the run store gives the wall latency ``t_done - t_dispatch`` and the
ClientApp's own ``compute_seconds``; overhead = latency - compute. The
SuperNode logs, read with a timestamp as each line appears (10 ms), split the
latency into phases:

* ``poll_wait``: dispatch (the ServerApp pushing the message and its objects
  to the SuperLink) until the SuperNode pulls it — the SuperNode sleeps 3 s
  after an empty poll, hard-coded;
* ``pull``: the SuperNode pulling the message's objects from the SuperLink;
* ``launch``: until the new ``flwr-clientapp`` process logs its start: the
  SuperExec's task poll, process start, importing flwr;
* ``clientapp``: the ClientApp: FAB check, importing fedlm and torch, pulling
  the message from the SuperNode, compute, pushing the reply to the SuperNode;
* ``push``: the SuperNode pushing the reply's objects to the SuperLink (it
  checks for a reply every 0.5 s);
* ``server_notice``: until the ServerApp has pulled the reply and applied it.

The first job of each worker (run start: FAB download, caches) is reported
apart. Also measured: the idle CPU of a SuperNode (with its SuperExec), the
process start + import times, and an echo app (no torch; the ClientApp returns
what it got) sending the tiny model's floats as 1 array or as 21 (one per
tensor, as fedlm sends them): each array is a separate object, fetched or sent
with its own HTTP request on every hop. Writes
experiments/results/deploy_overhead.json.
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
import threading
import time
from importlib.metadata import version
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))

from fedlm import config_load  # noqa: E402
from fedlm.deploy import FAST_TASK_POLL, LocalDeployment  # noqa: E402

VARIANTS = {
    "flower-defaults": dict(tls=True, auth=True, fast_poll=False,
                            extra_env={"FLWR_TELEMETRY_ENABLED": "1"}),
    "tuned": dict(tls=True, auth=True, fast_poll=True, extra_env={}),
    "tuned-insecure": dict(tls=False, auth=False, fast_poll=True, extra_env={}),
}
PHASES = ["poll_wait", "pull", "launch", "clientapp", "push", "server_notice"]


class LogTail(threading.Thread):
    """Stamps every new line of HOME/*.log with the time it was first seen (10 ms)."""

    def __init__(self, home: Path) -> None:
        super().__init__(daemon=True)
        self.home, self.lines, self.done = home, [], threading.Event()
        self.pos: dict[Path, int] = {}

    def run(self) -> None:
        while not self.done.is_set():
            self.scan()
            time.sleep(0.01)
        self.scan()

    def scan(self) -> None:
        for f in self.home.glob("supernode*.log"):
            with f.open("rb") as fh:
                fh.seek(self.pos.get(f, 0))
                data = fh.read()
            cut = data.rfind(b"\n") + 1  # whole lines only
            if cut:
                self.pos[f] = self.pos.get(f, 0) + cut
                t = time.time()
                self.lines += [(t, f.stem, line) for line in
                               data[:cut].decode(errors="replace").splitlines() if line.strip()]


MARKS = {"Receiving: train message": "recv", "Received successfully": "recvd",
         "Start `flwr-clientapp` process": "start", "Sending: train message": "send",
         "Sent successfully": "sent"}


def node_events(lines, node: str) -> list[dict[str, float]]:
    """Per train message of ``node``, the times of its marks, in order."""
    jobs, cur = [], None
    for t, name, line in lines:
        if name != node:
            continue
        for text, mark in MARKS.items():
            if text in line:
                if mark == "recv":
                    cur = {"recv": t}
                    jobs.append(cur)
                elif cur is not None and mark not in cur:
                    cur[mark] = t
    return jobs


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
            "Starting Flower SuperExec" in (dep.home / f"{n}.log").read_text(errors="replace")
            for n in dep.nodes):
        time.sleep(0.2)
    time.sleep(3.0)
    groups = [p.pid for p in dep.nodes.values()]
    c0 = [group_cpu_seconds(g) for g in groups]
    time.sleep(seconds)
    c1 = [group_cpu_seconds(g) for g in groups]
    return round(statistics.fmean(b - a for a, b in zip(c0, c1)) / seconds, 4)


ECHO_APP = '''"""Round trips of one message through a deployment, by number of arrays."""
import json
import time
from pathlib import Path

import numpy as np
from flwr.app import Array, ArrayRecord, Message, MessageType, RecordDict
from flwr.clientapp import ClientApp
from flwr.serverapp import Grid, ServerApp

server = ServerApp()
client = ClientApp()


@server.main()
def main(grid: Grid, context) -> None:
    rc = context.run_config
    floats, counts = int(rc["floats"]), [int(k) for k in str(rc["arrays"]).split(",")]
    deadline = time.monotonic() + 120
    while not (nodes := list(grid.get_node_ids())):
        if time.monotonic() > deadline:
            raise RuntimeError("no SuperNode")
        time.sleep(0.5)
    out = {str(k): [] for k in counts}
    for _ in range(int(rc["messages"]) + 1):  # the first round warms up (FAB, imports)
        for k in counts:
            arrays = ArrayRecord({f"t{j}": Array(np.full(floats // k, j, np.float32))
                                  for j in range(k)})
            msg = Message(RecordDict({"a": arrays}), dst_node_id=nodes[0],
                          message_type=MessageType.TRAIN)
            t0 = time.monotonic()
            ids = list(grid.push_messages([msg]))
            while not (replies := list(grid.pull_messages(ids))):
                time.sleep(0.05)
            assert not replies[0].has_error(), replies[0].error
            out[str(k)].append(time.monotonic() - t0)
    Path(str(rc["out"])).write_text(json.dumps({k: v[1:] for k, v in out.items()}))


@client.train()
def train(msg: Message, context) -> Message:
    return Message(RecordDict({"a": msg.content["a"]}), reply_to=msg)
'''

ECHO_PYPROJECT = '''[build-system]
requires = ["hatchling"]
build-backend = "hatchling.build"

[project]
name = "echoapp"
version = "1.0.0"
dependencies = ["flwr"]

[tool.hatch.build.targets.wheel]
packages = ["."]

[tool.flwr.app]
publisher = "fedlm"

[tool.flwr.app.components]
serverapp = "echoapp:server"
clientapp = "echoapp:client"

[tool.flwr.app.config]
floats = 0
arrays = "1"
messages = 1
out = ""
'''


def echo_round_trips(variant: dict, work: Path, floats: int, counts: list[int],
                     messages: int) -> dict[str, list[float]]:
    """A Flower app that only echoes: the message round trip with no torch, by array count."""
    app, home = work / "echoapp", work / "echo-home"
    shutil.rmtree(work / "echo-home", ignore_errors=True)
    app.mkdir(parents=True, exist_ok=True)
    (app / "echoapp.py").write_text(ECHO_APP)
    (app / "pyproject.toml").write_text(ECHO_PYPROJECT)
    out = work / "echo.json"
    cfg = config_load.load(None, ["model=tiny", "workers=1"])
    with LocalDeployment(home, 1, **variant) as dep:
        dep.start(cfg)
        proc = dep.run([], "", background=True, app=app, run_config=(
            f'floats = {floats}\narrays = "{",".join(map(str, counts))}"\n'
            f'messages = {messages}\nout = "{out}"\n'))
        rc = proc.wait(timeout=1800)
    if rc != 0:
        raise RuntimeError(f"echo app: flwr run exited with {rc}; see {home}")
    return json.loads(out.read_text())


def one_run(name: str, variant: dict, workers: int, jobs: int, work: Path) -> dict:
    home, db = work / name / "home", work / name / "runs.db"
    shutil.rmtree(work / name, ignore_errors=True)
    sets = ["model=tiny", f"workers={workers}", f"updates={workers * jobs}", "inner.steps=3",
            "inner.batch_size=4", "eval.every=1000", "eval.batches=1", "data.seq_len=64",
            "strategy=async-sgd", "clock=wall", "seed=0"]
    cfg = config_load.load(None, sets)
    tail = LogTail(home)
    t0 = time.time()
    with LocalDeployment(home, workers, **variant) as dep:
        dep.start(cfg)
        wait_online(dep, workers)
        idle = idle_cpu(dep)
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
        out.append(job)
    return {"variant": name, "security_problems": problems, "seconds": time.time() - t0,
            "idle_cpu_per_supernode": idle, "jobs": out}


def summarize(runs: list[dict]) -> dict:
    def stats(xs: list[float]) -> dict:
        xs = sorted(xs)
        return {"n": len(xs), "mean": round(statistics.fmean(xs), 3),
                "median": round(statistics.median(xs), 3),
                "p90": round(xs[min(len(xs) - 1, int(0.9 * len(xs)))], 3)} if xs else {"n": 0}

    res = {}
    for name in dict.fromkeys(r["variant"] for r in runs):
        jobs = [j for r in runs if r["variant"] == name for j in r["jobs"]]
        steady = [j for j in jobs if not j["first"]]
        res[name] = {
            "overhead_steady": stats([j["overhead"] for j in steady]),
            "latency_steady": stats([j["latency"] for j in steady]),
            "compute_steady": stats([j["compute"] for j in steady]),
            "overhead_first_job": stats([j["overhead"] for j in jobs if j["first"]]),
            "phases_steady_mean": {p: round(statistics.fmean(j[p] for j in steady if p in j), 3)
                                   for p in PHASES if any(p in j for j in steady)},
            "idle_cpu_per_supernode": round(statistics.fmean(
                r["idle_cpu_per_supernode"] for r in runs if r["variant"] == name), 4),
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
    ap.add_argument("--workers", type=int, default=2)
    ap.add_argument("--jobs", type=int, default=4, help="jobs per worker per run")
    ap.add_argument("--rounds", type=int, default=2, help="runs per variant, interleaved")
    ap.add_argument("--variants", default=",".join(VARIANTS))
    ap.add_argument("--echo-messages", type=int, default=5,
                    help="round trips per array count in the echo app (0: skip it)")
    ap.add_argument("--echo-rounds", type=int, default=2,
                    help="echo-app deployments per variant (flower-defaults, tuned), interleaved")
    ap.add_argument("--out", default=str(ROOT / "experiments/results/deploy_overhead.json"))
    args = ap.parse_args()
    names = args.variants.split(",")
    runs = []
    with tempfile.TemporaryDirectory(prefix="fedlm-deploy-bench-") as tmp:
        for r in range(args.rounds):
            for name in (names if r % 2 == 0 else names[::-1]):  # ABC CBA: no drift bias
                t0 = time.time()
                run = one_run(f"{name}-{r}", VARIANTS[name], args.workers, args.jobs, Path(tmp))
                run["variant"] = name
                runs.append(run)
                print(f"{name} round {r}: {time.time() - t0:.0f} s", flush=True)
        echo = None
        if args.echo_messages:
            from fedlm import model as model_lib
            state = model_lib.build("tiny", 64, 0).state_dict()
            floats, arrays = sum(t.numel() for t in state.values()), len(state)
            rtts: dict[str, dict[str, list[float]]] = {}
            for r in range(args.echo_rounds):
                for name in ("flower-defaults", "tuned")[::1 if r % 2 == 0 else -1]:
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
                "loopback, tiny model, async SGD; phases from SuperNode logs",
        "setup": {"workers": args.workers, "jobs_per_worker": args.jobs, "rounds": args.rounds,
                  "flwr": version("flwr"), "cpus": os.cpu_count(),
                  "python": platform.python_version(), "fast_task_poll_s": FAST_TASK_POLL,
                  "variants": {n: {k: v for k, v in VARIANTS[n].items()} for n in names}},
        # a fresh process up to `flwr-clientapp`'s first log line (the rest of
        # the "launch" phase is the SuperExec's task poll), and with fedlm's
        # ClientApp (torch) imported too
        "process_start_flwr_clientapp_seconds": import_seconds(
            "flwr.supernode.cli.flwr_clientapp"),
        "process_start_fedlm_client_app_seconds": import_seconds(
            "flwr.supernode.cli.flwr_clientapp, fedlm.client_app"),
        "echo_app": echo,
        "summary": summary,
        "runs": [{**r, "jobs": [{k: (round(v, 4) if isinstance(v, float) else v)
                                 for k, v in j.items()} for j in r["jobs"]]} for r in runs],
    }
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    Path(args.out).write_text(json.dumps(result, indent=1) + "\n")
    print(f"{'variant':16} {'overhead/job (s)':>18} {'latency':>8} {'compute':>8}  phases (mean s)")
    for name, s in summary.items():
        ph = " ".join(f"{k}={v:.2f}" for k, v in s["phases_steady_mean"].items())
        print(f"{name:16} {s['overhead_steady'].get('mean', float('nan')):>9.2f} "
              f"(med {s['overhead_steady'].get('median', float('nan')):.2f}) "
              f"{s['latency_steady'].get('mean', float('nan')):>8.2f} "
              f"{s['compute_steady'].get('mean', float('nan')):>8.3f}  {ph}")
    print(f"wrote {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
