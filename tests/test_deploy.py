"""Flower's deployment engine on loopback: SuperLink + SuperNodes, TLS, SuperNode auth.
(An unregistered SuperNode is refused: tests/test_deploy_warm.py, on its deployment.)"""

import os
import signal
import sqlite3
import subprocess
import sys
import time
import uuid
from contextlib import closing
from pathlib import Path

import pytest

from fedlm.deploy.credentials import make_certificates, make_node_key
from fedlm.store import RunWriter

pytestmark = pytest.mark.flower
ROOT = Path(__file__).resolve().parent.parent


def _processes_mentioning(text: str) -> list[int]:
    pids = []
    for proc in Path("/proc").iterdir():
        if proc.name.isdigit():
            try:
                if text in (proc / "environ").read_bytes().decode(errors="replace"):
                    pids.append(int(proc.name))
            except OSError:
                pass
    return pids


def _other_run(db: Path, name: str) -> int:
    """Another writer's run in the same store (a finished stand-in)."""
    w = RunWriter(db, name=name, strategy="diloco", local_steps="fixed", profile="moderate",
                  model="tiny", workers=1, seed=0, clock="virtual", config_json="{}")
    w.finish(status="finished", virtual_time=0.0, updates=0, final_hash=None)
    w.close()
    return w.run_id


def _run_ids(db: Path) -> list[int]:
    try:
        with closing(sqlite3.connect(f"file:{db}?mode=ro", uri=True)) as conn:
            return [i for (i,) in conn.execute("SELECT id FROM runs ORDER BY id")]
    except sqlite3.Error:
        return []


def test_deploy_local_runs_replays_and_cleans_up(tmp_path):
    """`fedlm deploy local`: TLS and SuperNode authentication on by default; it reads back
    its own run by the id its ServerApp reported, not the store's newest: here one run
    was stored before it and another lands while it runs."""
    home, db = tmp_path / "flwr-home", tmp_path / "runs.db"
    before = _other_run(db, "stored-before")
    args = [sys.executable, "-m", "fedlm", "deploy", "local", "--workers", "2", "--db", str(db),
            "--home", str(home)]
    for kv in ["model=tiny", "updates=2", "inner.steps=3", "eval.batches=2", "data.seq_len=64",
               "strategy=async-sgd", f"track.dir={tmp_path / 'track'}"]:
        args += ["--set", kv]
    args += ["--track", "tensorboard"]  # sent once the run is over (docs/tracking.md)
    log = (tmp_path / "out.log").open("w+")
    proc = subprocess.Popen(args, stdout=log, stderr=subprocess.STDOUT, text=True)
    try:
        deadline = time.monotonic() + 300
        while len(_run_ids(db)) < 2:  # bounded: until the ServerApp has stored its run
            assert proc.poll() is None, (tmp_path / "out.log").read_text()[-3000:]
            assert time.monotonic() < deadline, "no run stored within 300 s"
            time.sleep(0.2)
        mine = _run_ids(db)[-1]
        during = _other_run(db, "stored-meanwhile")  # the store's newest from now on
        rc = proc.wait(timeout=600)
    finally:
        if proc.poll() is None:
            proc.send_signal(signal.SIGTERM)  # stops what it started, then exits
            proc.wait(timeout=90)
        log.close()
    out = (tmp_path / "out.log").read_text()
    assert rc == 0, out[-3000:]
    assert before < mine < during
    assert f"run {mine} (async-sgd-moderate)" in out and f"run {during} (" not in out, out
    assert "wall-clock time" in out
    assert "(TLS, SuperNode authentication, owner token)" in out
    # its own run went to the tracker, not the store's newest
    assert f"run {mine}: 2 progress points to tensorboard" in out, out[-3000:]
    assert [p.name for p in (tmp_path / "track" / "tensorboard").iterdir()] == \
        [f"run{mine}_async-sgd-moderate"]
    conn = sqlite3.connect(db)
    assert conn.execute("SELECT status, clock FROM runs WHERE id = ?", (mine,)).fetchone() == \
        ("finished", "wall")
    nodes = [n for (n,) in conn.execute("SELECT node_id FROM workers WHERE run_id = ?",
                                        (mine,))]
    assert len(set(nodes)) == 2
    # the SuperLink's own log: HTTPS, and no "authentication is disabled" warning;
    # each node was registered through the Control API and activated with its key
    link = (home / "superlink.log").read_text(errors="replace")
    assert "running on https://127.0.0.1:" in link
    assert "SuperNode authentication is disabled" not in link
    assert link.count("[ControlServicer.RegisterNode] Created node_id=") == 2
    for n in nodes:
        assert f"Created node_id={n}" in link and f"Activated node_id={n}" in link
    assert 'root-certificates = "' in (home / "config.toml").read_text()
    assert "insecure" not in (home / "config.toml").read_text()
    replay = subprocess.run([sys.executable, "-m", "fedlm", "replay", str(mine), "--db", str(db)],
                            capture_output=True, text=True, timeout=300)
    assert replay.returncode == 0 and "identical" in replay.stdout, replay.stdout
    # every SuperLink, SuperNode and SuperExec started for the run is gone
    assert _processes_mentioning(str(home)) == []


