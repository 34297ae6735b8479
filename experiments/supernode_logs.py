"""What the deployment benchmark reads from the SuperNodes' logs: every line stamped with
the time it was first seen (``LogTail``), each train message's marks (received, the
ClientApp started, sent) and the warm executor's own per-task timings."""

from __future__ import annotations

import threading
import time
from pathlib import Path

from fedlm.deploy.warm_executor import DONE_MARK as WARM_DONE
from fedlm.deploy.warm_executor import START_MARK as WARM_START


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
         "Start `flwr-clientapp` process": "start", WARM_START: "start",
         "Sending: train message": "send", "Sent successfully": "sent"}


def warm_task_times(lines, node: str) -> list[dict[str, float]]:
    """The warm executor's own per-task timings (pull, app, push, status) of ``node``'s
    train tasks, in order (its query task, the first, is left out)."""
    out = []
    for _, name, line in lines:
        if name == node and WARM_DONE in line:
            nums = line.split(WARM_DONE, 1)[1].split()
            out.append({f"exec_{k}": float(v) for k, v in zip(nums[1::2], nums[2::2])})
    return out[1:]


def node_events(lines, node: str) -> list[dict[str, float]]:
    """Per train message of ``node``, the times of its marks, in order."""
    jobs, cur = [], None
    for t, name, line in lines:
        if name != node:
            continue
        for text, mark in MARKS.items():
            if text not in line:
                continue
            if mark == "recv":
                cur = {"recv": t}
                jobs.append(cur)
            elif cur is not None and mark not in cur:
                cur[mark] = t
    # the warm executor can claim the task while the SuperNode still stores the
    # message's objects (before "Received successfully"): launch is then 0
    for ev in jobs:
        if "start" in ev and "recvd" in ev and ev["start"] < ev["recvd"]:
            ev["start"] = ev["recvd"]
    return jobs
