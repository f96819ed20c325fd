"""The ``double_backward`` and ``forward_ad`` checks.

A small corpus of Functions written here (correct ones, and ones with a wrong second derivative
or a wrong jvp) is run through both checks, and their verdicts must equal those of
``torch.autograd.gradgradcheck`` and ``torch.autograd.gradcheck(check_forward_ad=True,
check_backward_ad=False)`` on the same inputs. Every mistake the checks name in words has a
broken Function of its own; the CLI shows both checks in its JSON report.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Optional

import jsonschema
import numpy as np
import pytest
import torch
from torch.autograd import Function
from torch.autograd.function import once_differentiable

import gradcheck_cli
from gradcheck_cli.examples.higher import LogSumExp

try:  # tests/ on sys.path (rootdir-style collection) or tests/ as a package
    from corpus import Sin as SinNoJvp  # a Function without jvp
except ImportError:  # pragma: no cover
    from tests.corpus import Sin as SinNoJvp
from gradcheck_cli.results import CaseResult, CheckResult, Status

DT = torch.float64


# ------------------------------------------------------------------------------ helpers


def run_check(
    name: str, fn: Any, args: tuple, kwargs: Optional[dict] = None, seed: int = 0, memory_bytes: Optional[int] = None
) -> CaseResult:
    """One check on ``fn(*args, **kwargs)`` through the library API (user errors become ``.error``)."""
    return gradcheck_cli.check(fn, args, kwargs, checks=[name], seed=seed, memory_bytes=memory_bytes)


def check_of(name: str, fn: Any, args: tuple, kwargs: Optional[dict] = None, **kw: Any) -> CheckResult:
    result = run_check(name, fn, args, kwargs, **kw)
    assert result.error is None, result.error
    (check,) = result.checks
    return check


def row(check: CheckResult, name: str):
    return next(r for r in check.inputs if r.name == name)


def _randn(g: torch.Generator, *shape: int) -> torch.Tensor:
    return torch.randn(shape, generator=g, dtype=DT).requires_grad_(True)


# ------------------------------------------------------------------------ the Functions


class Sin(Function):
    @staticmethod
    def forward(ctx, x):
        ctx.save_for_backward(x)
        ctx.save_for_forward(x)
        return x.sin()

    @staticmethod
    def backward(ctx, g):
        (x,) = ctx.saved_tensors
        return g * x.cos()

    @staticmethod
    def jvp(ctx, t):
        (x,) = ctx.saved_tensors
        return t * x.cos()


class SinDetachedInBackward(Sin):
    @staticmethod
    def backward(ctx, g):
        (x,) = ctx.saved_tensors
        return g * x.detach().cos()  # right values, but no second derivative through x


class SinSavesCos(Function):
    """Saves cos(x) computed in forward, where autograd is off: backward has no graph to x."""

    @staticmethod
    def forward(ctx, x):
        ctx.save_for_backward(x.cos())
        return x.sin()

    @staticmethod
    def backward(ctx, g):
        (c,) = ctx.saved_tensors
        return g * c


class SinNumpyBackward(Sin):
    @staticmethod
    def backward(ctx, g):
        (x,) = ctx.saved_tensors
        return torch.from_numpy(g.detach().numpy() * np.cos(x.detach().numpy()))


class SinNoGradBackward(Sin):
    @staticmethod
    def backward(ctx, g):
        (x,) = ctx.saved_tensors
        with torch.no_grad():
            return g * x.cos()


class SinOnce(Sin):
    @staticmethod
    @once_differentiable
    def backward(ctx, g):
        (x,) = ctx.saved_tensors
        return g * x.cos()


class SinJvpReadsBackwardSaved(SinNoJvp):
    @staticmethod
    def jvp(ctx, t):
        (x,) = ctx.saved_tensors  # empty in jvp: forward never called ctx.save_for_forward
        return t * x.cos()


class ScaledSinSetupContextJvpIndexesSaved(Function):
    """forward / setup_context style; jvp indexes ctx.saved_tensors, which is empty there."""

    @staticmethod
    def forward(x, scale=2.0):
        return scale * x.sin()

    @staticmethod
    def setup_context(ctx, inputs, output):
        x, scale = inputs
        ctx.save_for_backward(x)
        ctx.scale = scale

    @staticmethod
    def backward(ctx, g):
        (x,) = ctx.saved_tensors
        return ctx.scale * g * x.cos(), None

    @staticmethod
    def jvp(ctx, t, _scale_t=None):
        return ctx.scale * t * ctx.saved_tensors[0].cos()


class SinJvpSign(Sin):
    @staticmethod
    def jvp(ctx, t):
        (x,) = ctx.saved_tensors
        return -t * x.cos()


class SinJvpTwoTangents(Sin):
    @staticmethod
    def jvp(ctx, t):
        (x,) = ctx.saved_tensors
        return t * x.cos(), t


class SinJvpSummed(Sin):
    @staticmethod
    def jvp(ctx, t):
        (x,) = ctx.saved_tensors
        return (t * x.cos()).sum()


class SinJvpNone(Sin):
    @staticmethod
    def jvp(ctx, t):
        return None


class Exp(Function):
    """Saves its output: the second derivative goes through this Function again."""

    @staticmethod
    def forward(ctx, x):
        y = x.exp()
        ctx.save_for_backward(y)
        ctx.save_for_forward(y)
        return y

    @staticmethod
    def backward(ctx, g):
        (y,) = ctx.saved_tensors
        return g * y

    @staticmethod
    def jvp(ctx, t):
        (y,) = ctx.saved_tensors
        return t * y


class ExpDetachedOutput(Exp):
    @staticmethod
    def backward(ctx, g):
        (y,) = ctx.saved_tensors
        return g * y.detach()


class ExpJvpTwice(Exp):
    @staticmethod
    def jvp(ctx, t):
        (y,) = ctx.saved_tensors
        return 2 * t * y


class Tanh(Function):
    @staticmethod
    def forward(ctx, x):
        y = x.tanh()
        ctx.save_for_backward(y)
        ctx.save_for_forward(y)
        return y

    @staticmethod
    def backward(ctx, g):
        (y,) = ctx.saved_tensors
        return g * (1 - y * y)

    @staticmethod
    def jvp(ctx, t):
        (y,) = ctx.saved_tensors
        return t * (1 - y * y)


class TanhBackwardOnePercentOff(Tanh):
    @staticmethod
    def backward(ctx, g):
        (y,) = ctx.saved_tensors
        return 1.01 * g * (1 - y * y)


class TanhJvpOnePercentOff(Tanh):
    @staticmethod
    def jvp(ctx, t):
        (y,) = ctx.saved_tensors
        return 1.01 * t * (1 - y * y)


class Mul(Function):
    @staticmethod
    def forward(ctx, x, y):
        ctx.save_for_backward(x, y)
        ctx.save_for_forward(x, y)
        return x * y

    @staticmethod
    def backward(ctx, g):
        x, y = ctx.saved_tensors
        return g * y, g * x

    @staticmethod
    def jvp(ctx, tx, ty):
        x, y = ctx.saved_tensors
        return tx * y + x * ty


class MulDetachedY(Mul):
    @staticmethod
    def backward(ctx, g):
        x, y = ctx.saved_tensors
        return g * y.detach(), g * x


class MulJvpDropsY(Mul):
    @staticmethod
    def jvp(ctx, tx, ty):
        x, y = ctx.saved_tensors
        return tx * y  # forgot the x * ty term


class ScaledCube(Function):
    """scale * x**3 with a non-tensor scale."""

    @staticmethod
    def forward(ctx, x, scale):
        ctx.save_for_backward(x)
        ctx.save_for_forward(x)
        ctx.scale = scale
        return scale * x**3

    @staticmethod
    def backward(ctx, g):
        (x,) = ctx.saved_tensors
        return 3 * ctx.scale * g * x**2, None

    @staticmethod
    def jvp(ctx, t, _scale_t):
        (x,) = ctx.saved_tensors
        return 3 * ctx.scale * t * x**2


class ScaledCubeSavesSlope(ScaledCube):
    @staticmethod
    def forward(ctx, x, scale):
        ctx.save_for_backward(3 * scale * x**2)  # computed in forward: no graph to x
        ctx.save_for_forward(x)
        ctx.scale = scale
        return scale * x**3

    @staticmethod
    def backward(ctx, g):
        (slope,) = ctx.saved_tensors
        return g * slope, None


class ScaledCubeJvpForgotScale(ScaledCube):
    @staticmethod
    def jvp(ctx, t, _scale_t):
        (x,) = ctx.saved_tensors
        return 3 * t * x**2


class Linear(Function):
    @staticmethod
    def forward(ctx, x, w, b):
        ctx.save_for_backward(x, w)
        ctx.save_for_forward(x, w)
        return x @ w.t() + b

    @staticmethod
    def backward(ctx, g):
        x, w = ctx.saved_tensors
        return g @ w, g.t() @ x, g.sum(0)

    @staticmethod
    def jvp(ctx, tx, tw, tb):
        x, w = ctx.saved_tensors
        return tx @ w.t() + x @ tw.t() + tb


class LinearSavesWeightT(Linear):
    @staticmethod
    def forward(ctx, x, w, b):
        ctx.save_for_backward(x, w.t().contiguous())  # a copy made in forward: no graph to w
        return x @ w.t() + b

    @staticmethod
    def backward(ctx, g):
        x, wt = ctx.saved_tensors
        return g @ wt.t(), g.t() @ x, g.sum(0)


class LinearJvpDropsBias(Linear):
    @staticmethod
    def jvp(ctx, tx, tw, tb):
        x, w = ctx.saved_tensors
        return tx @ w.t() + x @ tw.t()


class MatMul(Function):
    @staticmethod
    def forward(ctx, a, b):
        ctx.save_for_backward(a, b)
        ctx.save_for_forward(a, b)
        return a @ b

    @staticmethod
    def backward(ctx, g):
        a, b = ctx.saved_tensors
        return g @ b.t(), a.t() @ g

    @staticmethod
    def jvp(ctx, ta, tb):
        a, b = ctx.saved_tensors
        return ta @ b + a @ tb


class MatMulJvpTransposed(MatMul):
    @staticmethod
    def jvp(ctx, ta, tb):
        a, b = ctx.saved_tensors
        return ta.t() @ b + a @ tb


class LogSumExpJvpUnnormalized(LogSumExp):
    @staticmethod
    def jvp(ctx, t, _dim_t):
        x, out = ctx.saved_tensors
        return (t * x.exp()).sum(ctx.dim)


class MaxWithIndex(Function):
    """(max over the last dim, argmax [int64]): the integer output comes last."""

    @staticmethod
    def forward(ctx, x):
        values, index = x.max(-1)
        ctx.mark_non_differentiable(index)
        ctx.save_for_backward(x, index)
        ctx.save_for_forward(index)
        return values, index

    @staticmethod
    def backward(ctx, g, _g_index):
        x, index = ctx.saved_tensors
        return torch.zeros_like(x).scatter(-1, index.unsqueeze(-1), g.unsqueeze(-1))

    @staticmethod
    def jvp(ctx, t):
        (index,) = ctx.saved_tensors
        return t.gather(-1, index.unsqueeze(-1)).squeeze(-1), None


class MaxWithIndexJvpFirstElement(MaxWithIndex):
    @staticmethod
    def jvp(ctx, t):
        return t[..., 0], None  # the tangent of element 0, not of the maximum


class MaxWithIndexJvpIntTangent(MaxWithIndex):
    @staticmethod
    def jvp(ctx, t):
        (index,) = ctx.saved_tensors
        return t.gather(-1, index.unsqueeze(-1)).squeeze(-1), torch.zeros_like(index, dtype=DT)


def softplus(x, beta=1.0):
    return torch.nn.functional.softplus(x, beta=beta)


def argmax_only(x):
    return x.argmax(-1)


# ------------------------------------------------------------------------------ corpus


@dataclass(frozen=True)
class Case:
    name: str
    fn: Any
    make_args: Callable[[torch.Generator], tuple]
    correct: bool
    wrong_rows: tuple = field(default=())  # rows the check must mark failed


def _x(g):
    return (_randn(g, 3, 4),)


def _two(g):
    return (_randn(g, 3, 4), _randn(g, 3, 4))


def _linear(g):
    return (_randn(g, 2, 3), _randn(g, 4, 3), _randn(g, 4))


DOUBLE_BACKWARD = [
    Case("ok_sin", Sin, _x, True),
    Case("ok_exp_saved_output", Exp, _x, True),
    Case("ok_tanh_saved_output", Tanh, _x, True),
    Case("ok_mul_two_inputs", Mul, _two, True),
    Case("ok_scaled_cube_nontensor", ScaledCube, lambda g: (_randn(g, 3, 4), 2.5), True),
    Case("ok_linear_three_inputs", Linear, _linear, True),
    Case("ok_logsumexp_int_dim", LogSumExp, lambda g: (_randn(g, 3, 5), 0), True),
    Case("ok_max_with_int_output", MaxWithIndex, lambda g: (_randn(g, 3, 5),), True),
    Case("ok_plain_callable", softplus, lambda g: (_randn(g, 6), 2.0), True),
    Case("bad_detached_in_backward", SinDetachedInBackward, _x, False, ("x",)),
    Case("bad_saves_intermediate", SinSavesCos, _x, False, ("x",)),
    Case("bad_numpy_backward", SinNumpyBackward, _x, False, ("x", "grad_output 0")),
    Case("bad_no_grad_backward", SinNoGradBackward, _x, False, ("x", "grad_output 0")),
    Case("bad_exp_detached_output", ExpDetachedOutput, _x, False, ("x",)),
    Case("bad_tanh_backward_1_01x", TanhBackwardOnePercentOff, _x, False, ("x",)),
    Case("bad_mul_detached_y", MulDetachedY, _two, False, ("y",)),
    Case("bad_cube_saves_slope_nontensor", ScaledCubeSavesSlope, lambda g: (_randn(g, 3, 4), 2.5), False, ("x",)),
    Case("bad_linear_saves_weight_t", LinearSavesWeightT, _linear, False, ("w",)),
]

FORWARD_AD = [
    Case("ok_sin", Sin, _x, True),
    Case("ok_exp_saved_output", Exp, _x, True),
    Case("ok_tanh", Tanh, _x, True),
    Case("ok_mul_two_inputs", Mul, _two, True),
    Case("ok_scaled_cube_nontensor", ScaledCube, lambda g: (_randn(g, 3, 4), 2.5), True),
    Case("ok_linear_three_inputs", Linear, _linear, True),
    Case("ok_matmul", MatMul, lambda g: (_randn(g, 3, 3), _randn(g, 3, 3)), True),
    Case("ok_logsumexp_int_dim", LogSumExp, lambda g: (_randn(g, 3, 5), 0), True),
    Case("ok_max_with_int_output", MaxWithIndex, lambda g: (_randn(g, 3, 5),), True),
    Case("ok_plain_callable", softplus, lambda g: (_randn(g, 6), 2.0), True),
    Case("bad_sign", SinJvpSign, _x, False, ("x",)),
    Case("bad_factor_2x", ExpJvpTwice, _x, False, ("x",)),
    Case("bad_factor_1_01x", TanhJvpOnePercentOff, _x, False, ("x",)),
    Case("bad_mul_drops_y", MulJvpDropsY, _two, False, ("y",)),
    Case("bad_forgot_nontensor_scale", ScaledCubeJvpForgotScale, lambda g: (_randn(g, 3, 4), 2.5), False, ("x",)),
    Case("bad_linear_drops_bias", LinearJvpDropsBias, _linear, False, ("b",)),
    Case("bad_matmul_transposed", MatMulJvpTransposed, lambda g: (_randn(g, 3, 3), _randn(g, 3, 3)), False, ("a",)),
    Case("bad_logsumexp_unnormalized", LogSumExpJvpUnnormalized, lambda g: (_randn(g, 3, 5), 0), False, ("x",)),
    Case("bad_max_first_element", MaxWithIndexJvpFirstElement, lambda g: (_randn(g, 3, 5),), False, ("x",)),
]


def _args(case: Case) -> tuple:
    return case.make_args(torch.Generator().manual_seed(1234))


def _apply(fn: Any) -> Callable:
    return fn.apply if isinstance(fn, type) else fn


def _torch_says(check: str, fn: Any, args: tuple) -> bool:
    try:
        if check == "double_backward":
            return bool(torch.autograd.gradgradcheck(_apply(fn), args, raise_exception=False))
        return bool(
            torch.autograd.gradcheck(
                _apply(fn), args, check_forward_ad=True, check_backward_ad=False, raise_exception=False
            )
        )
    except Exception:  # torch raised instead of answering: not a pass
        return False


def test_corpus_is_big_enough():
    for cases in (DOUBLE_BACKWARD, FORWARD_AD):
        assert sum(c.correct for c in cases) >= 8 and sum(not c.correct for c in cases) >= 8


@pytest.mark.parametrize(
    "check_name,case",
    [("double_backward", c) for c in DOUBLE_BACKWARD] + [("forward_ad", c) for c in FORWARD_AD],
    ids=[f"double_backward-{c.name}" for c in DOUBLE_BACKWARD] + [f"forward_ad-{c.name}" for c in FORWARD_AD],
)
def test_verdict_agrees_with_torch(check_name, case):
    args = _args(case)
    assert _torch_says(check_name, case.fn, args) is case.correct, "the corpus label disagrees with torch"
    check = check_of(check_name, case.fn, args)
    assert check.status is (Status.PASS if case.correct else Status.FAIL), check.message
    failed = {r.name for r in check.inputs if r.status is Status.FAIL}
    assert failed >= set(case.wrong_rows), (failed, check.message)
    if case.correct:
        assert check.message.endswith("all within tolerance")
    for r in check.inputs:
        if r.status is Status.FAIL:
            assert r.mismatched and r.worst_index is not None and r.diagnosis, r


# --------------------------------------------------------------- double_backward in words


def test_double_backward_rows_are_the_arguments_then_one_per_grad_output():
    check = check_of("double_backward", MaxWithIndex, (_randn(torch.Generator().manual_seed(0), 3, 5),))
    assert [(r.index, r.name, r.shape) for r in check.inputs] == [(0, "x", [3, 5]), (1, "grad_output 0", [3])]
    # the integer output (position 1) gets no grad_output; the float one is checked like an argument
    assert all(r.status is Status.PASS and r.numel and r.mismatched == 0 for r in check.inputs)


def test_double_backward_names_a_detached_value_and_the_gradient_it_is_in():
    check = check_of("double_backward", MulDetachedY, _two(torch.Generator().manual_seed(0)))
    y = row(check, "y")
    assert y.status is Status.FAIL and "does not depend on 'y' through autograd" in y.diagnosis
    assert y.worst_output.startswith("gradient of 'x'")  # d(grad of x)/dy is the entry that is missing
    assert row(check, "x").status is Status.PASS and row(check, "grad_output 0").status is Status.PASS
    # a silently wrong second derivative, in the same words named or under `all` (it said "... 'y' is wrong")
    assert check.message.startswith(
        "backward is not differentiable with respect to 'y' and not marked "
        "@once_differentiable: second derivatives through it"
    ), check.message
    assert "named explicitly" not in check.message and "that one decorator is the fix" in check.message
    assert "'x', grad_output 0 are right" in check.message


def test_double_backward_names_a_value_computed_in_forward():
    check = check_of("double_backward", ScaledCubeSavesSlope, (_randn(torch.Generator().manual_seed(0), 4), 2.0))
    assert check.status is Status.FAIL
    assert "does not depend on 'x' through autograd" in row(check, "x").diagnosis
    assert check.message.endswith(
        "a value backward uses was taken outside autograd (a tensor computed in forward "
        "and saved, as forward runs without autograd; or .detach(), .data, numpy, "
        "torch.no_grad()): compute what backward needs inside backward, with "
        "differentiable torch ops on the saved inputs and outputs"
    )
    assert row(check, "scale").status is Status.SKIP


@pytest.mark.parametrize("fn", [SinNumpyBackward, SinNoGradBackward])
def test_a_backward_outside_autograd_is_named_not_differentiable(fn):
    check = check_of("double_backward", fn, _x(torch.Generator().manual_seed(0)))
    assert check.status is Status.FAIL
    assert check.message.startswith(
        "backward is not differentiable with respect to 'x', grad_output 0 and not marked @once_differentiable: "
    ), check.message
    assert (
        "backward is not differentiable: the gradient it returns for 'x' does not require grad, so all its "
        "derivatives come out zero (numerically they are not); a value backward uses was taken outside "
        "autograd"
    ) in check.message
    assert all(r.status is Status.FAIL and "all zeros" in r.diagnosis for r in check.inputs)


def _under_all(name: str, fn: Any, args: tuple) -> CheckResult:
    """Check ``name`` as ``checks: all`` runs it (every applicable check)."""
    result = gradcheck_cli.check(fn, args, checks=["all"])
    assert result.error is None, result.error
    return next(c for c in result.checks if c.check == name)


def test_once_differentiable_fails_when_named_and_skips_under_all_saying_why():
    args = _x(torch.Generator().manual_seed(0))
    with pytest.raises(RuntimeError, match="Jacobian mismatch"):  # torch: zeros vs numbers, no word on why
        torch.autograd.gradgradcheck(SinOnce.apply, args)
    check = check_of("double_backward", SinOnce, args)  # named: the user asked for a second derivative
    assert check.status is Status.FAIL
    assert check.message.startswith("backward is marked @once_differentiable: it cannot be differentiated")
    assert "remove the decorator" in check.message and "named explicitly" in check.message
    assert row(check, "x").status is Status.SKIP
    skipped = _under_all("double_backward", SinOnce, args)
    assert skipped.status is Status.SKIP and skipped.message.startswith("backward is marked @once_differentiable")
    assert check_of("backward", SinOnce, args).status is Status.PASS  # first order is still fine


def test_once_differentiable_inside_a_plain_callable_too():
    args = _x(torch.Generator().manual_seed(0))
    check = check_of("double_backward", lambda x: 2 * SinOnce.apply(x), args)
    assert check.status is Status.FAIL and "@once_differentiable" in check.message
    assert _under_all("double_backward", lambda x: 2 * SinOnce.apply(x), args).status is Status.SKIP


# -------------------------------------------------------------------- forward_ad in words


def test_a_function_without_jvp_fails_when_named_and_skips_under_all_saying_how_to_add_one():
    args = _x(torch.Generator().manual_seed(0))
    check = check_of("forward_ad", SinNoJvp, args)
    assert check.status is Status.FAIL and "named explicitly" in check.message
    assert check.message.startswith("Sin defines no jvp(): forward-mode AD is not supported")
    assert _under_all("forward_ad", SinNoJvp, args).status is Status.SKIP
    assert "ctx.save_for_forward" in check.message
    with pytest.raises(NotImplementedError):
        torch.autograd.gradcheck(SinNoJvp.apply, args, check_forward_ad=True, check_backward_ad=False)


def test_a_plain_callable_through_a_function_without_jvp_too():
    args = _x(torch.Generator().manual_seed(0))
    check = check_of("forward_ad", lambda x: SinNoJvp.apply(x) + 1, args)
    assert check.status is Status.FAIL and "defines no jvp()" in check.message
    assert _under_all("forward_ad", lambda x: SinNoJvp.apply(x) + 1, args).status is Status.SKIP


@pytest.mark.parametrize(
    "fn,words",
    [
        (
            SinJvpReadsBackwardSaved,
            "jvp reads ctx.saved_tensors, but forward saved its tensors with ctx.save_for_backward only",
        ),
        (
            ScaledSinSetupContextJvpIndexesSaved,
            "jvp reads ctx.saved_tensors, but forward saved its tensors with ctx.save_for_backward only",
        ),
        (SinJvpTwoTangents, "jvp returned 2 tangents, but forward returns 1 output: return one tangent per output"),
        (SinJvpSummed, "jvp returned a tangent of shape [] for an output of shape [3, 4]"),
        (SinJvpNone, "jvp returned None (or a non-floating-point tensor) as the tangent of a differentiable output"),
        (MaxWithIndexJvpIntTangent, "jvp returned a tangent for output 1, which is not differentiable"),
    ],
    ids=[
        "saved_tensors_for_backward",
        "saved_tensors_setup_context",
        "too_many_tangents",
        "wrong_shape",
        "none",
        "tangent_for_int_output",
    ],
)
def test_broken_jvp_contracts_are_failures_in_words(fn, words):
    args = _x(torch.Generator().manual_seed(0))
    assert not _torch_says("forward_ad", fn, args)
    result = run_check("forward_ad", fn, args)
    assert result.error is None and result.status is Status.FAIL, result.error
    (check,) = result.checks
    assert check.status is Status.FAIL
    assert check.message.startswith(words), check.message
    assert row(check, "x").status is Status.SKIP and row(check, "x").reason == "jvp failed (see the message)"


def test_saved_tensors_message_quotes_torchs_own_error_and_the_line():
    check = check_of("forward_ad", SinJvpReadsBackwardSaved, _x(torch.Generator().manual_seed(0)))
    assert "ValueError: not enough values to unpack (expected 1, got 0)" in check.message
    assert "test_higher_order.py" in check.message and "(x,) = ctx.saved_tensors" in check.message


def test_forward_ad_diagnoses_a_wrong_jvp_per_argument():
    check = check_of("forward_ad", MulJvpDropsY, _two(torch.Generator().manual_seed(0)))
    assert row(check, "x").status is Status.PASS
    y = row(check, "y")
    assert y.status is Status.FAIL and y.mismatched == y.numel == 12
    assert y.diagnosis == (
        "analytical is all zeros, numerical is not: a term for 'y' is missing from jvp's "
        "tangent, or jvp does not use its tangent argument"
    )
    assert check.message.startswith("the tangent along 'y' is wrong")
    sign = check_of("forward_ad", SinJvpSign, _x(torch.Generator().manual_seed(0)))
    assert row(sign, "x").diagnosis == "sign flipped: analytical = -numerical"
    transposed = check_of(
        "forward_ad", MatMulJvpTransposed, (_randn(torch.Generator(), 3, 3), _randn(torch.Generator(), 3, 3))
    )
    assert row(transposed, "b").status is Status.PASS and row(transposed, "a").status is Status.FAIL


def test_forward_ad_columns_in_small_chunks_give_the_same_rows():
    """Memory stays bounded: with room for one column at a time the statistics are the same."""
    args = _linear(torch.Generator().manual_seed(3))
    whole = check_of("forward_ad", LinearJvpDropsBias, args)
    tiny = check_of("forward_ad", LinearJvpDropsBias, args, memory_bytes=64)
    for a, b in zip(whole.inputs, tiny.inputs):
        assert (a.status, a.mismatched, a.worst_index, a.worst_output, a.diagnosis) == (
            b.status,
            b.mismatched,
            b.worst_index,
            b.worst_output,
            b.diagnosis,
        )
        assert a.max_abs_err == pytest.approx(b.max_abs_err)


@pytest.mark.parametrize("name", ["double_backward", "forward_ad"])
def test_a_random_forward_draws_the_same_numbers_in_every_call(name):
    """Dropout: the jvp forwards and the finite-difference forwards must see the same mask."""

    def dropout_sin(x):
        return torch.nn.functional.dropout(x.sin(), p=0.5, training=True)

    assert check_of(name, dropout_sin, (_randn(torch.Generator().manual_seed(0), 8),)).status is Status.PASS


def test_complex_input_and_output():
    z = torch.randn(4, dtype=torch.complex128, generator=torch.Generator().manual_seed(0), requires_grad=True)
    for name in ("double_backward", "forward_ad"):
        assert check_of(name, lambda z: z * z.conj() + z.sin(), (z,)).status is Status.PASS


# ------------------------------------------------------------------------- both: skips


@pytest.mark.parametrize("name", ["double_backward", "forward_ad"])
def test_nothing_requires_grad_is_a_skip(name):
    x = torch.randn(3, dtype=DT)
    check = check_of(name, Sin, (x,))
    assert check.status is Status.SKIP and check.message.startswith("no argument requires grad")
    assert row(check, "x").reason == "requires_grad is false"


@pytest.mark.parametrize("name", ["double_backward", "forward_ad"])
def test_no_differentiable_output_is_a_skip(name):
    check = check_of(name, argmax_only, (torch.randn(3, 4, dtype=DT, requires_grad=True),))
    assert check.status is Status.SKIP and check.message.startswith("no output is differentiable")


@pytest.mark.parametrize("name", ["double_backward", "forward_ad"])
def test_same_tensor_twice_is_checked_once(name):
    x = torch.randn(3, 4, dtype=DT, requires_grad=True)
    check = check_of(name, Mul, (x, x))
    assert check.status is Status.PASS
    assert row(check, "y").status is Status.SKIP and "same tensor as 'x'" in row(check, "y").reason


# ---------------------------------------------------------------------------- the CLI


HIGHER = """
import torch

