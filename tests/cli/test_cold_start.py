"""Issue 18, point 3: what a lone small spec pays end to end, beyond torch's import.

Each test failed on the code before its change: the fork server, which imported torch for the
workers, outlived the run and held its stdout and stderr open while it shut down (a CI step or a
pipe that reads them waited for it).
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from gradcheck_cli.run import pool

ROOT = Path(__file__).resolve().parents[2]

# A parent that adopts the orphans of the gradcheck run it starts (Linux: a child subreaper), notes the fork
# server's pid while the run goes on, and prints how that server ended.
ADOPTER = textwrap.dedent("""
    import ctypes, os, signal, subprocess, sys, time
    assert ctypes.CDLL(None).prctl(36, 1) == 0  # PR_SET_CHILD_SUBREAPER
    run = subprocess.Popen([sys.executable, "-m", "gradcheck_cli", "--no-color", "-q", sys.argv[1]],
                           stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    server = None
    while run.poll() is None:
        if server is None:
            for pid in filter(str.isdigit, os.listdir("/proc")):
                try:
                    cmdline = open(f"/proc/{pid}/cmdline", "rb").read()
                except OSError:
                    continue
                if b"multiprocessing.forkserver" in cmdline and b"gradcheck_cli" in cmdline:
                    stat = open(f"/proc/{pid}/stat").read()
                    if int(stat[stat.rindex(")") + 2:].split()[1]) == run.pid:  # the run's own fork server
                        server = int(pid)
        time.sleep(0.005)
    ended = {}
    while True:
        try:
            pid, status = os.waitpid(-1, 0)
        except ChildProcessError:
            break
        ended[pid] = status
    status = ended.get(server)
    print(run.returncode, server is not None,
          status is not None and os.WIFSIGNALED(status) and os.WTERMSIG(status) == signal.SIGKILL)
""")


@pytest.mark.skipif(
    not sys.platform.startswith("linux") or pool.start_method() != "forkserver",
    reason="a child subreaper and a fork server: Linux",
)
def test_the_fork_server_ends_with_the_run_instead_of_shutting_torch_down_after_it() -> None:
    out = subprocess.run(
        [sys.executable, "-c", ADOPTER, str(ROOT / "specs" / "relu.yaml")],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert out.stdout.split() == ["0", "True", "True"], out.stdout + out.stderr


@pytest.mark.skipif(sys.platform == "win32", reason="POSIX processes")
def test_at_exit_only_this_runs_own_child_is_ended_as_its_fork_server(monkeypatch) -> None:
    """The fork server's pid comes from a worker (its parent's pid), not from multiprocessing's private
    attribute; a pid that is not this process's child (a worker reparented elsewhere) is never signalled."""
    stranger = int(
        subprocess.run(
            ["sh", "-c", "sleep 60 > /dev/null 2>&1 & echo $!"], capture_output=True, text=True, check=True
        ).stdout
    )  # its shell exited: not our child
    try:
        monkeypatch.setattr(pool, "_server", [stranger])
        pool._end_server()
        os.kill(stranger, 0)  # still there
    finally:
        os.kill(stranger, signal.SIGKILL)
    child = subprocess.Popen(["sleep", "60"])
    monkeypatch.setattr(pool, "_server", [child.pid])
    pool._end_server()
    assert child.wait(timeout=60) == -signal.SIGKILL
