"""The ``backward`` check through the library API ``gradcheck_cli.check``.

Every Function here is small and defined in this file, with a known right or wrong backward:
backward's contract (count, shape, dtype, non-tensor arguments, in-place changes, repeat
calls), user errors with their location, the numerics (integer and non-differentiable outputs,
aliasing, complex, 0-d, strided tensors), the per-argument numbers and their diagnosis, the
memory budget, and plain callables.
"""

from __future__ import annotations

import os

import pytest
import torch

import gradcheck_cli
from gradcheck_cli.checks import backward
from gradcheck_cli.checks.parts.base import CheckContext, Options
from gradcheck_cli.core.options import MEMORY_BYTES
from gradcheck_cli.results import Status
from gradcheck_cli.spec import Tolerance
from gradcheck_cli.subject.binding import bind
from gradcheck_cli.subject.target import Target

try:  # tests/ on sys.path (rootdir-style collection) or tests/ as a package
    from corpus import determined
except ImportError:  # pragma: no cover
    from tests.corpus import determined

try:  # tests/ on sys.path (rootdir-style collection) or tests/ as a package
    from corpus import Exp, Mul, Square
except ImportError:  # pragma: no cover
    from tests.corpus import Exp, Mul, Square

F64 = torch.float64
THIS_FILE = os.path.basename(__file__)


# ------------------------------------------------------------------------ helpers


def rand(*shape: int, dtype: torch.dtype = F64, seed: int = 0, requires_grad: bool = True) -> torch.Tensor:
    """Reproducible values kept away from 0 (so relative errors are well defined)."""
    gen = torch.Generator().manual_seed(seed)
    if dtype.is_complex:
        t = torch.complex(
            torch.rand(shape, generator=gen, dtype=F64) + 0.5, torch.rand(shape, generator=gen, dtype=F64) - 0.5
        ).to(dtype)
    else:
        sign = torch.where(torch.rand(shape, generator=gen) < 0.5, -1.0, 1.0).to(F64)
        t = (sign * (torch.rand(shape, generator=gen, dtype=F64) + 0.5)).to(dtype)
    return t.requires_grad_(requires_grad)


def run(fn, *args, kwargs=None, **tol):
    return gradcheck_cli.check(fn, list(args), kwargs, **tol)


def bw(result):
    """The backward check of a result (the only check the library API runs)."""
    assert result.error is None, f"unexpected error: {result.error}"
    assert len(result.checks) == 1 and result.checks[0].check == "backward"
    return result.checks[0]


def row(result, name):
    rows = [r for r in bw(result).inputs if r.name == name]
    assert len(rows) == 1, f"expected one row named {name!r}: {bw(result).inputs}"
    return rows[0]


def status(x) -> str:
    return x.status.value


def line_of(marker: str) -> int:
    """Line number in this file of the one line that carries ``marker``."""
    with open(__file__, encoding="utf-8") as f:
        hits = [i for i, text in enumerate(f, start=1) if text.rstrip().endswith(marker)]
    assert len(hits) == 1, marker
    return hits[0]


def assert_fails_with(result, *words: str) -> str:
    check = bw(result)
    assert status(result) == "fail", (status(result), check.message)
    assert status(check) == "fail"
    for word in words:
        assert word in check.message, f"{word!r} not in {check.message!r}"
    return check.message


# ------------------------------------------------------------------------ Functions


# Square (x**2), Mul (x * y) and Exp (exp(x)), all correct, come from the corpus. The wrong
# Functions below subclass a correct one and change only what they get wrong.


class TimesTwo(torch.autograd.Function):
    """x * 2, correct."""

    @staticmethod
    def forward(ctx, x):
        return x * 2

    @staticmethod
    def backward(ctx, g):
        return g * 2


class MatMul(torch.autograd.Function):
    """a @ w, correct."""

    @staticmethod
    def forward(ctx, a, w):
        ctx.save_for_backward(a, w)
        return a @ w

    @staticmethod
    def backward(ctx, g):
        a, w = ctx.saved_tensors
        return g @ w.t(), a.t() @ g


class Scale(torch.autograd.Function):
    """x * k for a Python number k: k gets no gradient."""

    @staticmethod
    def forward(ctx, x, k):
        ctx.k = k
        return x * k

    @staticmethod
    def backward(ctx, g):
        return g * ctx.k, None


