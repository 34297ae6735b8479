"""The light ClientApp of a deployment: hands each message to the node's worker process.

Flower 1.41's SuperNode starts a fresh ClientApp process for every message;
importing torch and fedlm there cost about 4 s a message. This ClientApp
imports flwr and this module only (no torch, no numpy of its own): it forwards
the message's contents, as raw bytes over a Unix domain socket, to a
long-lived worker process (``fedlm.deploy.node_worker``) that keeps torch, the model,
the tokenized shards and the worker's optimizer states warm, and turns the
answer back into the reply Message. What a message holds is still defined in
``fedlm.flower.messages`` alone: the worker process reads and writes it.

The worker process, one per SuperNode and run:

* is started by the first ClientApp that needs it (its own session, so it
  outlives that ClientApp), listening on ``socket_path()`` (a private folder
  under the temp dir, keyed by SuperNode pid, node id and run id);
* exits when its SuperNode exits (it watches the pid) or after
  ``FEDLM_WORKER_IDLE_S`` seconds (default 1800) without a message;
* is supervised: a ClientApp that cannot reach it starts a new one and
  retries once; a worker that dies during a job makes that ClientApp raise,
  so Flower replies with an error and the engine counts the job lost (as a
  crashed ClientApp was before). Optimizer states kept in memory die with it
  (later jobs that build on them fail, as after a restarted SuperNode); the
  ``disk`` state store keeps them.

``FEDLM_WORKER_PROCESS=0`` (environment of the SuperNode) runs every message in
the ClientApp process itself, as before (``fedlm.flower.client_app``). Outside a
SuperNode (Flower's simulation engine) messages always run in process.
"""

from __future__ import annotations

import fcntl
import hashlib
import os
import pickle
import socket
import struct
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from flwr.app import (Array, ArrayRecord, ConfigRecord, Context, Message, MetricRecord,
                      RecordDict)
from flwr.clientapp import ClientApp

ENV_SWITCH = "FEDLM_WORKER_PROCESS"  # "0": run messages in the ClientApp process
ENV_IDLE = "FEDLM_WORKER_IDLE_S"
START_TIMEOUT = 300.0  # seconds for a new worker process to listen (imports, warm-up)
_HEADER = struct.Struct("!Q")

app = ClientApp()


# -- RecordDict <-> bytes (arrays as their raw buffers) ------------------------------
_KINDS = {ArrayRecord: "arrays", ConfigRecord: "config", MetricRecord: "metrics"}


def encode(content: RecordDict) -> list:
    """A picklable form of ``content``: array data stays the bytes Flower holds."""
    out = []
    for key, record in content.items():
        kind = _KINDS[type(record)]
        if kind == "arrays":
            body = [(name, a.dtype, tuple(a.shape), a.stype, a.data)
                    for name, a in record.items()]
        else:
            body = dict(record)
        out.append((key, kind, body))
    return out


def decode(items: list) -> RecordDict:
    records = {}
    for key, kind, body in items:
        if kind == "arrays":
            arrays = ArrayRecord()
            for name, dtype, shape, stype, data in body:
                arrays[name] = Array(dtype=dtype, shape=tuple(shape), stype=stype, data=data)
            records[key] = arrays
        elif kind == "config":
            records[key] = ConfigRecord(body)
        else:
            records[key] = MetricRecord(body)
    return RecordDict(records)


def send_obj(sock: socket.socket, obj) -> None:
    blob = pickle.dumps(obj, protocol=5)
    sock.sendall(_HEADER.pack(len(blob)))
    sock.sendall(blob)


def _recv_exact(sock: socket.socket, n: int) -> bytearray:
    buf = bytearray(n)
    view, got = memoryview(buf), 0
    while got < n:
        k = sock.recv_into(view[got:], n - got)
        if k == 0:
            raise ConnectionError("the peer closed the connection")
        got += k
    return buf


def recv_obj(sock: socket.socket):
    (n,) = _HEADER.unpack(_recv_exact(sock, _HEADER.size))
    return pickle.loads(_recv_exact(sock, n))


