"""Shared by tests that start several ``fedlm`` processes at once (on one store)."""

from __future__ import annotations

import subprocess


def run_at_once(cmds: list[list[str]], timeout: float, **popen) -> list[tuple[int, str, str]]:
    """Start every command at once and wait for all, at most ``timeout`` seconds each:
    (exit status, stdout, stderr) per command; any still running then is killed by PID."""
    procs = [subprocess.Popen(cmd, text=True, **popen) for cmd in cmds]
    try:
        outs = [p.communicate(timeout=timeout) for p in procs]
    finally:
        for p in procs:
            if p.poll() is None:
                p.kill()
                p.wait()
    return [(p.returncode, out, err) for p, (out, err) in zip(procs, outs)]
