"""A Function with an 8-bit float output is judged by the reference check (issue 44, item 8): the reference
check compares gradients (and outputs) with a reference's, with no finite difference through the 8-bit
output, so ``reference_backward:`` and ``reference:`` give its verdict (a right backward passes, a wrong
one fails); a check that differentiates through forward skips it, saying the reference check judges it,
and never hides the reference check's verdict. Named with no reference, finite differences still refuse
it with advice (tests/unit/test_user_values_not_internal.py)."""

from __future__ import annotations

import json

import pytest
import torch

from gradcheck_cli import check
from gradcheck_cli.results import Status

MODULE = """
import torch

F8 = {dtype}

class Cast(torch.autograd.Function):  # y = 2 x, rounded to 8 bits; backward is right
    @staticmethod
    def forward(ctx, x):
        return (x * 2).to(F8)
    @staticmethod
    def backward(ctx, g):
        return g.to(torch.float32) * 2

class CastWrongGrad(Cast):  # backward 1.5x the derivative
    @staticmethod
    def backward(ctx, g):
        return g.to(torch.float32) * 3

class CastWrongForward(Cast):  # forward 1.5x the reference's (backward as the reference's)
    @staticmethod
    def forward(ctx, x):
        return (x * 3).to(F8)

def intended(inputs, grad_outputs):
    (x,), (g,) = inputs, grad_outputs
    return (g.to(x.dtype) * 2,)

def reference(x):
    return (x * 2).to(F8)
"""

DTYPES = ["torch.float8_e4m3fn", "torch.float8_e5m2"]


@pytest.fixture(params=DTYPES, ids=["e4m3fn", "e5m2"])
def mod(request, user_module):
    return user_module(MODULE.format(dtype=request.param), "f8mod")


def spec(write_spec, function: str, key: str, value: str, checks: str = "") -> str:
    path = write_spec(
        f"function: f8mod:{function}\ndtype: float32\n{key}: f8mod:{value}\n{checks}"
        "inputs:\n  - name: x\n    shape: [4, 3]\n",
        f"{function.lower()}.yaml",
    )
    return str(path)


def verdict(invoke, path: str) -> tuple[int, dict]:
    got = invoke(path, "--format", "json")
    report = json.loads(got.stdout)
    (result,) = report["results"]
    return got.exit_code, result


@pytest.mark.parametrize("function, status, code", [("Cast", "pass", 0), ("CastWrongGrad", "fail", 1)])
def test_reference_backward_judges_a_float8_output(mod, write_spec, invoke, function, status, code):
    exit_code, result = verdict(invoke, spec(write_spec, function, "reference_backward", "intended"))
    assert result["error"] is None, result["error"]  # before: "no gradient can be judged through float8"
    assert (exit_code, result["status"]) == (code, status)
    (reference,) = result["checks"]
    assert reference["check"] == "reference" and reference["status"] == status
    (x,) = reference["inputs"]
    assert x["name"] == "x" and x["status"] == status and x["numel"] == 12
    if status == "fail":
        assert "1.50x the reference's" in reference["message"]


@pytest.mark.parametrize(
    "function, status", [("Cast", Status.PASS), ("CastWrongGrad", Status.FAIL), ("CastWrongForward", Status.FAIL)]
)
def test_reference_judges_a_float8_output_and_its_gradient(mod, function, status):
    import f8mod

    x = torch.randn(4, 3, generator=torch.Generator().manual_seed(0)).requires_grad_()
    result = check(getattr(f8mod, function), [x], reference=f8mod.reference, reference_backward=f8mod.intended)
    assert result.error is None, result.error
    assert result.status is status, str(result)
    rows = {r.name: r.status for r in result.checks[0].inputs}
    wrong = {"Cast": set(), "CastWrongGrad": {"x"}, "CastWrongForward": {"output"}}[function]
    assert {name for name, s in rows.items() if s is Status.FAIL} == wrong, rows


@pytest.mark.parametrize("function, status, code", [("Cast", "pass", 0), ("CastWrongGrad", "fail", 1)])
def test_finite_difference_checks_skip_a_float8_output_that_the_reference_check_judges(
    mod, write_spec, invoke, function, status, code
):
    checks = "checks: [backward, double_backward, reference]\n"
    exit_code, result = verdict(invoke, spec(write_spec, function, "reference", "reference", checks))
    assert result["error"] is None, result["error"]  # before: the case's forward error, the reference check unrun
    assert (exit_code, result["status"]) == (code, status)
    by_name = {c["check"]: c for c in result["checks"]}
    assert by_name["reference"]["status"] == status
    for name in ("backward", "double_backward"):
        assert by_name[name]["status"] == "skip", by_name[name]
        assert "8-bit floats" in by_name[name]["message"]
        assert by_name[name]["message"].endswith("the reference check judges it")


def test_under_all_with_no_reference_a_float8_output_is_a_skip_that_says_why(mod, invoke):
    got = invoke("f8mod:Cast", "-i", "4x3:float32", "--check", "all", "--format", "json")
    (result,) = json.loads(got.stdout)["results"]
    assert result["error"] is None and result["status"] == "skip" and got.exit_code == 0, result
    backward = next(c for c in result["checks"] if c["check"] == "backward")
    assert backward["status"] == "skip" and "return the value before the cast to 8 bits" in backward["message"]
