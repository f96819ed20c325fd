"""Issue 14, items 4, 9, 10, 12 (options), 14, 15, 17: forks, processes, signals, timeouts and -j.

Each test ran against the code before its fix and failed there: results were filed in arrival order
(a forking Function's child reported too), processes started by user code outlived the run, SIGTERM
and Ctrl-C lost every finished result, a timed-out case said it took 0 s, --timeout nan was
accepted, --junit-xml into a missing folder failed after the whole run, and under --no-isolate a
write to file descriptor 1 corrupted the JSON report.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from gradcheck_cli.run import pool
from tests.corpus import Square, module_source

try:  # tests/ on sys.path (rootdir-style collection) or tests/ as a package
    from procs import alive
except ImportError:  # pragma: no cover
    from tests.procs import alive


USER = (
    module_source(Square)
    + """
import os, subprocess, sys, time
from pathlib import Path

HERE = Path(__file__).parent


class Wrong(Square):
    @staticmethod
    def backward(ctx, g):
        (x,) = ctx.saved_tensors
        return 3 * x * g


FORKED = []


class Forks(Square):  # once per process: the child returns from forward and goes on like its parent
    @staticmethod
    def forward(ctx, x):
        if not FORKED:
            FORKED.append(True)
            os.fork()
        ctx.save_for_backward(x)
        return x * x


class StartsSleeper(Square):  # a child process, and a grandchild that outlives its parent
    @staticmethod
    def forward(ctx, x):
        if not (HERE / "sleeper.pid").exists():
            child = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(600)"])
            (HERE / "sleeper.pid").write_text(str(child.pid))
            grand = subprocess.Popen([sys.executable, "-c",
                                      "import subprocess, sys; p = subprocess.Popen([sys.executable, '-c', "
                                      "'import time; time.sleep(600)']); print(p.pid)"],
                                     stdout=subprocess.PIPE, text=True)
            (HERE / "orphan.pid").write_text(grand.stdout.readline().strip())
            grand.wait()
        ctx.save_for_backward(x)
        return x * x


class Hangs(Square):
    @staticmethod
    def forward(ctx, x):
        (HERE / "hanging.pid").write_text(str(os.getpid()))
        while True:
            time.sleep(0.05)


class WritesToFd1(Square):
    @staticmethod
    def forward(ctx, x):
        os.write(1, b"raw bytes on file descriptor 1\\n")
        ctx.save_for_backward(x)
        return x * x


class RaisesKeyboardInterrupt(Square):
    @staticmethod
    def forward(ctx, x):
        raise KeyboardInterrupt


class MyBase(BaseException):
    pass


class RaisesBaseException(Square):
    @staticmethod
    def forward(ctx, x):
        raise MyBase("not an Exception")


class RaisesGeneratorExit(Square):
    @staticmethod
    def forward(ctx, x):
        raise GeneratorExit


class DefaultDeviceMeta(Square):  # leaves a default device under which gradcheck-cli's own tensors break
    @staticmethod
    def backward(ctx, g):
        (x,) = ctx.saved_tensors
        torch.set_default_device("meta")
        return 2 * x * g


def _sleep():
    time.sleep(600)


class UsesMultiprocessing(Square):  # a worker of ours is no daemon: user code may start processes
    @staticmethod
    def forward(ctx, x):
        import multiprocessing
        p = multiprocessing.get_context("spawn").Process(target=time.sleep, args=(0.1,))
        p.start()
        p.join()
        ctx.save_for_backward(x)
        return x * x


class SetsidDaemon(Square):  # forks twice and leaves the process group: adopted by the worker, then ended
    @staticmethod
    def forward(ctx, x):
        if not (HERE / "daemon.pid").exists():
            subprocess.Popen(["sh", "-c", "setsid sh -c 'echo $$ > daemon.pid; exec sleep 600' & exit 0"],
                             cwd=HERE).wait()
            while not (HERE / "daemon.pid").exists() or not (HERE / "daemon.pid").read_text().strip():
                time.sleep(0.01)
        ctx.save_for_backward(x)
        return x * x
