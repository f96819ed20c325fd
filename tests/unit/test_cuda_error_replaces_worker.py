"""A process whose case ended in a CUDA error is replaced before its next case, whichever worker runs it: the
pool's asks the result and ``state_guard.GUARD.tainted()``, ``--watch``'s asks ``tainted()`` alone (watch_worker.py), so
the error taints the process (a device-side assert leaves the GPU context unusable: every later case there would
fail). Emulated on the CPU: the error is the message torch gives, which ``errors.device_kind`` reads."""

from __future__ import annotations

import pytest

from gradcheck_cli.results import ErrorKind, Status
from gradcheck_cli.run import runner
from gradcheck_cli.run.plan import Task
from gradcheck_cli.sandbox import state_guard
from gradcheck_cli.spec import load_file

SOURCE = """
import torch

class Asserting(torch.autograd.Function):  # its kernel's device-side assert, as torch raises it
    @staticmethod
    def forward(ctx, x):
        raise RuntimeError("CUDA error: device-side assert triggered")
    @staticmethod
    def backward(ctx, g):
        return g

class Right(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x):
        return 3 * x
    @staticmethod
    def backward(ctx, g):
        return 3 * g
"""


@pytest.fixture
def task(user_module, write_spec, monkeypatch):
    user_module(SOURCE, "review2mod")
    monkeypatch.setattr(state_guard.GUARD, "_tainted", [])  # this process's own, put back after the test

    def make(function: str) -> Task:
        path = write_spec(f"function: review2mod:{function}\ninputs:\n  - shape: [3]\n", f"{function.lower()}.yaml")
        (case,) = load_file(str(path))
        return Task(case, "cpu")

    return make


def test_a_case_that_ends_in_a_cuda_error_taints_its_process(task):
    result = runner.run_task(task("Asserting"))
    assert result.status is Status.ERROR and result.error is not None and result.error.kind is ErrorKind.CUDA
    (why,) = state_guard.GUARD.tainted()  # --watch's worker is replaced before its next case
    assert why.startswith("a CUDA error in a case: ") and "device-side assert triggered" in why


def test_a_case_that_passes_or_fails_otherwise_leaves_its_process_as_it_was(task):
    assert runner.run_task(task("Right")).status is Status.PASS
    assert not state_guard.GUARD.tainted()