# ------------------------------------------------------------- contract: baselines


def test_correct_function_passes_with_numbers():
    r = run(Square, rand(3, 4))
    assert status(r) == "pass"
    check = bw(r)
    assert status(check) == "pass" and check.mode == "elementwise"
    (x,) = check.inputs
    assert (x.index, x.name, x.shape, x.dtype, status(x)) == (0, "x", [3, 4], "float64", "pass")
    assert x.numel == 12 and x.mismatched == 0
    assert x.max_abs_err < 1e-6 and x.max_rel_err < 1e-6
    assert (x.atol, x.rtol) == (1e-5, 1e-3)
    assert x.diagnosis is None


def test_kwargs_are_bound_by_name():
    r = run(Scale, rand(4), kwargs={"k": 3.0})
    assert status(r) == "pass"
    x, k = bw(r).inputs
    assert (x.name, status(x)) == ("x", "pass")
    assert (k.index, k.name, status(k)) == (1, "k", "skip")
    assert "not a tensor" in k.reason


# ------------------------------------------------------------- contract: failures


class TooFewGrads(Mul):
    @staticmethod
    def backward(ctx, g):
        x, y = ctx.saved_tensors
        return g * y  # the gradient of y is missing


class TooManyGrads(TimesTwo):
    @staticmethod
    def backward(ctx, g):
        return g * 2, g  # one non-None gradient too many


class ExtraNoneGrads(TimesTwo):
    @staticmethod
    def backward(ctx, g):
        return g * 2, None, None  # trailing Nones are allowed by autograd


def test_too_few_gradients_fail():
    msg = assert_fails_with(run(TooFewGrads, rand(3), rand(3, seed=1)), "returned 1 gradient", "2 inputs")
    assert "x, y" in msg


def test_too_many_non_none_gradients_fail():
    assert_fails_with(run(TooManyGrads, rand(3)), "returned 2 gradients", "1 input")


def test_extra_trailing_none_gradients_are_fine():
    assert status(run(ExtraNoneGrads, rand(3))) == "pass"


class WrongShape(TimesTwo):
    @staticmethod
    def backward(ctx, g):
        return (g * 2).t()  # (4, 3) for a (3, 4) input: not reducible by broadcasting


class BroadcastShape(TimesTwo):
    @staticmethod
    def backward(ctx, g):
        return g.expand(2, *g.shape)  # (2, 3, 4): autograd sums it down to 2 * g, the right value


def test_wrong_shape_fails():
    msg = assert_fails_with(run(WrongShape, rand(3, 4)), "shape", "[4, 3]", "[3, 4]", "'x'")
    assert "x" in msg


def test_broadcast_reducible_shape_is_only_a_warning():
    r = run(BroadcastShape, rand(3, 4))
    assert status(r) == "pass", bw(r).message
    warnings = bw(r).warnings
    assert any("[2, 3, 4]" in w and "'x'" in w for w in warnings), warnings
    assert row(r, "x").mismatched == 0


class WrongDtype(Square):
    @staticmethod
    def backward(ctx, g):
        (x,) = ctx.saved_tensors
        return (2 * x * g).float()  # right values, float32 for a float64 input


def test_wrong_dtype_fails():
    r = run(WrongDtype, rand(3))
    assert_fails_with(r, "float32", "float64", "'x'")
    assert status(row(r, "x")) == "fail"


class GradForNonTensor(Scale):
    @staticmethod
    def backward(ctx, g):
        return g * ctx.k, g.sum()  # k is an int: it must get None


def test_gradient_for_a_non_tensor_argument_fails():
    r = run(GradForNonTensor, rand(3), 3)
    assert_fails_with(r, "'k'", "not a tensor")


class NumpyGrad(TimesTwo):
    @staticmethod
    def backward(ctx, g):
        return (g * 2).numpy()  # an ndarray, not a tensor


class NumberGrad(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x):
        return x.sum() * 2

    @staticmethod
    def backward(ctx, g):
        return 2.0  # a Python float, not a tensor


def test_an_ndarray_returned_as_gradient_fails():
    assert_fails_with(run(NumpyGrad, rand(3)), "ndarray", "'x'", "tensor")


def test_a_number_returned_as_gradient_fails():
    assert_fails_with(run(NumberGrad, rand(3)), "float", "'x'", "tensor")


