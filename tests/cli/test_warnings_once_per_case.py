"""A Function's own ``warnings.warn`` in forward and backward reaches stderr once per case under ``--check all``.

Before the fix each warning was printed once per check (and more: every change of the warning filters made
Python forget that it had shown it), about sixteen times for one case; the verdicts stay what they were.
"""

from __future__ import annotations

import subprocess
import sys

import pytest

USER = """
import warnings
import torch


class Warns(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x):
        warnings.warn("forward says hello")
        ctx.save_for_backward(x)
        return x * x

    @staticmethod
    def backward(ctx, g):
        warnings.warn("backward says hello")
        (x,) = ctx.saved_tensors
        return 2 * x * g


class WarnsWrong(Warns):
    @staticmethod
    def backward(ctx, g):
        warnings.warn("backward says hello")
        (x,) = ctx.saved_tensors
        return 3 * x * g
"""


@pytest.mark.slow
@pytest.mark.parametrize("mode", [["-j", "1"], ["--no-isolate"]])
@pytest.mark.parametrize(("function", "code"), [("Warns", 0), ("WarnsWrong", 1)])
def test_a_user_warning_is_printed_once_per_case(user_module, tmp_path, mode, function, code):
    user_module(USER)
    command = ["-m", "gradcheck_cli", f"usermod:{function}", "-i", "4", "--check", "all", "--no-shrink", *mode]
    proc = subprocess.run([sys.executable, *command], cwd=tmp_path, capture_output=True, text=True, timeout=300)
    assert proc.returncode == code, proc.stdout + proc.stderr
    lines = proc.stderr.splitlines()
    assert sum("UserWarning: forward says hello" in line for line in lines) == 1, proc.stderr
    assert sum("UserWarning: backward says hello" in line for line in lines) == 1, proc.stderr


CONTEXT = """
import warnings
import torch


class NoteInBackward(torch.autograd.Function):  # torch's note, as its autograd GPU thread gives it on a GPU machine
    @staticmethod
    def forward(ctx, x):
        return x * 2

    @staticmethod
    def backward(ctx, g):
        warnings.warn(
            "Attempting to run cuBLAS, but there was no current CUDA context! Attempting to set the primary "
            "context... (Triggered internally at /pytorch/aten/src/ATen/cuda/CublasHandlePool.cpp:335.)"
        )
        warnings.warn("the user's own note")
        return g * 2
"""


def test_torchs_note_on_the_cuda_context_of_its_threads_is_not_printed(user_module, tmp_path):
    """Issue 30 item 5: on a GPU machine torch notes that autograd's GPU thread had no current CUDA context
    (it was started by a backward before CUDA was initialised) and sets it itself: not the user's to fix."""
    user_module(CONTEXT)
    command = ["-m", "gradcheck_cli", "usermod:NoteInBackward", "-i", "3", "--no-shrink", "--no-isolate"]
    proc = subprocess.run([sys.executable, *command], cwd=tmp_path, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "cuBLAS" not in proc.stderr and "the user's own note" in proc.stderr
