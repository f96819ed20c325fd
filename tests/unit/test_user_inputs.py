"""User code, inputs and options that were internal errors (exit 4), now a result or a usage or
spec error (issue 14, item 12: backward returning a tensor that requires grad, a correct complex
Function under double_backward, more than 64 dimensions, seeds at the end of their range)."""

from __future__ import annotations

import json
from typing import Any

import pytest
import torch

from gradcheck_cli import check
from gradcheck_cli.results import Status

DT = torch.float64


def z3(seed: int = 0, dtype: torch.dtype = DT) -> torch.Tensor:
    return torch.randn(3, 4, dtype=dtype, generator=torch.Generator().manual_seed(seed)).requires_grad_()


# ------------------------------------------------ (a) backward returns a tensor that requires grad


class SquareGradMode(torch.autograd.Function):
    """x^2, with backward computed with grad mode on: its result requires grad (x does)."""

    factor = 2.0

    @staticmethod
    def forward(ctx: Any, x: torch.Tensor) -> torch.Tensor:
        ctx.save_for_backward(x)
        return x * x

    @staticmethod
    def backward(ctx: Any, g: torch.Tensor) -> torch.Tensor:
        (x,) = ctx.saved_tensors
        with torch.enable_grad():
            return SquareGradMode.factor * g * x


class SquareGradModeWrong(SquareGradMode):
    @staticmethod
    def backward(ctx: Any, g: torch.Tensor) -> torch.Tensor:
        (x,) = ctx.saved_tensors
        with torch.enable_grad():
            return 3 * g * x


WEIGHT = torch.nn.Parameter(torch.full((3, 4), 2.0, dtype=DT))


class ScaledSum(torch.autograd.Function):
    """sum(2 x), with backward returning a Parameter (which requires grad) times grad_output."""

    @staticmethod
    def forward(ctx: Any, x: torch.Tensor) -> torch.Tensor:
        return 2 * x.sum()

    @staticmethod
    def backward(ctx: Any, g: torch.Tensor) -> torch.Tensor:
        return WEIGHT * g


@pytest.mark.parametrize("probes", [0, 3], ids=["elementwise", "--fast"])
@pytest.mark.parametrize("fn", [SquareGradMode, ScaledSum])
def test_a_backward_whose_result_requires_grad_is_checked(fn: type, probes: int) -> None:
    """torch accepts such a backward; the tool reads the values (it was exit 4: an out= op on them)."""
    result = check(fn, [z3()], checks=["backward", "double_backward", "batched", "undefined_grad"], probes=probes)
    assert result.error is None, result.error
    assert [c.status for c in result.checks] == [Status.PASS] * 4, [c.message for c in result.checks]


def test_a_wrong_backward_whose_result_requires_grad_fails() -> None:
    result = check(SquareGradModeWrong, [z3()])
    assert result.error is None and result.status is Status.FAIL
    assert result.checks[0].inputs[0].ratio == pytest.approx(1.5)


# ------------------------------------------------------- (b) complex Functions, conjugate views


class ComplexSquare(torch.autograd.Function):
    """z^2, holomorphic: PyTorch's convention asks for grad_output * conj(f'(z)) = 2 conj(z) g,
    which autograd gives as a lazily conjugated tensor under double backward."""

    @staticmethod
    def forward(ctx: Any, z: torch.Tensor) -> torch.Tensor:
        ctx.save_for_backward(z)
        return z * z

    @staticmethod
    def backward(ctx: Any, g: torch.Tensor) -> torch.Tensor:
        (z,) = ctx.saved_tensors
        return 2 * z.conj() * g


class ComplexSquareNoConj(ComplexSquare):
    @staticmethod
    def backward(ctx: Any, g: torch.Tensor) -> torch.Tensor:
        (z,) = ctx.saved_tensors
        return 2 * z * g


class ConjugateOutput(torch.autograd.Function):
    """conj(3 z): forward and backward both return lazily conjugated tensors."""

    @staticmethod
    def forward(ctx: Any, z: torch.Tensor) -> torch.Tensor:
        return (3 * z).conj()

    @staticmethod
    def backward(ctx: Any, g: torch.Tensor) -> torch.Tensor:
        return 3 * g.conj()