class ScalesGradOutputInPlace(TimesTwo):
    @staticmethod
    def backward(ctx, g):
        return g.mul_(2)  # the right value, but grad_output is changed


class ScalesSecondGradOutputInPlace(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x):
        return x * 2, x * 3

    @staticmethod
    def backward(ctx, g1, g2):
        return g1 * 2 + g2.mul_(3)


def test_grad_output_modified_in_place_fails_even_with_right_values():
    r = run(ScalesGradOutputInPlace, rand(3, 2))
    assert_fails_with(r, "grad_output", "in place")


def test_second_grad_output_modified_in_place_is_named():
    assert_fails_with(run(ScalesSecondGradOutputInPlace, rand(3)), "grad_output 1", "in place")


class ChangesSavedInput(Square):
    @staticmethod
    def backward(ctx, g):
        (x,) = ctx.saved_tensors
        return 2 * x.mul_(1.0 + 1e-3) * g  # changes the input in place


class ChangesStashedInput(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x):
        ctx.x = x  # kept as an attribute: no version check by autograd
        return x * 2

    @staticmethod
    def backward(ctx, g):
        ctx.x.add_(1.0)
        return 2 * g


def test_input_modified_in_place_by_backward_fails():
    r = run(ChangesStashedInput, rand(3))
    assert_fails_with(r, "modified input 'x' in place")
    assert status(row(r, "x")) == "fail"


def test_saved_input_modified_in_place_by_backward_fails():
    # The idiomatic way: modify a tensor from ctx.saved_tensors. This is a wrong backward
    # (exit code 1), not a Function that could not be checked (error, exit code 3).
    r = run(ChangesSavedInput, rand(3))
    assert r.error is None, r.error
    assert_fails_with(r, "modified input 'x' in place")


class CountingBackward(TimesTwo):
    calls = 0

    @staticmethod
    def backward(ctx, g):
        CountingBackward.calls += 1
        return g * 2 + CountingBackward.calls * 1e-9  # drifts with every call


class NoisyBackward(TimesTwo):
    @staticmethod
    def backward(ctx, g):
        return g * 2 + 1e-7 * torch.rand_like(g)


@pytest.mark.parametrize("fn", [CountingBackward, NoisyBackward])
def test_backward_with_different_values_on_a_repeated_call_fails(fn):
    r = run(fn, rand(4))
    msg = assert_fails_with(r, "'x'")
    assert "nondet_tol" in msg
    assert "different values" in msg or "not deterministic" in msg
    # the values themselves are right
    assert row(r, "x").mismatched == 0


@pytest.mark.parametrize("fn", [CountingBackward, NoisyBackward])
def test_backward_with_small_differences_passes_with_nondet_tol(fn):
    r = run(fn, rand(4), nondet_tol=1e-5)
    assert status(r) == "pass", bw(r).message


# ------------------------------------------------------------- user errors


class RaisesInForward(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x):
        raise ValueError("forward exploded on purpose")  # RAISE-FORWARD

    @staticmethod
    def backward(ctx, g):
        return g


class RaisesInBackward(TimesTwo):
    @staticmethod
    def backward(ctx, g):
        raise KeyError("backward exploded on purpose")  # RAISE-BACKWARD


def helper_that_raises(x):
    raise ZeroDivisionError("helper exploded on purpose")  # RAISE-HELPER


class RaisesInHelper(TimesTwo):
    @staticmethod
    def backward(ctx, g):
        return helper_that_raises(g)


def test_forward_raising_is_an_error_result_with_its_location():
    r = run(RaisesInForward, rand(3))
    assert status(r) == "error" and r.error is not None and r.error.kind == "forward"
    assert "forward exploded on purpose" in r.error.message and "ValueError" in r.error.message
    assert r.error.where is not None and f"{THIS_FILE}:{line_of('# RAISE-FORWARD')}" in r.error.where, r.error.where


@pytest.mark.parametrize(
    "fn, text, marker",
    [
        (RaisesInBackward, "KeyError: 'backward exploded on purpose'", "# RAISE-BACKWARD"),
        (RaisesInHelper, "ZeroDivisionError: helper exploded on purpose", "# RAISE-HELPER"),
    ],
)
def test_backward_raising_on_valid_inputs_is_a_fail_with_its_location(fn, text, marker):
    """a fail of kind backward, not an error (issue 44): forward ran, and backward raised on what it gave"""
    r = run(fn, rand(3))
    assert status(r) == "fail" and r.error is None
    (found,) = r.checks
    assert found.message.startswith(f"backward raised {text} at "), found.message
    assert f"{THIS_FILE}:{line_of(marker)}" in found.message, found.message
    assert "backward raises on inputs that forward accepts" in found.message
    assert [(row.status, row.reason) for row in found.inputs] == [(Status.SKIP, "backward raised (see the message)")]