"""
)


def spec(write_spec, *functions: str) -> None:
    for k, name in enumerate(functions):
        write_spec(f"function: usermod:{name}\ninputs: [{{shape: [3]}}]\n", f"specs/{k:02d}_{name.lower()}.yaml")


def statuses(stdout: str) -> list[tuple[str, str]]:
    return [(Path(r["spec"]).stem, r["status"]) for r in json.loads(stdout)["results"]]


@pytest.mark.parametrize("mode", [["-j", "1"], ["-j", "2"], ["--no-isolate"]])
def test_a_forking_function_costs_no_result_and_adds_none(user_module, write_spec, tmp_path, mode):
    user_module(USER)
    spec(write_spec, "Forks", "Wrong", "Square", "Forks", "Square")
    proc = subprocess.run(
        [sys.executable, "-m", "gradcheck_cli", "specs/", "--format", "json", *mode],
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert statuses(proc.stdout) == [
        ("00_forks", "pass"),
        ("01_wrong", "fail"),
        ("02_square", "pass"),
        ("03_forks", "pass"),
        ("04_square", "pass"),
    ], proc.stderr
    assert proc.returncode == 1
    assert "Traceback" not in proc.stderr, proc.stderr


@pytest.mark.parametrize("mode", [["-j", "1"], ["--no-isolate"]])
def test_processes_the_code_under_test_starts_end_with_its_case(user_module, write_spec, invoke, tmp_path, mode):
    user_module(USER)
    spec(write_spec, "StartsSleeper", "Square")
    result = invoke("specs/", "--format", "json", *mode)
    assert [s for _, s in statuses(result.stdout)] == ["pass", "pass"], result.output
    pids = [int((tmp_path / name).read_text()) for name in ("sleeper.pid", "orphan.pid")]
    # in this process (--no-isolate) the orphan left the process tree: nothing ends it, so the wait is for the
    # child alone (waiting for the orphan too always ran to the deadline)
    ended = pids[:1] if "--no-isolate" in mode else pids
    deadline = time.monotonic() + 120  # a bound for a broken run only: the wait ends on the event
    while any(alive(p) for p in ended) and time.monotonic() < deadline:
        time.sleep(0.05)
    if "--no-isolate" in mode:  # the orphan left this process's tree: only an isolated worker's group holds it
        assert not alive(pids[0])
        os.kill(pids[1], signal.SIGKILL)
    else:
        left = {p: Path(f"/proc/{p}/stat").read_text() for p in pids if alive(p)}
        assert not left, left
    warnings = json.loads(result.stdout)["results"][0]["warnings"]
    assert any("processes left running" in w for w in warnings), warnings


@pytest.mark.parametrize("signum, code", [(signal.SIGTERM, 143), (signal.SIGINT, 130)])
def test_an_interrupt_reports_what_finished_and_ends_the_workers(
    user_module, write_spec, tmp_path, signum, code, gradcheck_argv
):
    user_module(USER)
    spec(write_spec, "Square", "Wrong", "Hangs", "Square")
    proc = subprocess.Popen(
        [*gradcheck_argv, "specs/", "--format", "json", "-j", "1", "--junit-xml", "out/junit.xml"],
        cwd=tmp_path,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    (tmp_path / "out").mkdir()
    marker = tmp_path / "hanging.pid"
    deadline = time.monotonic() + 300  # a bound for a broken run only
    while not marker.exists() and time.monotonic() < deadline:
        time.sleep(0.05)
    time.sleep(0.2)
    proc.send_signal(signum)
    stdout, stderr = proc.communicate(timeout=600)  # a bound for a hung run only, not a speed
    assert proc.returncode == code, stderr
    report = json.loads(stdout)
    assert statuses(stdout) == [("00_square", "pass"), ("01_wrong", "fail")]
    assert report["summary"]["not_run"] == 2 and report["summary"]["interrupted"] == signum.name
    assert (tmp_path / "out" / "junit.xml").read_text().count("<testcase") == 2
    hanging = int(marker.read_text())
    deadline = time.monotonic() + 120  # a bound for a broken run only: the wait ends on the event
    while alive(hanging) and time.monotonic() < deadline:
        time.sleep(0.05)
    assert not alive(hanging)
    assert "Traceback" not in stderr, stderr


def test_an_interrupt_in_process_keeps_the_report(user_module, write_spec, invoke):
    user_module(USER)
    spec(write_spec, "Square", "RaisesKeyboardInterrupt", "Square")
    result = invoke("specs/", "--format", "json", "--no-isolate")
    assert result.exit_code == 130
    assert statuses(result.stdout) == [("00_square", "pass")]
    assert json.loads(result.stdout)["summary"]["not_run"] == 2


def test_no_isolate_keeps_file_descriptor_1_for_the_report(user_module, write_spec, tmp_path):
    user_module(USER)
    spec(write_spec, "WritesToFd1", "Square")
    proc = subprocess.run(
        [sys.executable, "-m", "gradcheck_cli", "specs/", "--format", "json", "--no-isolate"],
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert statuses(proc.stdout) == [("00_writestofd1", "pass"), ("01_square", "pass")]
    assert "raw bytes on file descriptor 1" in proc.stderr


def test_a_timed_out_case_says_how_long_it_ran(user_module, write_spec, invoke):
    user_module(USER)
    spec(write_spec, "Hangs")
    result = invoke("specs/", "--format", "json", "--timeout", "1")
    (r,) = json.loads(result.stdout)["results"]
    assert r["error"]["kind"] == "timeout" and r["duration_s"] >= 1.0


def test_cases_have_a_timeout_by_default(invoke):
    result = invoke("check", "--help")
    assert "--timeout SECONDS" in result.output and "[default: 300]" in result.output


@pytest.mark.parametrize("value", ["nan", "-1", "soon"])
def test_a_timeout_that_is_no_number_of_seconds_is_a_usage_error(invoke, value):
    result = invoke("check", "x.yaml", "--timeout", value)
    assert result.exit_code == 2 and "--timeout" in result.output and "0 or inf: no limit" in result.output


@pytest.mark.parametrize("value", ["inf", "0", "1e10"])
def test_a_timeout_of_no_limit_or_a_huge_one_runs(user_module, write_spec, invoke, value):
    user_module(USER)
    spec(write_spec, "Square")
    assert invoke("specs/", "--timeout", value, "-j", "1").exit_code == 0


def test_junit_into_a_missing_folder_is_refused_before_the_run(user_module, write_spec, invoke):
    user_module(USER)
    spec(write_spec, "Square")
    result = invoke("specs/", "--junit-xml", "missing/folder/junit.xml")
    assert result.exit_code == 2 and "missing/folder" in result.output and "mkdir -p" in result.output


def test_jobs_are_capped_at_the_usable_cores(user_module, write_spec, invoke, monkeypatch):
    user_module(USER)
    spec(write_spec, "Square", "Square", "Square")
    monkeypatch.setattr(pool, "usable_cores", lambda: 2)
    assert pool.workers_for(1000, 3) == 2 and pool.workers_for(1000, 1) == 1 and pool.workers_for(1, 3) == 1
    result = invoke("specs/", "-j", "1000")
    assert result.exit_code == 0 and "-j 1000: using at most 2 workers" in result.stderr


@pytest.mark.parametrize(
    "name, said", [("RaisesBaseException", "raised MyBase"), ("RaisesGeneratorExit", "raised GeneratorExit")]
)
@pytest.mark.parametrize("mode", [["-j", "1"], ["--no-isolate"]])
def test_a_base_exception_from_user_code_is_that_cases_error(user_module, write_spec, invoke, name, said, mode):
    # --no-isolate: a traceback, no report, exit 1
    user_module(USER)
    spec(write_spec, name, "Square")
    result = invoke("specs/", "--format", "json", *mode)
    first, second = json.loads(result.stdout)["results"]
    assert result.exit_code == 3 and said in first["error"]["message"] and second["status"] == "pass"


def test_keyboard_interrupt_raised_in_a_worker_is_that_cases_error_not_a_kill(user_module, write_spec, invoke):
    # it read "killed by SIGKILL (out of memory?)": our own kill, sent before the exit code was read
    user_module(USER)
    spec(write_spec, "RaisesKeyboardInterrupt", "Square")
    result = invoke("specs/", "--format", "json", "-j", "1")
    first, second = json.loads(result.stdout)["results"]
    assert "raised KeyboardInterrupt" in first["error"]["message"] and second["status"] == "pass"


@pytest.mark.parametrize("mode", [["-j", "1"], ["--no-isolate"]])
def test_a_default_device_set_inside_backward_is_no_internal_error(user_module, write_spec, invoke, mode):
    user_module(USER)
    spec(write_spec, "DefaultDeviceMeta", "Square")
    result = invoke("specs/", "--format", "json", *mode)
    first, second = json.loads(result.stdout)["results"]
    assert result.exit_code != 4 and second["status"] == "pass", result.stdout
    assert any("torch.set_default_device" in w for w in first["warnings"]), first


def test_user_code_in_a_worker_may_start_processes(user_module, write_spec, invoke):
    # "daemonic processes are not allowed to have children": a pass in-process, an error isolated
    user_module(USER)
    spec(write_spec, "UsesMultiprocessing")
    result = invoke("specs/", "--format", "json", "-j", "1")
    assert result.exit_code == 0, result.stdout


def test_a_daemon_that_left_the_process_group_ends_with_its_case(user_module, write_spec, invoke, tmp_path):
    user_module(USER)
    spec(write_spec, "SetsidDaemon")
    result = invoke("specs/", "--format", "json", "-j", "1")
    assert result.exit_code == 0, result.stdout
    pid = int((tmp_path / "daemon.pid").read_text())
    deadline = time.monotonic() + 120  # a bound for a broken run only: the wait ends on the event
    while alive(pid) and time.monotonic() < deadline:
        time.sleep(0.05)
    if alive(pid):
        os.kill(pid, signal.SIGKILL)
        pytest.fail("the daemon outlived its case")


def _in_session(sid: int) -> list[str]:
    """The processes of session ``sid``, as `pid command` lines (Linux's /proc)."""
    found = []
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                fields = (entry / "stat").read_text().rsplit(")", 1)[1].split()
                if int(fields[3]) == sid and fields[0] != "Z":
                    command = (entry / "cmdline").read_bytes().replace(bytes(1), b" ")[:80]
                    found.append(f"{entry.name} {command!r}")
            except (OSError, IndexError, ValueError):
                continue
    return found


@pytest.mark.skipif(
    not Path("/proc").is_dir() or pool.start_method() != "forkserver", reason="Linux's /proc, forkserver"
)
def test_no_process_outlives_a_gradcheck_killed_with_sigkill(user_module, write_spec, tmp_path):
    """issue 31 item 12: the fork server, the resource tracker and a worker in a loop stayed alive under
    init after the gradcheck process was SIGKILLed (a forked worker's parent is the fork server, so its
    PR_SET_PDEATHSIG never fired)"""
    user_module(USER)
    spec(write_spec, "Hangs")
    proc = subprocess.Popen(
        [sys.executable, "-m", "gradcheck_cli", "specs/", "-j", "1", "--timeout", "0"],
        cwd=tmp_path,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
        start_new_session=True,
    )
    marker = tmp_path / "hanging.pid"
    deadline = time.monotonic() + 300  # a bound for a broken run only: the case writes the marker when it starts
    while not marker.exists() and time.monotonic() < deadline:
        time.sleep(0.05)
    assert marker.exists()
    assert len(_in_session(proc.pid)) >= 3  # gradcheck, the fork server, the worker (and the resource tracker)
    proc.kill()
    proc.wait()
    deadline = time.monotonic() + 300
    while _in_session(proc.pid) and time.monotonic() < deadline:
        time.sleep(0.05)
    assert _in_session(proc.pid) == []


INTERRUPT_ON_IMPORT = """
import importlib.abc, os, signal, sys

class _CtrlC(importlib.abc.MetaPathFinder):
    def find_spec(self, name, path=None, target=None):
        if name == {module!r}:
            sys.meta_path.remove(self)
            os.kill(os.getpid(), signal.SIGINT)  # Ctrl-C while the command line is still being imported
        return None

sys.meta_path.insert(0, _CtrlC())
"""


@pytest.mark.parametrize("module", ["click", "rich", "yaml"])
def test_ctrl_c_while_the_command_line_starts_exits_130_without_a_traceback(tmp_path, module):
    """A cancelled CI job must not read as a failed check: Ctrl-C in the first ~0.3 s printed a
    KeyboardInterrupt traceback (while imports run) or exited 1 with click's "Aborted!"."""
    site = tmp_path / "site"
    site.mkdir()
    (site / "sitecustomize.py").write_text(INTERRUPT_ON_IMPORT.format(module=module))
    (tmp_path / "specs").mkdir()
    (tmp_path / "specs" / "s.yaml").write_text("function: torch.sin\ninputs: [{name: x, shape: [3]}]\n")
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(site), *sys.path])}
    done = subprocess.run(
        [sys.executable, "-m", "gradcheck_cli", "specs/"], cwd=tmp_path, env=env, capture_output=True, text=True
    )
    assert done.returncode == 130, (done.returncode, done.stderr[-3000:])
    assert "Traceback" not in done.stderr and "Aborted!" not in done.stderr, done.stderr


def test_ctrl_c_before_the_first_case_exits_130_not_click_s_1(monkeypatch, tmp_path, capsys):
    """Between the command line's start and the run's own handling (reading specs, planning), click turned
    KeyboardInterrupt into "Aborted!" and exit 1."""
    from gradcheck_cli import cli
    from gradcheck_cli.run import plan

    (tmp_path / "s.yaml").write_text("function: torch.sin\ninputs: [{name: x, shape: [3]}]\n")

    def interrupted(*args, **kwargs):
        raise KeyboardInterrupt

    monkeypatch.setattr(plan, "expand", interrupted)
    with pytest.raises(SystemExit) as stopped:
        cli.main(["check", str(tmp_path / "s.yaml")])
    assert stopped.value.code == 130
    assert "Aborted!" not in capsys.readouterr().err
