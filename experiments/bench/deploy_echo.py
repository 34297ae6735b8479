"""The echo app of deploy_overhead.py: a message round trip through a deployment with
no torch and no fedlm, by number of arrays (each array is an object of its own)."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

from fedlm import config_load
from fedlm.deploy.local import LocalDeployment


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


# --- smoke (the test suite's check); the module above is deploy_overhead.py's ----------
if __name__ == "__main__":
    import argparse
    import statistics
    import tempfile

    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--smoke", action="store_true", help="one deployment with fedlm deploy "
                    "local's defaults, 1 and 4 arrays, 1 timed round trip each; nothing written")
    if not ap.parse_args().smoke:
        ap.error("this is deploy_overhead.py's echo app (--echo-messages N there); "
                 "--smoke checks it alone")
    with tempfile.TemporaryDirectory(prefix="fedlm-echo-smoke-") as tmp:
        got = echo_round_trips({}, Path(tmp), 4096, [1, 4], 1)
    print("echo app round trips: " + ", ".join(
        f"{k} arrays {statistics.fmean(v):.3f} s" for k, v in got.items()))