def test_library_api_does_not_raise_for_bad_arguments():
    r = run(Mul, rand(3))  # y is missing
    assert status(r) == "error"
    assert r.error.kind != "internal", r.error


# ------------------------------------------------------------- numerics


class IntOutputFirst(torch.autograd.Function):
    scale = 3.0

    @staticmethod
    def forward(ctx, x):
        idx = x.argmax()
        ctx.mark_non_differentiable(idx)
        return idx, x * 3

    @staticmethod
    def backward(ctx, g_idx, g_y):
        return g_y * IntOutputFirst.scale


class IntOutputFirstWrong(IntOutputFirst):
    @staticmethod
    def backward(ctx, g_idx, g_y):
        return g_y * 2


def test_int64_output_first_then_float_output_passes():
    r = run(IntOutputFirst, rand(5))
    assert status(r) == "pass", bw(r).message
    x = row(r, "x")
    assert x.mismatched == 0 and x.max_abs_err < 1e-6


def test_int64_output_first_float_output_is_still_compared():
    r = run(IntOutputFirstWrong, rand(5))
    assert status(r) == "fail"
    x = row(r, "x")
    assert x.mismatched == 5
    assert x.analytical == pytest.approx(2.0) and x.numerical == pytest.approx(3.0)
    assert x.worst_output.startswith("output 1"), x.worst_output


class NonDifferentiableFloatOutput(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x):
        s = torch.sign(x)
        ctx.mark_non_differentiable(s)
        return s, x * 2

    @staticmethod
    def backward(ctx, g_sign, g_y):
        return g_y * 2


class NonDifferentiableFloatOutputWrong(NonDifferentiableFloatOutput):
    @staticmethod
    def backward(ctx, g_sign, g_y):
        return -g_y * 2


def test_mark_non_differentiable_output_passes():
    r = run(NonDifferentiableFloatOutput, rand(4))
    assert status(r) == "pass", bw(r).message


def test_mark_non_differentiable_output_wrong_other_output_fails():
    r = run(NonDifferentiableFloatOutputWrong, rand(4))
    assert status(r) == "fail"
    assert "sign flipped" in row(r, "x").diagnosis


class IgnoresY(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x, y):
        return x * 2

    @staticmethod
    def backward(ctx, g):
        return g * 2, None


class IgnoresYZeros(IgnoresY):
    @staticmethod
    def backward(ctx, g):
        return g * 2, torch.zeros(3, 3, dtype=g.dtype)


@pytest.mark.parametrize("fn", [IgnoresY, IgnoresYZeros])
def test_output_independent_of_an_argument_passes(fn):
    r = run(fn, rand(4), rand(3, 3, seed=1))
    assert status(r) == "pass", bw(r).message
    y = row(r, "y")
    assert status(y) == "pass" and y.mismatched == 0 and y.numel == 9 and y.shape == [3, 3]


def test_argument_without_requires_grad_is_skipped_with_reason():
    r = run(Mul, rand(3), rand(3, seed=1, requires_grad=False))
    assert status(r) == "pass"
    x, y = bw(r).inputs
    assert status(x) == "pass" and x.mismatched == 0
    assert (y.index, y.name, y.shape, status(y)) == (1, "y", [3], "skip")
    assert "requires_grad" in y.reason
    assert y.mismatched is None and y.max_abs_err is None


def test_no_argument_requires_grad_is_a_skip():
    r = run(Mul, rand(3, requires_grad=False), rand(3, seed=1, requires_grad=False))
    assert r.error is None, r.error
    assert status(bw(r)) == "skip" and status(r) == "skip"
    assert all(status(i) == "skip" for i in bw(r).inputs)
    assert "nothing to compare" in bw(r).message


class MulWrongY(Mul):
    @staticmethod
    def backward(ctx, g):
        x, y = ctx.saved_tensors
        return g * y, g * x * 2


