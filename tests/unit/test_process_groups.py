"""``processes.end_group`` on a group whose leader has ended and been reaped (a worker that crashed).

Before the fix it looked the leader up, found no such process and gave up: the members the leader had
started in its group lived on. A process that has the leader's number now is another one and is left alone.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from gradcheck_cli.sandbox import processes

try:  # tests/ on sys.path (rootdir-style collection) or tests/ as a package
    from procs import alive
except ImportError:  # pragma: no cover
    from tests.procs import alive


pytestmark = pytest.mark.skipif(not hasattr(os, "killpg") or not Path("/proc").is_dir(), reason="process groups")

LEADER = (
    "import os, subprocess, sys; os.setpgrp(); "
    "p = subprocess.Popen([sys.executable, '-c', 'import time; time.sleep(600)']); print(p.pid, flush=True)"
)


def test_the_members_a_reaped_leader_left_in_its_group_are_ended() -> None:
    leader = subprocess.Popen([sys.executable, "-c", LEADER], stdout=subprocess.PIPE, text=True)
    assert leader.stdout is not None
    member = int(leader.stdout.readline())
    try:
        assert leader.wait(timeout=120) == 0  # ended and reaped: no process has its number
        assert os.getpgid(member) == leader.pid
        processes.end_group(leader.pid, ended=True)
        deadline = time.monotonic() + 120  # a bound for a broken run only: the wait ends on the event
        while alive(member) and time.monotonic() < deadline:
            time.sleep(0.05)
        assert not alive(member)
    finally:
        if alive(member):
            os.kill(member, signal.SIGKILL)


def test_a_process_that_has_the_number_of_an_ended_one_is_left_alone() -> None:
    other = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(600)"])
    try:
        processes.end_group(other.pid, ended=True)  # as if ours of that number had ended and this one took it
        other.terminate()
        # a SIGKILL sent before the SIGTERM would have decided how it ended, however late either arrived
        assert other.wait(timeout=120) == -signal.SIGTERM
    finally:
        if other.poll() is None:
            other.kill()
            other.wait()
