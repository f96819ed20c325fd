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

from gradcheck_cli import pool, processes, runner
from gradcheck_cli.distributed import check as distributed_check
from gradcheck_cli.results import Status
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
        "import ctypes, signal; from gradcheck_cli import processes; "
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
        assert child.pid in with_proc and without == with_proc
        processes.end(without)
        child.wait(timeout=120)  # a bound for a broken run only: it ends at once
    finally:
        if child.poll() is None:
            os.kill(child.pid, 9)
            child.wait()
