"""Platforms other than Linux (issue 45 item 3), tested here on Linux by faking what the code asks: a platform
without PR_SET_PDEATHSIG (macOS) or without ``ctypes.CDLL(None)``, SIGKILL, process groups and fork
(Windows), and the pool's workers spawned, as where there is no fork server."""

from __future__ import annotations

import ctypes
import importlib
import json
import os
import signal
import subprocess
import sys
from collections.abc import Iterator

import pytest

from gradcheck_cli.distributed import check as distributed_check
from gradcheck_cli.results import Status
from gradcheck_cli.run import pool, runner
from gradcheck_cli.sandbox import processes
from gradcheck_cli.spec import Case, load_file


def _no_cdll(name: object = None, *args: object, **kwargs: object) -> None:
    raise TypeError("LoadLibrary() argument 1 must be str, not None")  # what Windows raises for CDLL(None)


@pytest.mark.parametrize("platform", ["win32", "darwin"])
def test_a_worker_leads_its_group_where_linux_s_process_controls_do_not_exist(monkeypatch, platform):
    """Every worker calls ``lead_group``: on Windows ``ctypes.CDLL(None)`` raised an uncaught TypeError."""
    monkeypatch.setattr(sys, "platform", platform)
    monkeypatch.setattr(ctypes, "CDLL", _no_cdll)
    if platform == "win32":
        monkeypatch.delattr(os, "setpgrp", raising=False)  # Windows has none (and this test's group stays)
    else:
        monkeypatch.setattr(os, "setpgrp", lambda: None)
    processes.lead_group()
    assert processes.die_with_parent() is None


def test_on_linux_the_death_signal_is_set():
    """The Linux path is still taken (in a child: the signal would otherwise stay set on this test process)."""
    code = (
        "import ctypes, signal; from gradcheck_cli.sandbox import processes; "
        "libc = processes.die_with_parent(); out = ctypes.c_int(); libc.prctl(2, ctypes.byref(out)); "
        "print(out.value == signal.SIGKILL)"
    )
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert done.stdout.strip() == "True", done.stderr


@pytest.fixture
def no_sigkill(monkeypatch) -> Iterator[None]:
    """``processes`` as imported where the signal module has no SIGKILL (Windows), then as it was."""
    monkeypatch.delattr(signal, "SIGKILL")
    importlib.reload(processes)
    yield
    monkeypatch.undo()
    importlib.reload(processes)


def test_processes_end_where_there_is_no_sigkill(no_sigkill, monkeypatch):
    """``end`` and ``end_group`` (no process groups: Windows' branch) used signal.SIGKILL, which Windows lacks."""
    assert processes.KILL == signal.SIGTERM  # os.kill with it is TerminateProcess on Windows
    monkeypatch.delattr(os, "killpg")
    for ender in (lambda pid: processes.end(frozenset({pid})), processes.end_group):
        child = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(600)"])
        try:
            ender(child.pid)
            child.wait(timeout=120)  # it ends at once (ended, or reaped by ``end``): a bound for a broken run only
        finally:
            if child.poll() is None:
                os.kill(child.pid, 9)
                child.wait()


def test_a_distributed_case_is_a_skip_with_the_reason_where_the_system_cannot_fork(write_spec, monkeypatch):
    """The ranks are forked: on Windows ``os.fork()`` was called unguarded (an AttributeError, exit 4)."""
    (case,) = load_file(
        write_spec(
            "function: gradcheck_cli.examples.distributed:ColumnParallelLinear\ndistributed: {world_size: 2}\n"
            "inputs: [{name: x, shape: [2, 3]}, {name: w, shape: [4, 3], placement: shard(0)},"
            " {name: b, shape: [4], placement: shard(0)}]\noutputs: [shard(-1)]\n"
        )
    )
    assert isinstance(case, Case), str(case)
    monkeypatch.delattr(os, "fork")
    monkeypatch.setattr(sys, "platform", "win32")
    said = distributed_check.unavailable("gloo", "cpu", 2)
    assert said == "the ranks are forked processes, and win32 cannot fork: run distributed cases on Linux or macOS"
    result = runner.run_case(case, "cpu")
    assert result.status is Status.SKIP and result.error is None, str(result)
    assert said in str(result), str(result)


SPECS = {
    "right.yaml": "function: gradcheck_cli.examples.linear:LinearFunction\n"
    "inputs: [{name: x, shape: [3, 4]}, {name: w, shape: [2, 4]}, {name: b, shape: [2]}]\n",
    "wrong.yaml": "function: gradcheck_cli.examples.broken:MulConstantSignFlip\n"
    "inputs: [{name: x, shape: [3]}, {name: c, value: 2.0}]\n",
    "raises.yaml": "function: builtins:len\ninputs: [{name: x, shape: [3]}]\n",
}


def _verdicts(invoke, *args: str) -> dict[str, str]:
    run = invoke("specs/", "--format", "json", *args)
    assert run.exit_code in (1, 3), run.output
    return {r["id"]: r["status"] for r in json.loads(run.stdout)["results"]}