class Cube(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x, scale=1.0):
        ctx.save_for_backward(x)
        ctx.save_for_forward(x)
        ctx.scale = scale
        return scale * x ** 3

    @staticmethod
    def backward(ctx, g):
        (x,) = ctx.saved_tensors
        return 3 * ctx.scale * g * x ** 2, None

    @staticmethod
    def jvp(ctx, t, _scale_t=None):
        (x,) = ctx.saved_tensors
        return -3 * ctx.scale * t * x ** 2
"""


def test_cli_spec_with_both_checks_shows_their_json_entries(user_module, write_spec, invoke):
    user_module(HIGHER)
    write_spec(
        """
        function: usermod:Cube
        checks: [double_backward, forward_ad]
        inputs: [{name: x, shape: [2, 3]}]
        kwargs: {scale: {value: 2.0}}
    """,
        "specs/cube.yaml",
    )
    result = invoke("specs/cube.yaml", "--no-isolate", "--format", "json")
    assert result.exit_code == 1, result.output
    report = json.loads(result.stdout)
    schema = Path(gradcheck_cli.__file__).parent / "schemas" / "report.schema.json"
    jsonschema.validate(report, json.loads(schema.read_text(encoding="utf-8")))  # grad_output rows fit it too
    (res,) = report["results"]
    double, forward = res["checks"]
    assert (double["check"], double["status"], double["mode"]) == ("double_backward", "pass", "elementwise")
    assert [(r["index"], r["name"], r["shape"], r["status"]) for r in double["inputs"]] == [
        (0, "x", [2, 3], "pass"),
        (1, "scale", [], "skip"),
        (2, "grad_output 0", [2, 3], "pass"),
    ]
    assert double["inputs"][0]["line"] == 4 and double["inputs"][2]["line"] is None
    assert (forward["check"], forward["status"]) == ("forward_ad", "fail")
    x = forward["inputs"][0]
    assert (x["name"], x["status"], x["mismatched"], x["numel"]) == ("x", "fail", 6, 6)
    assert x["diagnosis"] == "sign flipped: analytical = -numerical"
    assert forward["message"].startswith("the tangent along 'x' is wrong: sign flipped")


def test_cli_check_option_runs_forward_ad_only(user_module, write_spec, invoke):
    user_module(HIGHER.replace("return -3", "return 3"))
    write_spec("function: usermod:Cube\ninputs: [{name: x, shape: [4]}]\n", "specs/cube.yaml")
    result = invoke("specs/cube.yaml", "--no-isolate", "--format", "json", "--check", "forward_ad")
    assert result.exit_code == 0, result.output
    (res,) = json.loads(result.stdout)["results"]
    (check,) = res["checks"]
    assert (check["check"], check["status"]) == ("forward_ad", "pass")
    assert check["inputs"][0]["max_abs_err"] < 1e-6
    assert "along 'x': all within tolerance" in check["message"]


def test_shipped_higher_order_specs_pass_every_check(monkeypatch, invoke):
    monkeypatch.chdir(Path(__file__).resolve().parents[2])
    result = invoke("specs/higher.yaml", "--no-isolate", "--format", "json")
    assert result.exit_code == 0, result.output
    for res in json.loads(result.stdout)["results"]:
        checks = [(c["check"], c["status"]) for c in res["checks"]]
        assert checks[:2] == [("backward", "pass"), ("double_backward", "pass")], res["id"]
        assert checks[2:] in ([("forward_ad", "pass")], [("forward_over_reverse", "pass")]), res["id"]  # order: 4