def test_certificates_and_keys_have_the_formats_flower_reads(tmp_path):
    from cryptography import x509
    from cryptography.hazmat.primitives.asymmetric import ec
    from cryptography.hazmat.primitives.serialization import (load_ssh_private_key,
                                                              load_ssh_public_key)

    paths = make_certificates(tmp_path / "certs")
    ca = x509.load_pem_x509_certificate(paths["ca"].read_bytes())
    cert = x509.load_pem_x509_certificate(paths["cert"].read_bytes())
    san = cert.extensions.get_extension_for_class(x509.SubjectAlternativeName).value
    assert [str(ip) for ip in san.get_values_for_type(x509.IPAddress)] == ["127.0.0.1"]
    assert san.get_values_for_type(x509.DNSName) == ["localhost"]
    assert cert.issuer == ca.subject
    cert.verify_directly_issued_by(ca)
    assert oct(paths["key"].stat().st_mode & 0o777) == "0o600"

    key, pub = make_node_key(tmp_path / "keys" / "node0")
    private = load_ssh_private_key(key.read_bytes(), None)
    public = load_ssh_public_key(pub.read_bytes())
    assert isinstance(private, ec.EllipticCurvePrivateKey) and private.curve.name == "secp384r1"
    assert public.public_numbers() == private.public_key().public_numbers()
    assert pub.read_text().startswith("ecdsa-sha2-nistp384 ")


def test_a_stopped_deploy_leaves_nothing_running(tmp_path):
    """SIGTERM to `fedlm deploy local` mid-run stops the SuperLink, the SuperNodes and
    everything they started (as Ctrl-C does); the command exits 130 and the run is stored
    as interrupted."""
    home, db, mark = tmp_path / "flwr-home", tmp_path / "runs.db", uuid.uuid4().hex
    args = [sys.executable, "-m", "fedlm", "deploy", "local", "--workers", "2", "--db", str(db),
            "--home", str(home), "--set", "model=tiny", "--set", "updates=1000",
            "--set", "inner.steps=3", "--set", "data.seq_len=64"]
    log = (tmp_path / "out.log").open("w")
    proc = subprocess.Popen(args, stdout=log, stderr=subprocess.STDOUT, cwd=ROOT,
                            env={**os.environ, "FEDLM_TEST_MARK": mark})
    try:
        deadline = time.monotonic() + 120
        while True:  # bounded: until the ServerApp has stored the run (all is up)
            assert proc.poll() is None, (tmp_path / "out.log").read_text()[-3000:]
            assert time.monotonic() < deadline, "no run stored within 120 s"
            try:
                with closing(sqlite3.connect(f"file:{db}?mode=ro", uri=True)) as conn:
                    if conn.execute("SELECT COUNT(*) FROM runs").fetchone()[0]:
                        break
            except sqlite3.Error:
                pass
            time.sleep(0.2)
        assert len(_processes_mentioning(mark)) >= 4  # SuperLink, SuperNodes, ServerApp...
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(timeout=90) == 130
        deadline = time.monotonic() + 10
        while _processes_mentioning(mark):
            assert time.monotonic() < deadline, _processes_mentioning(mark)
            time.sleep(0.2)
        assert (tmp_path / "out.log").read_text().endswith("fedlm: interrupted\n")
        with closing(sqlite3.connect(f"file:{db}?mode=ro", uri=True)) as conn:  # not failed
            assert conn.execute("SELECT status FROM runs").fetchone()[0] == "interrupted"
    finally:  # by PID, a few rounds: a process may start another while they are ended
        for _ in range(5):
            for pid in [*_processes_mentioning(mark), *[proc.pid] * (proc.poll() is None)]:
                try:
                    os.kill(pid, signal.SIGKILL)
                except ProcessLookupError:
                    pass
            proc.wait(timeout=30)
            time.sleep(0.2)
        log.close()
