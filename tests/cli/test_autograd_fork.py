"""Distributed cases on a machine with a GPU (issue 30's GPU run): there, autograd's first backward starts
its device threads, and torch then refuses backward in every process forked after it ("Unable to handle
autograd's threading in combination with fork-based multiprocessing"). The ranks of a distributed case are
forked, so they must come from a process that has not run backward: the first GPU run found every shipped
distributed spec an error, because each worker warms up with a backward before its first task and the
coordinator ran one before forking.

CI has no GPU, so these tests emulate torch's rule on the CPU: a ``sitecustomize`` (imported by every
Python process of the run, the pool's fork server and workers included) wraps autograd's engine so that a
process forked after a backward raises torch's error on its own first backward, as on a GPU machine. The
first test holds that the emulation bites."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]

EMULATION = textwrap.dedent(
    '''
    """torch's autograd-and-fork rule on a machine with a GPU, emulated on the CPU (tests/cli/test_autograd_fork.py)."""
    import os

    import torch
    from torch.autograd.variable import Variable

    _engine = Variable._execution_engine
    _state = {"started": False, "bad": False}


    def _forked():
        _state["bad"] = _state["started"]


    os.register_at_fork(after_in_child=_forked)


    class _Engine:
        def __getattr__(self, name):
            return getattr(_engine, name)

        def run_backward(self, *args, **kwargs):
            if _state["bad"]:
                raise RuntimeError(
                    "Unable to handle autograd's threading in combination with fork-based multiprocessing. "
                    "See https://github.com/pytorch/pytorch/wiki/Autograd-and-Fork"
                )
            _state["started"] = True
            return _engine.run_backward(*args, **kwargs)


    Variable._execution_engine = _Engine()
    '''
)

pytestmark = pytest.mark.skipif(not hasattr(os, "fork"), reason="forked ranks need os.fork")


@pytest.fixture
def gpu_like(tmp_path: Path) -> dict[str, str]:
    """An environment whose Python processes follow torch's autograd-and-fork rule as on a GPU machine."""
    folder = tmp_path / "emulation"
    folder.mkdir()
    (folder / "sitecustomize.py").write_text(EMULATION, encoding="utf-8")
    path = os.pathsep.join([str(folder), str(ROOT), os.environ.get("PYTHONPATH", "")])
    return {**os.environ, "PYTHONPATH": path}


def gradcheck(env: dict[str, str], *args: str, shrink: str = "") -> subprocess.CompletedProcess[str]:
    how = ["--shrink", shrink] if shrink else ["--no-shrink"]
    command = [sys.executable, "-m", "gradcheck_cli", *args, "--format", "json", *how]
    return subprocess.run(command, cwd=ROOT, env=env, capture_output=True, text=True, timeout=900)


def test_the_emulation_refuses_backward_in_a_process_forked_after_one(gpu_like: dict[str, str]) -> None:
    script = textwrap.dedent(
        """
        import os, torch
        def grad():
            x = torch.ones(2, requires_grad=True)
            return torch.autograd.grad((x * x).sum(), x)[0].tolist()
        pid = os.fork()
        if pid == 0:  # forked before any backward: fine
            os._exit(0 if grad() == [2.0, 2.0] else 1)
        assert os.waitpid(pid, 0)[1] == 0
        grad()
        pid = os.fork()
        if pid == 0:  # forked after one: refused, as torch does on a GPU machine
            try:
                grad()
            except RuntimeError as exc:
                os._exit(7 if "fork-based multiprocessing" in str(exc) else 1)
            os._exit(1)
        assert os.waitpid(pid, 0)[1] >> 8 == 7
        print("ok")
        """
    )
    done = subprocess.run([sys.executable, "-c", script], env=gpu_like, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0 and done.stdout.strip() == "ok", done.stderr


@pytest.mark.slow
def test_distributed_cases_pass_where_forked_ranks_cannot_follow_a_backward(gpu_like: dict[str, str]) -> None:
    # one worker for all: it checks relu (a backward) before the distributed cases, as a batch does
    done = gradcheck(gpu_like, "specs/relu.yaml", "specs/distributed.yaml", "-j", "1")
    report = json.loads(done.stdout)
    statuses = {r["id"]: r["status"] for r in report["results"]}
    distributed = {k: v for k, v in statuses.items() if "distributed.yaml" in k}
    assert len(distributed) >= 10 and any("relu.yaml" in k for k in statuses), statuses
    assert set(distributed.values()) <= {"pass", "skip"} and "pass" in distributed.values(), [
        (r["id"], r["error"]) for r in report["results"] if r["error"]
    ]
    assert done.returncode == 0, done.stderr


def test_in_process_the_refusal_is_said_as_what_it_is(gpu_like: dict[str, str]) -> None:
    done = gradcheck(gpu_like, "specs/relu.yaml", "specs/distributed.yaml", "--no-isolate", "-k", "Copy")
    report = json.loads(done.stdout)
    errors = [r["error"] for r in report["results"] if r["error"]]
    assert errors, report["summary"]
    for error in errors:
        assert error["kind"] == "device", error
        assert "forked from a process that had run backward on a machine with a GPU" in error["message"]
        assert "leave out --no-isolate" in error["message"]
    assert done.returncode != 0


@pytest.mark.parametrize("isolation", ["-j1", "--no-isolate"])
def test_a_failure_is_shrunk_where_forked_children_cannot_run_backward(
    gpu_like: dict[str, str], isolation: str
) -> None:
    """The search for a smaller failing case ran in a forked child, which found nothing on a GPU machine (its
    every attempt refused); there it runs in the worker itself."""
    done = gradcheck(gpu_like, "broken-specs/linear_double_bias.yaml", isolation, shrink="120")
    (result,) = json.loads(done.stdout)["results"]
    assert result["status"] == "fail" and done.returncode == 1, done.stderr
    assert result["shrunk"] is not None, result
    assert result["shrunk"]["shapes"] == {"input": [1, 1], "weight": [1, 1], "bias": [1]}