@pytest.mark.parametrize("probes", [0, 3], ids=["elementwise", "--fast"])
@pytest.mark.parametrize("fn", [ComplexSquare, ConjugateOutput])
def test_a_correct_complex_function_passes_every_order(fn: type, probes: int) -> None:
    result = check(fn, [z3(dtype=torch.complex128)], checks=["backward", "double_backward", "batched"], probes=probes)
    assert result.error is None, result.error
    assert [c.status for c in result.checks] == [Status.PASS] * 3, [c.message for c in result.checks]


def test_the_conjugate_convention_mistake_still_fails() -> None:
    result = check(ComplexSquareNoConj, [z3(dtype=torch.complex128)], checks=["backward", "double_backward"])
    assert result.error is None and result.checks[0].status is Status.FAIL
    assert "conjugate" in result.checks[0].message


# --------------------------------------------------------------- (c) at most 64 dimensions


GOOD = "function: gradcheck_cli.examples.mul_constant:MulConstant\n"


@pytest.mark.parametrize(
    "entry, key",
    [
        ("{shape: [" + ", ".join(["1"] * 65) + "]}", "inputs[0].shape"),
        ("{data: " + "[" * 65 + "1.0" + "]" * 65 + "}", "inputs[0].data"),
    ],
)
def test_more_than_64_dimensions_is_a_spec_error(write_spec: Any, invoke: Any, entry: str, key: str) -> None:
    path = write_spec(f"{GOOD}inputs: [{entry}, {{value: 2.0}}]\n")
    result = invoke(str(path), "--format", "json", "--no-isolate")
    assert result.exit_code == 3, result.output
    (res,) = json.loads(result.stdout)["results"]
    assert res["error"]["kind"] == "spec"
    assert f"{path}:2: {key}: " in res["error"]["message"] and "at most 64" in res["error"]["message"]


def test_64_dimensions_are_checked(write_spec: Any, invoke: Any) -> None:
    path = write_spec(f"{GOOD}inputs: [{{shape: [{', '.join(['1'] * 62)}, 2, 2]}}, {{value: 2.0}}]\n")
    assert invoke(str(path), "--no-isolate").exit_code == 0


# ------------------------------------------------------------------------------- (d) seeds


def test_a_seed_beyond_the_generators_range_is_a_usage_error(write_spec: Any, invoke: Any) -> None:
    path = write_spec(f"{GOOD}inputs: [{{shape: [3]}}, {{value: 2.0}}]\n")
    for seed in (str(2**64), "-1"):
        result = invoke(str(path), "--seed", seed)
        assert result.exit_code == 2 and "--seed" in result.output, result.output


@pytest.mark.parametrize("where", ["spec", "option"])
def test_trials_past_the_last_seed_wrap_around_to_0(write_spec: Any, invoke: Any, where: str) -> None:
    """seed 2**64 - 1 with --trials 3 checks seeds 2**64 - 1, 0 and 1 (torch's generators take
    0 <= seed < 2**64): seed + 1 was an internal error."""
    last = 2**64 - 1
    seed = f"seed: {last}\n" if where == "spec" else ""
    path = write_spec(f"{GOOD}{seed}inputs: [{{shape: [3]}}, {{value: 2.0}}]\n")
    extra = ("--seed", str(last)) if where == "option" else ()
    result = invoke(str(path), "--trials", "3", "--format", "json", "--no-isolate", *extra)
    assert result.exit_code == 0, result.output
    (res,) = json.loads(result.stdout)["results"]
    assert res["status"] == "pass" and res["seed"] == 1  # the last trial's seed


def test_seeds_derived_from_the_last_one_stay_in_range() -> None:
    from gradcheck_cli.core.rng import seed_plus
    from gradcheck_cli.run.runner import RESAMPLE_STRIDE

    assert seed_plus(2**64 - 1, 1) == 0
    assert seed_plus(2**64 - 2, 3 * RESAMPLE_STRIDE) == 3 * RESAMPLE_STRIDE - 2
    assert seed_plus(5, 1) == 6