@pytest.mark.parametrize("jobs", ["1", "2"])
def test_spawned_workers_give_the_forked_workers_verdicts(write_spec, invoke, monkeypatch, tmp_path, jobs):
    """Where there is no fork server (Windows), workers are spawned: each imports torch and the target itself."""
    monkeypatch.chdir(tmp_path)
    for name, text in SPECS.items():
        write_spec(text, f"specs/{name}")
    forked = _verdicts(invoke, "-j", jobs)
    monkeypatch.setattr(pool, "start_method", lambda: "spawn")
    spawned = _verdicts(invoke, "-j", jobs)
    assert spawned == forked
    assert sorted(forked.values()) == ["error", "fail", "pass"], forked


def test_the_processes_user_code_started_are_found_without_proc(monkeypatch, tmp_path):
    """Where there is no /proc (macOS, Windows), the process tree comes from psutil: the same children found,
    and ended with their case (before, nothing was found, and a case's children outlived it)."""
    child = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(600)"])
    try:
        with_proc = processes.started()
        monkeypatch.setattr(processes, "PROC", tmp_path / "no-proc")
        without = processes.started()
        assert child.pid in with_proc and child.pid in without  # other children of this process may come and go
        processes.end(frozenset({child.pid}) & without)
        child.wait(timeout=120)  # a bound for a broken run only: it ends at once
    finally:
        if child.poll() is None:
            os.kill(child.pid, 9)
            child.wait()


FAKED_WINDOWS = """
import ctypes, multiprocessing, multiprocessing.context as context, os
for name in ("fork", "forkpty", "setpgrp", "killpg", "getpgid", "getpgrp", "waitid"):
    if hasattr(os, name):
        delattr(os, name)
class _CDLL(ctypes.CDLL):
    def __init__(self, name, *args, **kwargs):
        if name is None:
            raise TypeError("LoadLibrary() argument 1 must be str, not None")
        super().__init__(name, *args, **kwargs)
ctypes.CDLL = _CDLL
context._concrete_contexts.pop("forkserver", None)
multiprocessing.set_start_method("spawn", force=True)
context._default_context.get_all_start_methods = lambda: ["spawn"]
"""
RUN_AS_WINDOWS = """
import importlib, pkgutil, runpy, sys
import click, rich, multiprocessing.connection, multiprocessing.popen_spawn_posix, subprocess
import gradcheck_cli
for m in pkgutil.walk_packages(gradcheck_cli.__path__, "gradcheck_cli."):  # what reads sys.platform at import
    if ".examples" not in m.name and m.name != "gradcheck_cli.__main__":
        importlib.import_module(m.name)
sys.platform = "win32"
from gradcheck_cli.sandbox import processes
processes.PROC = processes.Path("/no-proc")
sys.argv = ["gradcheck", *sys.argv[1:]]
runpy.run_module("gradcheck_cli", run_name="__main__", alter_sys=True)
"""


def test_a_batch_on_a_faked_windows_gives_every_verdict(tmp_path):
    """End to end where every process lacks fork, process groups, ``CDLL(None)`` and /proc, and workers are
    spawned (the command line's process also says win32; stdlib and click modules that read it at import are
    imported first): the right Function passes, the wrong one fails (shrunk in the worker itself), the
    distributed case is a skip with the reason, and the exit code is 1."""
    site = tmp_path / "site"
    site.mkdir()
    (site / "sitecustomize.py").write_text(FAKED_WINDOWS)
    (tmp_path / "run.py").write_text(RUN_AS_WINDOWS)
    specs = tmp_path / "specs"
    specs.mkdir()
    for name, text in SPECS.items():
        if name != "raises.yaml":
            (specs / name).write_text(text)
    (specs / "world.yaml").write_text(
        "function: gradcheck_cli.examples.distributed:ColumnParallelLinear\ndistributed: {world_size: 2}\n"
        "inputs: [{name: x, shape: [2, 3]}, {name: w, shape: [4, 3], placement: shard(0)},"
        " {name: b, shape: [4], placement: shard(0)}]\noutputs: [shard(-1)]\n"
    )
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(site), *sys.path])}
    done = subprocess.run(
        [sys.executable, "run.py", "specs/", "-j", "2", "--format", "json"],
        cwd=tmp_path,
        env=env,
        capture_output=True,
        text=True,
        timeout=600,  # a bound for a hung run only
    )
    assert done.returncode == 1, done.stderr[-3000:]
    results = {r["id"].split("::")[0]: r for r in json.loads(done.stdout)["results"]}
    assert {k: r["status"] for k, r in results.items()} == {
        "specs/right.yaml": "pass",
        "specs/wrong.yaml": "fail",
        "specs/world.yaml": "skip",
    }
    assert "cannot fork: run distributed cases on Linux or macOS" in json.dumps(results["specs/world.yaml"])
