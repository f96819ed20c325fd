"""What user code returns is user input, never an internal error (issue 28, item 3): an 8-bit float
output, a reference that returns integers, booleans, complex values for a real target, or NaN, and a
forward that runs out of memory on the CPU are each an error result of the right kind (exit 3), with a
message that names the value, never exit 4."""

from __future__ import annotations

import json

import pytest

MODULE = '''
import torch

class Double(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x):
        return x * 2
    @staticmethod
    def backward(ctx, g):
        return g * 2

class Float8Out(Double):
    @staticmethod
    def forward(ctx, x):
        return (x * 2).to(torch.float8_e4m3fn)

class CpuOutOfMemory(Double):
    @staticmethod
    def forward(ctx, x):
        return x * torch.empty(2**45, dtype=torch.float64).sum()  # 256 TiB: torch's allocator refuses at once

class PythonOutOfMemory(Double):
    @staticmethod
    def forward(ctx, x):
        raise MemoryError()

class SparseGradient(Double):
    """backward returns a sparse gradient, as nn.Embedding(sparse=True) does; autograd accepts it"""
    @staticmethod
    def backward(ctx, g):
        return (g * 2).to_sparse()

class SparseGradientWrong(Double):
    @staticmethod
    def backward(ctx, g):
        return (g * 3).to_sparse()

def twice(x):
    return x * 2

def as_int(x):
    return (x * 2).to(torch.int64)

def as_bool(x):
    return x > 0

def as_complex(x):
    return (x * 2).to(torch.complex128)

def nan(x):
    return x * float("nan")

def nan_at_one(x):
    return torch.where(x == x.flatten()[1], float("nan"), x * 2)
'''


@pytest.fixture
def run(invoke):
    def run(*args: str) -> tuple[int, dict]:
        got = invoke(*args, "--format", "json", "-i", "4x3")
        return got.exit_code, json.loads(got.stdout)

    return run


def only_error(report: dict) -> dict:
    (result,) = report["results"]
    assert result["error"] is not None, result
    return result["error"]


@pytest.mark.parametrize(
    "function,kind,words",
    [
        ("Float8Out", "forward", "forward returned a float8_e4m3fn tensor (output 0): 8-bit floats"),
        ("CpuOutOfMemory", "out_of_memory", "DefaultCPUAllocator: can't allocate memory"),
        ("PythonOutOfMemory", "out_of_memory", "forward raised MemoryError"),
    ],
)
def test_a_forward_that_cannot_be_judged_or_runs_out_of_memory_is_an_error_of_its_kind(
    user_module, run, function, kind, words
):
    mod = user_module(MODULE)
    code, report = run(f"{mod}:{function}")
    error = only_error(report)
    assert code == 3 and error["kind"] == kind and words in error["message"], error


@pytest.mark.parametrize(
    "reference,words",
    [
        ("as_int", "output 0 of the reference usermod:as_int is int64, the target's is float64"),
        ("as_bool", "output 0 of the reference usermod:as_bool is bool, the target's is float64"),
        ("as_complex", "output 0 of the reference usermod:as_complex is complex128, the target's is float64"),
        (
            "nan",
            "output 0 of the reference usermod:nan is NaN or infinite at [0, 0] where the target's is finite "
            "(12 of 12 values)",
        ),
        (
            "nan_at_one",
            "output 0 of the reference usermod:nan_at_one is NaN or infinite at [0, 1] where the target's "
            "is finite (1 of 12 values)",
        ),
    ],
)
def test_a_reference_that_cannot_judge_is_a_reference_error_not_a_failure_of_the_target(
    user_module, run, reference, words
):
    mod = user_module(MODULE)
    code, report = run(f"{mod}:Double", "--reference", f"{mod}:{reference}", "--check", "reference")
    error = only_error(report)
    assert code == 3 and error["kind"] == "reference" and words in error["message"], error


def test_a_right_reference_still_passes_the_target(user_module, run):
    mod = user_module(MODULE)
    code, report = run(f"{mod}:Double", "--reference", f"{mod}:twice", "--check", "reference")
    assert code == 0 and report["results"][0]["status"] == "pass"


@pytest.mark.parametrize("function,status", [("SparseGradient", "pass"), ("SparseGradientWrong", "fail")])
def test_a_sparse_gradient_is_judged_by_its_values(user_module, run, function, status):
    # it was exit 4 (torch.equal and comparisons do not run on sparse tensors)
    mod = user_module(MODULE)
    code, report = run(
        f"{mod}:{function}", "--check", "backward", "--check", "double_backward", "--check", "undefined_grad"
    )
    (result,) = report["results"]
    assert result["error"] is None, result["error"]
    assert {c["check"]: c["status"] for c in result["checks"]}["backward"] == status
    assert code == (0 if status == "pass" else 1)