def test_wrong_gradient_of_an_argument_without_requires_grad_is_not_judged():
    r = run(MulWrongY, rand(3), rand(3, seed=1, requires_grad=False))
    assert status(r) == "pass", bw(r).message
    assert status(row(r, "y")) == "skip"


def test_integer_tensor_argument_is_skipped():
    r = run(Scale, rand(3), torch.tensor(2))
    assert status(r) == "pass", bw(r).message
    k = row(r, "k")
    assert status(k) == "skip" and k.dtype == "int64" and k.reason


def test_same_tensor_twice_is_checked_once():
    t = rand(4)
    r = run(Mul, t, t)
    assert status(r) == "pass", bw(r).message
    x, y = bw(r).inputs
    assert status(x) == "pass" and x.mismatched == 0
    assert status(y) == "skip" and "same tensor as" in y.reason and "'x'" in y.reason


def test_same_tensor_twice_with_a_wrong_gradient_fails():
    t = rand(4)
    r = run(MulWrongY, t, t)
    assert status(r) == "fail"
    x, y = bw(r).inputs
    # autograd accumulates both gradients: 3t instead of 2t
    assert status(x) == "fail" and "1.50x" in x.diagnosis
    assert status(y) == "skip"


class ComplexSquare(torch.autograd.Function):
    @staticmethod
    def forward(ctx, z):
        ctx.save_for_backward(z)
        return z * z

    @staticmethod
    def backward(ctx, g):
        (z,) = ctx.saved_tensors
        return 2 * g * z.conj()  # PyTorch's convention: grad_output times the conjugate derivative


class ComplexSquareWrong(ComplexSquare):
    @staticmethod
    def backward(ctx, g):
        (z,) = ctx.saved_tensors
        return 2 * g * z  # the conjugate is missing


def test_complex_correct_passes():
    r = run(ComplexSquare, rand(3, dtype=torch.complex128))
    assert status(r) == "pass", bw(r).message
    z = row(r, "z")
    assert z.dtype == "complex128" and z.numel == 3 and z.mismatched == 0


def test_complex_wrong_fails():
    r = run(ComplexSquareWrong, rand(3, dtype=torch.complex128))
    assert status(r) == "fail"
    z = row(r, "z")
    assert status(z) == "fail"
    assert 1 <= z.mismatched <= 3  # counted in elements, not real parts
    assert z.numel == 3
    assert len(z.worst_index) == 1 and 0 <= z.worst_index[0] < 3


class ComplexToReal(torch.autograd.Function):
    """|z|^2 (real output from a complex input): gradient 2 z times the real grad_output."""

    @staticmethod
    def forward(ctx, z):
        ctx.save_for_backward(z)
        return (z * z.conj()).real

    @staticmethod
    def backward(ctx, g):
        (z,) = ctx.saved_tensors
        return 2 * g * z


def test_complex_input_real_output_passes():
    assert status(run(ComplexToReal, rand(4, dtype=torch.complex128))) == "pass"


class ExpWrong(Exp):
    @staticmethod
    def backward(ctx, g):
        (y,) = ctx.saved_tensors
        return g * y * 2


def test_zero_dim_tensor_passes():
    r = run(Exp, torch.tensor(0.3, dtype=F64, requires_grad=True))
    assert status(r) == "pass", bw(r).message
    x = row(r, "x")
    assert x.shape == [] and x.numel == 1 and x.mismatched == 0


def test_zero_dim_tensor_wrong_fails_with_empty_index():
    r = run(ExpWrong, torch.tensor(0.3, dtype=F64, requires_grad=True))
    assert status(r) == "fail"
    x = row(r, "x")
    assert x.mismatched == 1 and x.worst_index == []
    assert "2.00x" in x.diagnosis


class TransposedOutput(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x):
        return (x * 2).t()  # a non-contiguous output

    @staticmethod
    def backward(ctx, g):
        return g.t() * 2  # a non-contiguous gradient


class ExpandedOutput(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x):
        return (x * 2).expand(4, *x.shape)  # stride 0 along the first dimension

    @staticmethod
    def backward(ctx, g):
        return g.sum(0) * 2


class SumExpandedGrad(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x):
        ctx.shape = x.shape
        return x.sum() * 3

    @staticmethod
    def backward(ctx, g):
        return (g * 3).expand(ctx.shape)  # an expanded (stride 0) gradient


class SumExpandedGradWrong(SumExpandedGrad):
    @staticmethod
    def backward(ctx, g):
        return (g * 2).expand(ctx.shape)


