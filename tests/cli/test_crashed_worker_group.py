"""A worker that the code under test crashes (os._exit, SIGKILL) takes the processes that code started with it.

Before the fix the pool ended a worker's process group only while the worker was alive: a worker that had died
was skipped (under the fork server its pid is reaped already), and a child process that the code under test had
started in the worker's group went on sleeping after the run. The case is an error (the crash) and the next
case, in a fresh worker, passes.
"""

from __future__ import annotations

import json
import os
import signal
import time
from pathlib import Path

import pytest

from tests.corpus import Square, module_source

try:  # tests/ on sys.path (rootdir-style collection) or tests/ as a package
    from procs import alive
except ImportError:  # pragma: no cover
    from tests.procs import alive


USER = (
    module_source(Square)
    + """
import os, signal, subprocess, sys, time
from pathlib import Path

HERE = Path(__file__).parent


class ExitsAfterStartingAChild(Square):  # a subprocess, then the worker ends itself
    @staticmethod
    def forward(ctx, x):
        child = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(600)"])
        (HERE / "child.pid").write_text(str(child.pid))
        os._exit(1)


class KilledAfterForkingAChild(Square):  # a forked child, then the worker is killed as a crash would kill it
    @staticmethod
    def forward(ctx, x):
        pid = os.fork()
        if pid == 0:
            time.sleep(600)
            os._exit(0)
        (HERE / "child.pid").write_text(str(pid))
        os.kill(os.getpid(), signal.SIGKILL)
"""
)


def assert_ends(child: int) -> None:
    """``child`` ends (is killed with its worker's group); killed here where it does not, after the test's bound."""
    try:
        deadline = time.monotonic() + 120  # a bound for a broken run only: the wait ends on the event
        while alive(child) and time.monotonic() < deadline:
            time.sleep(0.05)
        assert not alive(child), Path(f"/proc/{child}/stat").read_text()
    finally:
        if alive(child):
            os.kill(child, signal.SIGKILL)


@pytest.mark.skipif(not hasattr(os, "killpg") or not Path("/proc").is_dir(), reason="process groups and /proc")
@pytest.mark.parametrize(
    ("function", "death"), [("ExitsAfterStartingAChild", "exited with code 1"), ("KilledAfterForkingAChild", "SIGKILL")]
)
def test_what_the_code_under_test_started_ends_with_its_crashed_worker(
    user_module, write_spec, invoke, tmp_path, function, death
):
    user_module(USER)
    write_spec(f"function: usermod:{function}\ninputs: [{{shape: [3]}}]\n", "specs/00_crash.yaml")
    write_spec("function: usermod:Square\ninputs: [{shape: [3]}]\n", "specs/01_square.yaml")
    result = invoke("specs/", "--format", "json", "-j", "1")
    marker = tmp_path / "child.pid"
    assert marker.exists(), result.output
    child = int(marker.read_text())
    assert_ends(child)
    results = json.loads(result.stdout)["results"]
    assert [r["status"] for r in results] == ["error", "pass"], result.output
    assert results[0]["error"]["kind"] == "crash" and death in results[0]["error"]["message"], results[0]["error"]
    assert result.exit_code == 3


@pytest.mark.slow  # spawns a --watch worker (it imports torch)
@pytest.mark.skipif(not hasattr(os, "killpg") or not Path("/proc").is_dir(), reason="process groups and /proc")
def test_what_the_code_under_test_started_ends_with_its_crashed_watch_worker(user_module, write_spec, tmp_path):
    """The same for `--watch`'s worker: it crashed, was reaped while its death was read, and its group lived on."""
    from gradcheck_cli.run.plan import Task
    from gradcheck_cli.run.watch_worker import Worker
    from gradcheck_cli.spec import load_file

    user_module(USER)
    path = write_spec("function: usermod:ExitsAfterStartingAChild\ninputs: [{shape: [3]}]\n", "specs/00_crash.yaml")
    (case,) = load_file(str(path))
    worker = Worker(threads=1)
    outcome = worker.check(Task(case, "cpu"), timeout=None)
    assert outcome.result.error is not None and outcome.result.error.kind.value == "crash", outcome.result
    assert worker.dead
    child = int((tmp_path / "child.pid").read_text())
    assert_ends(child)