# -- where the worker process lives --------------------------------------------------
def supernode_pid() -> int | None:
    """The pid of the ``flower-supernode`` this process runs under (None: not under one)."""
    pid = os.getppid()
    for _ in range(6):
        if pid <= 1:
            return None
        try:
            cmd = Path(f"/proc/{pid}/cmdline").read_bytes()
            stat = Path(f"/proc/{pid}/stat").read_text()
        except OSError:
            return None
        if b"flower-supernode" in cmd or b"fedlm.deploy.supernode" in cmd:
            return pid
        pid = int(stat.rsplit(")", 1)[1].split()[1])  # the parent's pid
    return None


def socket_path(node_pid: int, node_id: int, run_id: int) -> Path:
    """A short path (Unix sockets allow ~100 bytes) in a folder only this user can read."""
    folder = Path(tempfile.gettempdir()) / f"fedlm-workers-{os.getuid()}"
    folder.mkdir(mode=0o700, exist_ok=True)
    key = hashlib.sha1(f"{node_pid}/{node_id}/{run_id}".encode()).hexdigest()[:16]
    return folder / f"{key}.sock"


def _connect(path: Path) -> socket.socket | None:
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    try:
        sock.connect(str(path))
        return sock
    except OSError:
        sock.close()
        return None


def _start_worker(path: Path, node_pid: int) -> socket.socket:
    """Start the worker process for ``path`` (unless another ClientApp just did) and
    connect to it."""
    with open(path.with_suffix(".lock"), "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        sock = _connect(path)
        if sock is not None:  # started meanwhile by another ClientApp
            return sock
        path.unlink(missing_ok=True)
        log = open(path.with_suffix(".log"), "ab")
        proc = subprocess.Popen(
            [sys.executable, "-m", "fedlm.deploy.node_worker", "--socket", str(path),
             "--watch-pid", str(node_pid), "--idle", os.environ.get(ENV_IDLE, "1800")],
            stdin=subprocess.DEVNULL, stdout=log, stderr=subprocess.STDOUT,
            start_new_session=True, close_fds=True)
        log.close()
        deadline = time.monotonic() + START_TIMEOUT
        while time.monotonic() < deadline:
            if path.exists() and (sock := _connect(path)) is not None:
                return sock
            if proc.poll() is not None:
                raise RuntimeError(f"fedlm worker process exited with {proc.returncode}; "
                                   f"see {path.with_suffix('.log')}")
            time.sleep(0.02)
        proc.kill()
        raise RuntimeError(f"fedlm worker process did not listen within {START_TIMEOUT:.0f} s")


def ask_worker(path: Path, node_pid: int, request: dict) -> dict:
    """Send ``request`` to the worker process at ``path`` (started if need be)."""
    sock = _connect(path)
    if sock is None:
        sock = _start_worker(path, node_pid)
    with sock:
        try:
            send_obj(sock, request)
        except OSError:  # died between accept and now: one fresh start, one retry
            sock.close()
            sock = _start_worker(path, node_pid)
            send_obj(sock, request)
        try:
            answer = recv_obj(sock)
        except (OSError, EOFError) as exc:  # died during the job: the job is lost
            raise RuntimeError(f"fedlm worker process died during the message ({exc}); "
                               f"see {path.with_suffix('.log')}") from exc
    if "error" in answer:
        raise RuntimeError(answer["error"])
    return answer


def _in_process() -> bool:
    return os.environ.get(ENV_SWITCH, "1") == "0"


def _handle(kind: str, msg: Message, context: Context) -> Message:
    node_pid = None if _in_process() else supernode_pid()
    if node_pid is None:
        from fedlm.flower import client_app  # torch and all: the old path

        handler = client_app.query if kind == "query" else client_app.train
        return handler(msg, context)
    path = socket_path(node_pid, context.node_id, context.run_id)
    answer = ask_worker(path, node_pid, {
        "kind": kind, "content": encode(msg.content),
        "node_config": dict(context.node_config)})
    return Message(decode(answer["content"]), reply_to=msg)


@app.query()
def query(msg: Message, context: Context) -> Message:
    return _handle("query", msg, context)


@app.train()
def train(msg: Message, context: Context) -> Message:
    return _handle("train", msg, context)