@pytest.mark.parametrize("fn", [TransposedOutput, ExpandedOutput, SumExpandedGrad])
def test_strided_outputs_and_gradients_pass(fn):
    r = run(fn, rand(3, 2))
    assert status(r) == "pass", bw(r).message
    assert row(r, "x").mismatched == 0


def test_expanded_wrong_gradient_fails():
    r = run(SumExpandedGradWrong, rand(3, 2))
    assert status(r) == "fail"
    x = row(r, "x")
    assert x.mismatched == 6 and "0.6667x" in x.diagnosis


def test_non_contiguous_input_passes():
    x = torch.randn(4, 3, dtype=F64, generator=torch.Generator().manual_seed(0)).t().requires_grad_()
    assert not x.is_contiguous()
    r = run(Square, x)
    assert r.error is None, r.error
    assert status(r) == "pass", bw(r).message
    assert row(r, "x").shape == [3, 4]


def test_non_contiguous_input_with_wrong_gradient_fails():
    x = torch.randn(4, 3, dtype=F64, generator=torch.Generator().manual_seed(0)).t().requires_grad_()
    r = run(ExpWrong, x)
    assert r.error is None, r.error
    assert status(r) == "fail"


# ------------------------------------------------------------- per-argument numbers


class MulYTwice(Mul):
    """x * y with the gradient of y exactly 2x too large."""

    @staticmethod
    def backward(ctx, g):
        x, y = ctx.saved_tensors
        return g * y, 2 * g * x


def test_twice_the_gradient_numbers():
    x_in, y_in = rand(3, 4), rand(3, 4, seed=1)
    r = run(MulYTwice, x_in, y_in)
    assert status(r) == "fail"
    x, y = bw(r).inputs
    assert status(x) == "pass" and x.mismatched == 0
    assert status(y) == "fail"
    assert (y.index, y.name, y.shape, y.numel) == (1, "y", [3, 4], 12)
    assert y.max_rel_err == pytest.approx(1.0, rel=1e-4)
    assert y.mismatched == y.numel == 12
    assert len(y.worst_index) == 2
    assert all(0 <= i < n for i, n in zip(y.worst_index, y.shape))
    assert y.numerical != 0
    assert y.analytical / y.numerical == pytest.approx(2.0, rel=1e-4)
    # the worst element's numerical value is d(x*y)/dy = x there
    assert y.numerical == pytest.approx(float(x_in.detach()[tuple(y.worst_index)]), rel=1e-4)
    # the largest error is at the largest |x|
    assert abs(y.numerical) == pytest.approx(float(x_in.detach().abs().max()), rel=1e-4)
    assert y.max_abs_err == pytest.approx(float(x_in.detach().abs().max()), rel=1e-4)
    assert "2.00x" in y.diagnosis
    check = bw(r)
    assert "'y'" in check.message and "2.00x" in check.message
    assert "'x'" in check.message  # named as right


class MulSignFlipped(Mul):
    @staticmethod
    def backward(ctx, g):
        x, y = ctx.saved_tensors
        return -g * y, g * x


class MulZeros(Mul):
    @staticmethod
    def backward(ctx, g):
        x, y = ctx.saved_tensors
        return torch.zeros_like(x), g * x


class MulNoneForX(MulZeros):
    @staticmethod
    def backward(ctx, g):
        x, y = ctx.saved_tensors
        return None, g * x


@pytest.mark.parametrize(
    "fn, words", [(MulSignFlipped, "sign flipped"), (MulZeros, "all zeros"), (MulNoneForX, "all zeros")]
)
def test_diagnosis_of_patterns(fn, words):
    r = run(fn, rand(2, 3), rand(2, 3, seed=1))
    assert status(r) == "fail"
    x, y = bw(r).inputs
    assert status(x) == "fail" and x.mismatched == 6
    assert words in x.diagnosis
    assert status(y) == "pass" and y.diagnosis is None


def test_sign_flip_numbers():
    r = run(MulSignFlipped, rand(2, 3), rand(2, 3, seed=1))
    x = row(r, "x")
    assert x.max_rel_err == pytest.approx(2.0, rel=1e-4)
    assert x.analytical == pytest.approx(-x.numerical, rel=1e-4)


class OneWrongElement(Square):
    @staticmethod
    def backward(ctx, g):
        (x,) = ctx.saved_tensors
        grad = 2 * x * g
        grad[1, 2] = grad[1, 2] * 3
        return grad


def test_one_wrong_element():
    r = run(OneWrongElement, rand(3, 4))
    assert status(r) == "fail"
    x = row(r, "x")
    assert x.mismatched == 1 and x.numel == 12
    assert x.worst_index == [1, 2]
    assert x.analytical / x.numerical == pytest.approx(3.0, rel=1e-4)
    assert "1 of 12" in x.diagnosis


class MatMulTransposedGrad(MatMul):
    @staticmethod
    def backward(ctx, g):
        a, w = ctx.saved_tensors
        return g @ w.t(), g.t() @ a  # should be a.t() @ g


def test_transposed_gradient_of_square_matrix():
    r = run(MatMulTransposedGrad, rand(4, 4), rand(4, 4, seed=1))
    assert status(r) == "fail"
    a, w = bw(r).inputs
    assert status(a) == "pass"
    assert status(w) == "fail" and "transposed" in w.diagnosis
    assert len(w.worst_index) == 2


class GradientWithoutDependence(IgnoresY):
    @staticmethod
    def backward(ctx, g):
        return g * 2, torch.ones(3, dtype=g.dtype)


def test_gradient_where_output_does_not_depend():
    r = run(GradientWithoutDependence, rand(4), rand(3, seed=1))
    assert status(r) == "fail"
    x, y = bw(r).inputs
    assert status(x) == "pass"
    assert status(y) == "fail" and y.mismatched == 3
    assert "do not depend" in y.diagnosis


# ------------------------------------------------------------- memory budget


class CountedMatMul(MatMul):
    calls = 0
    wrong = False

    @staticmethod
    def backward(ctx, g):
        CountedMatMul.calls += 1
        a, w = ctx.saved_tensors
        gw = a.t() @ g
        return g @ w.t(), gw * 2 if CountedMatMul.wrong else gw


def _direct(fn, args, memory_bytes):
    target = Target(fn.__qualname__, fn, True)
    bound = bind(target, [(None, a) for a in args], [])
    return backward.run(CheckContext(target, bound, options=Options(Tolerance(), memory_bytes)))


@pytest.mark.parametrize("wrong", [False, True])
def test_tiny_memory_budget_gives_the_same_numbers(wrong, monkeypatch):
    monkeypatch.setattr(CountedMatMul, "wrong", wrong)
    args = [rand(5, 4), rand(4, 3, seed=1)]
    monkeypatch.setattr(CountedMatMul, "calls", 0)
    big = _direct(CountedMatMul, args, MEMORY_BYTES)
    big_calls = CountedMatMul.calls
    monkeypatch.setattr(CountedMatMul, "calls", 0)
    small = _direct(CountedMatMul, args, 64)  # a few entries at a time
    small_calls = CountedMatMul.calls
    # the analytical rows are recomputed for each block of columns
    assert small_calls > big_calls

    assert small.status == big.status
    assert status(big) == ("fail" if wrong else "pass")
    for s, b in zip(small.inputs, big.inputs):
        assert determined(s) == determined(b)
        if s.status.value == "fail":  # a passing row's largest error, and the values where it is, are rounding noise
            assert s.max_abs_err == pytest.approx(b.max_abs_err, rel=1e-9, abs=1e-15)
            assert s.max_rel_err == pytest.approx(b.max_rel_err, rel=1e-9, abs=1e-15)
            assert s.analytical == pytest.approx(b.analytical, rel=1e-9, abs=1e-15)
            assert s.numerical == pytest.approx(b.numerical, rel=1e-9, abs=1e-15)
        else:  # both within the tolerance's rounding floor
            assert max(s.max_abs_err, b.max_abs_err) < 1e-8
        assert s.diagnosis == b.diagnosis
    if wrong:
        w = [r for r in small.inputs if r.name == "w"][0]
        assert w.mismatched == 12 and "2.00x" in w.diagnosis


def test_numerics_compare_memory_budget_does_not_change_entries():
    from gradcheck_cli import numerics

    def fwd(vals):
        a, w = vals
        return (a @ w, (a * a).sum())

    def compare(memory_bytes):
        a, w = rand(3, 4), rand(4, 2, seed=1)
        outputs = fwd([a, w])
        plain = [a.detach().clone(), w.detach().clone()]
        return numerics.compare(
            fwd, outputs, [0, 1], [a, w], plain, plain, eps=1e-6, atol=1e-5, rtol=1e-3, memory_bytes=memory_bytes
        )

    layout_big, big = compare(2**30)
    layout_small, small = compare(40)
    assert layout_big.n_cols == layout_small.n_cols == 12 + 8
    assert layout_big.n_rows == 6 + 1
    for s, b in zip(small, big):
        assert torch.equal(s.bad, b.bad) and not bool(s.bad.any())
        assert s.max_abs == pytest.approx(b.max_abs, rel=1e-9, abs=1e-15)
        assert (s.worst_row, s.worst_col) == (b.worst_row, b.worst_col)
        assert torch.allclose(s.proj_a, b.proj_a) and torch.allclose(s.proj_n, b.proj_n)


# ------------------------------------------------------------- precision, callables


def test_float32_inputs_warn_about_float64():
    r = run(Square, rand(3, dtype=torch.float32))
    assert r.error is None
    warnings = bw(r).warnings
    assert any("float64" in w and "'x'" in w for w in warnings), warnings


def test_float64_inputs_do_not_warn():
    assert bw(run(Square, rand(3))).warnings == []


@pytest.mark.parametrize("fn", [torch.special.erf, torch.sin])
def test_plain_callable_passes(fn):
    r = run(fn, rand(2, 3))
    assert status(r) == "pass", bw(r).message
    (x,) = bw(r).inputs
    assert status(x) == "pass" and x.mismatched == 0 and x.numel == 6 and x.shape == [2, 3]


def test_plain_python_callable_with_kwargs_passes():
    def scaled_tanh(x, *, scale):
        return torch.tanh(x) * scale

    r = run(scaled_tanh, rand(3), kwargs={"scale": 2.5})
    assert status(r) == "pass", bw(r).message
    x = row(r, "x")
    assert status(x) == "pass" and x.mismatched == 0


def test_plain_callable_raising_is_a_forward_error():
    def broken(x):
        raise RuntimeError("plain callable exploded")  # RAISE-PLAIN

    r = run(broken, rand(3))
    assert status(r) == "error" and r.error.kind == "forward"
    assert "plain callable exploded" in r.error.message
    assert f"{THIS_FILE}:{line_of('# RAISE-PLAIN')}" in r.error.where


def test_a_backward_that_returns_nan_every_time_is_not_called_nondeterministic():
    try:
        from corpus import one_input_function
    except ImportError:  # pragma: no cover
        from tests.corpus import one_input_function
    fn = one_input_function(torch.sin, lambda x, g: g * float("nan"), "NanGrad")
    x = torch.randn(3, dtype=torch.float64, generator=torch.Generator().manual_seed(0)).requires_grad_()
    result = gradcheck_cli.check(fn, [x]).checks[0]
    assert result.status.value == "fail" and result.inputs[0].status.value == "fail"
    assert "different values" not in result.message and "nondeterministic" not in result.message, result.message


def test_a_plain_callable_whose_gradient_is_nan_every_time_is_not_called_nondeterministic():
    """The determinism check of a plain callable (autograd's own backward) compares NaN as equal
    too, as backward's contract does for a Function."""
    x = torch.tensor([-1.0, 4.0], dtype=torch.float64, requires_grad=True)  # sqrt(-1): NaN
    result = gradcheck_cli.check(torch.sqrt, [x]).checks[0]
    assert result.status.value == "fail" and "not finite" in result.message
    assert "not deterministic" not in result.message, result.message


@pytest.mark.parametrize("compress", [True, False], ids=["compressed", "plain"])
@pytest.mark.parametrize("shapes", [((0, 4), (3, 4), (3,)), ((2, 0), (3, 0), (3,))], ids=["no output", "no input"])
def test_arguments_or_outputs_without_elements_are_no_internal_error(shapes, compress):
    """An empty batch (no output element to compare) or an empty feature dimension: nothing or only the
    bias to compare, and no internal error (it was IndexError, exit 4, naming an output that has no rows)."""
    from gradcheck_cli import check
    from gradcheck_cli.examples.linear import LinearFunction

    args = [torch.randn(*s, dtype=torch.float64).requires_grad_() for s in shapes]
    result = check(LinearFunction, args, compress=compress)
    assert result.error is None and result.status.value == "pass", result
