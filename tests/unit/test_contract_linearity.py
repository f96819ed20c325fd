"""Backward's contract in use, in the default ``backward`` check: backward is linear in grad_output
(a backward right only for one-hot, or only for dense, grad_outputs fails), and undefined output
gradients (None after ``ctx.set_materialize_grads(False)``) are handled as zeros, as
torch.autograd.gradcheck's ``check_undefined_grad`` (on by default there) tests them.

Correct Functions (float32, complex, conjugation, sparse and None gradients, ``once_differentiable``,
an integer output, a nondeterministic backward within nondet_tol) must pass; the verdicts agree with
torch.autograd.gradcheck's defaults where torch can judge.
"""

from __future__ import annotations

import warnings
from typing import Any

import pytest
import torch
from torch.autograd import Function
from torch.autograd.function import once_differentiable

import gradcheck_cli
from gradcheck_cli.numerics import vjp
from gradcheck_cli.spec import Tolerance

F64 = torch.float64
NOT_LINEAR = "backward is not linear in grad_output"


def randn(*shape: int, dtype: torch.dtype = F64, seed: int = 0, grad: bool = True) -> torch.Tensor:
    gen = torch.Generator().manual_seed(seed + sum(shape))
    return torch.randn(shape, generator=gen, dtype=dtype).requires_grad_(grad)


def linear_args(n: int, dtype: torch.dtype = F64) -> list[torch.Tensor]:
    return [randn(n, n, dtype=dtype), randn(n, n, dtype=dtype, seed=1), randn(n, dtype=dtype, seed=2)]


def backward_check(fn: Any, args: list[Any], **options: Any) -> Any:
    result = gradcheck_cli.check(fn, args, **options)
    assert result.error is None, result.error
    (check,) = [c for c in result.checks if c.check == "backward"]
    return check


def torch_passes(fn: Any, args: list[Any]) -> bool:
    """torch.autograd.gradcheck with its defaults (check_undefined_grad on); raising counts as failing."""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        try:
            return bool(torch.autograd.gradcheck(fn.apply, tuple(args), raise_exception=False))
        except Exception:
            return False


# ------------------------------------------------------------------------------ Functions


class Linear(Function):
    """x W^T + b, correct."""

    @staticmethod
    def forward(ctx, x, w, b):
        ctx.save_for_backward(x, w)
        return x @ w.t() + b

    @staticmethod
    def backward(ctx, g):
        x, w = ctx.saved_tensors
        return g @ w, g.t() @ x, g.sum(0)


class LinearOneHotOnly(Linear):
    """1.5x the gradients where grad_output has one non-zero element, right for every other."""

    @staticmethod
    def backward(ctx, g):
        x, w = ctx.saved_tensors
        k = 1.5 if int((g != 0).sum()) == 1 else 1.0
        return k * (g @ w), k * (g.t() @ x), k * g.sum(0)


class LinearDenseOnly(Linear):
    """1.5x the gradients where grad_output has no zero element, right for every other."""

    @staticmethod
    def backward(ctx, g):
        x, w = ctx.saved_tensors
        k = 1.5 if bool((g != 0).all()) else 1.0
        return k * (g @ w), k * (g.t() @ x), k * g.sum(0)


class ClipsGrad(Function):
    """Identity with a gradient clipped to [-1, 1]: right for grad_outputs of at most 1, as one-hot rows are."""

    @staticmethod
    def forward(ctx, x):
        return x.clone()

    @staticmethod
    def backward(ctx, g):
        return g.clamp(-1.0, 1.0)


class Square(Function):
    @staticmethod
    def forward(ctx, x):
        ctx.save_for_backward(x)
        return x * x

    @staticmethod
    def backward(ctx, g):
        (x,) = ctx.saved_tensors
        return 2 * x * g


class SquareOnce(Square):
    @staticmethod
    @once_differentiable
    def backward(ctx, g):
        (x,) = ctx.saved_tensors
        return 2 * x * g


class ComplexScale(Function):
    """z * c for complex z and c; PyTorch's convention: grad_z = g * conj(c)."""

    @staticmethod
    def forward(ctx, z, c):
        ctx.save_for_backward(z, c)
        return z * c

    @staticmethod
    def backward(ctx, g):
        z, c = ctx.saved_tensors
        return g * c.conj(), g * z.conj()


class Conj(Function):
    """conj(z): its backward conj(g) is linear over the reals only, as PyTorch's convention has it."""

    @staticmethod
    def forward(ctx, z):
        return z.conj().clone()

    @staticmethod
    def backward(ctx, g):
        return g.conj()


class Gather(Function):
    """weight[index] with a sparse COO gradient for weight (as nn.Embedding(sparse=True) gives)."""

    @staticmethod
    def forward(ctx, weight, index):
        ctx.save_for_backward(index)
        ctx.rows = weight.shape[0]
        return weight[index]

    @staticmethod
    def backward(ctx, g):
        (index,) = ctx.saved_tensors
        grad = torch.sparse_coo_tensor(index.unsqueeze(0), g, (ctx.rows,) + g.shape[1:])
        return grad, None


class IgnoresY(Function):
    """2 x, with y unused: backward returns None for it (a zero gradient)."""

    @staticmethod
    def forward(ctx, x, y):
        return 2 * x

    @staticmethod
    def backward(ctx, g):
        return 2 * g, None


class Jittery(Square):
    """A correct backward with nondeterminism of 1e-10 (as atomic adds give): within nondet_tol 1e-8."""

    @staticmethod
    def backward(ctx, g):
        (x,) = ctx.saved_tensors
        return 2 * x * g + 1e-10 * torch.rand(x.shape, dtype=x.dtype)


class TwoOutputs(Function):
    """(2x, 3x), materialized grads (the default): backward never sees None."""

    @staticmethod
    def forward(ctx, x):
        return 2 * x, 3 * x

    @staticmethod
    def backward(ctx, ga, gb):
        return ga * 2 + gb * 3


class TwoOutputsNone(TwoOutputs):
    """The same backward with ctx.set_materialize_grads(False): it raises once an output is unused."""

    @staticmethod
    def forward(ctx, x):
        ctx.set_materialize_grads(False)
        return 2 * x, 3 * x


class TwoOutputsHandlesNone(TwoOutputsNone):
    @staticmethod
    def backward(ctx, ga, gb):
        grad = None
        for g, k in ((ga, 2), (gb, 3)):
            if g is not None:
                grad = g * k if grad is None else grad + g * k
        return grad


class WithIndex(Function):
    """(x * 2, x ** 2, the argmax of x along its last dimension: an integer output), grads not materialized."""

    @staticmethod
    def forward(ctx, x):
        ctx.set_materialize_grads(False)
        ctx.save_for_backward(x)
        index = x.argmax(-1)
        ctx.mark_non_differentiable(index)
        return x * 2, x * x, index

    @staticmethod
    def backward(ctx, ga, gb, gi):
        (x,) = ctx.saved_tensors
        return ga * 2 + gb * 2 * x


class WithIndexHandlesNone(WithIndex):
    @staticmethod
    def backward(ctx, ga, gb, gi):
        (x,) = ctx.saved_tensors
        grad = torch.zeros_like(x)
        if ga is not None:
            grad = grad + ga * 2
        if gb is not None:
            grad = grad + gb * 2 * x
        return grad


class WithIndexMaterialized(WithIndex):
    @staticmethod
    def forward(ctx, x):
        ctx.save_for_backward(x)
        index = x.argmax(-1)
        ctx.mark_non_differentiable(index)
        return x * 2, x * x, index


class IndexBetween(Function):
    """(x * 2, the argmax: an integer output, x ** 2), handling None (torch's gradcheck cannot judge it:
    it fails at an integer output before a float one)."""

    @staticmethod
    def forward(ctx, x):
        ctx.set_materialize_grads(False)
        ctx.save_for_backward(x)
        index = x.argmax(-1)
        ctx.mark_non_differentiable(index)
        return x * 2, index, x * x

    @staticmethod
    def backward(ctx, ga, gi, gb):
        (x,) = ctx.saved_tensors
        grad = torch.zeros_like(x)
        if ga is not None:
            grad = grad + ga * 2
        if gb is not None:
            grad = grad + gb * 2 * x
        return grad


class IndexBetweenBreaks(IndexBetween):
    @staticmethod
    def backward(ctx, ga, gi, gb):
        (x,) = ctx.saved_tensors
        return ga * 2 + gb * 2 * x


# ------------------------------------------------------------------------------ linearity


@pytest.mark.parametrize("n", [4, 64])
@pytest.mark.parametrize("fn, ratio", [(LinearOneHotOnly, "1.5x"), (LinearDenseOnly, "0.667x")])
def test_a_backward_not_linear_in_grad_output_fails(fn: Any, ratio: str, n: int) -> None:
    # n = 64: compressed rows (grad_outputs 1 at many elements) and columns; n = 4: element by element,
    # whose one-hot rows pass the dense-only one
    check = backward_check(fn, linear_args(n))
    assert check.status.value == "fail", check.message
    assert check.message.startswith(f"{NOT_LINEAR}: for a one-hot grad_output (output 0 at ["), check.message
    assert f"it returns {ratio} the gradients of 'x', 'w', 'b' that dense grad_outputs imply" in check.message
    assert all(r.status.value == "fail" for r in check.inputs)


@pytest.mark.slow
@pytest.mark.parametrize("seed", [0, 1, 2])
def test_a_one_hot_only_backward_fails_whatever_the_seed(seed: int) -> None:
    check = backward_check(LinearOneHotOnly, linear_args(64), seed=seed)
    assert check.status.value == "fail" and NOT_LINEAR in check.message


def test_a_clipped_gradient_fails() -> None:
    check = backward_check(ClipsGrad, [randn(6, 5)])
    assert check.status.value == "fail", check.message
    assert f"{NOT_LINEAR}: for a one-hot grad_output (output 0 at [" in check.message
    assert "of 'x'" in check.message and "a clamp" in check.message


def test_one_hot_only_agrees_with_torch() -> None:
    # torch's slow mode reads one-hot rows: it fails the one-hot-only backward too (the dense-only one it
    # cannot see: its rows are one-hot)
    args = linear_args(4)
    assert not torch_passes(LinearOneHotOnly, args)
    assert torch_passes(Linear, args)


CORRECT: list[tuple[str, Any, Any, dict[str, Any]]] = [
    ("linear-f64", Linear, lambda: linear_args(64), {}),
    ("linear-f32", Linear, lambda: linear_args(64, torch.float32), {}),
    ("linear-f32-small", Linear, lambda: linear_args(5, torch.float32), {}),
    ("square", Square, lambda: [randn(7, 3)], {}),
    ("once-differentiable", SquareOnce, lambda: [randn(7, 3)], {}),
    (
        "complex-scale",
        ComplexScale,
        lambda: [randn(4, 3, dtype=torch.complex128), randn(4, 3, dtype=torch.complex128, seed=1)],
        {},
    ),
    (
        "complex64-scale",
        ComplexScale,
        lambda: [randn(4, 3, dtype=torch.complex64), randn(4, 3, dtype=torch.complex64, seed=1)],
        {},
    ),
    ("conj", Conj, lambda: [randn(5, dtype=torch.complex128)], {}),
    ("none-grad", IgnoresY, lambda: [randn(5), randn(5, seed=1)], {}),
    ("jittery", Jittery, lambda: [randn(4, 4)], {"nondet_tol": 1e-8}),
    ("two-outputs", TwoOutputs, lambda: [randn(5)], {}),
    ("two-outputs-handles-none", TwoOutputsHandlesNone, lambda: [randn(5)], {}),
    ("with-index-handles-none", WithIndexHandlesNone, lambda: [randn(3, 4)], {}),
    ("with-index-materialized", WithIndexMaterialized, lambda: [randn(3, 4)], {}),
    ("index-between-handles-none", IndexBetween, lambda: [randn(3, 4)], {}),
]


@pytest.mark.parametrize("fn, make, options", [c[1:] for c in CORRECT], ids=[c[0] for c in CORRECT])
def test_correct_functions_still_pass(fn: Any, make: Any, options: dict[str, Any]) -> None:
    check = backward_check(fn, make(), **options)
    assert check.status.value == "pass", check.message
    assert check.problems == []


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64, torch.complex64])
def test_linearity_passes_rounding_of_a_long_sum(dtype: torch.dtype) -> None:
    # a gradient that sums 20,000 products of mixed signs: each call rounds differently
    x = randn(200, 100, dtype=dtype)
    w = randn(100, 100, dtype=dtype, seed=1)
    out = x @ w
    from gradcheck_cli.checks.parts import linearity  # here: the module is new

    def backward(live: Any, inputs: Any, grads: Any) -> Any:
        return vjp(live, inputs, grads)

    message, bad = linearity.examine(
        backward, [out], [0], [x, w], ["x", "w"], None, torch.Generator().manual_seed(0), Tolerance(atol=0.0, rtol=0.0)
    )
    assert message is None and bad == []


def test_linearity_reads_sparse_and_none_gradients() -> None:
    # (the backward check itself cannot read a sparse gradient yet: its contract compares with torch.equal)
    from gradcheck_cli.checks.parts import linearity  # here: the module is new

    weight, index = randn(6, 3), torch.tensor([4, 0, 4, 2])
    out = weight[index]

    def sparse(live: Any, inputs: Any, grads: Any) -> Any:
        (g,) = grads
        return torch.sparse_coo_tensor(index.unsqueeze(0), g, (6, 3)), None

    def sparse_clipped(live: Any, inputs: Any, grads: Any) -> Any:
        (g,) = grads
        return torch.sparse_coo_tensor(index.unsqueeze(0), g.clamp(-1, 1), (6, 3)), None

    other = randn(2)
    gen = torch.Generator().manual_seed(0)
    assert linearity.examine(sparse, [out], [0], [weight, other], ["weight", "other"], None, gen, Tolerance()) == (
        None,
        [],
    )
    message, bad = linearity.examine(
        sparse_clipped, [out], [0], [weight, other], ["weight", "other"], None, gen, Tolerance()
    )
    assert message is not None and message.startswith(NOT_LINEAR) and "of 'weight'" in message and bad == [0]


# ------------------------------------------------------------------------------ undefined output gradients


def test_a_backward_that_breaks_on_an_undefined_gradient_fails_by_default() -> None:
    check = backward_check(TwoOutputsNone, [randn(5)])
    assert check.status.value == "fail", check.message
    assert check.message.startswith(
        "backward raised TypeError when the gradient of output 1 ('gb') is undefined (None) at "
    ), check.message
    assert "handle it (e.g. `if gb is not None:`)" in check.message


@pytest.mark.parametrize("fn", [WithIndex, IndexBetweenBreaks])
def test_an_integer_output_beside_two_that_break_on_none(fn: Any) -> None:
    check = backward_check(fn, [randn(3, 4)])
    assert check.status.value == "fail", check.message
    assert "backward raised TypeError when the gradient of output " in check.message
    assert "is undefined (None)" in check.message and "'gi'" not in check.message


def test_the_backward_verdict_does_not_depend_on_the_undefined_grad_check() -> None:
    alone = gradcheck_cli.check(TwoOutputsNone, [randn(5)], checks=["backward"])
    both = gradcheck_cli.check(TwoOutputsNone, [randn(5)], checks=["backward", "undefined_grad"])
    statuses = {c.check: c.status.value for c in both.checks}
    assert alone.checks[0].status.value == statuses["backward"] == statuses["undefined_grad"] == "fail"
    assert alone.checks[0].message == both.checks[0].message


AGREEMENT: list[tuple[Any, Any, bool]] = [
    (Linear, lambda: linear_args(4), True),
    (LinearOneHotOnly, lambda: linear_args(4), False),
    (TwoOutputs, lambda: [randn(5)], True),
    (TwoOutputsNone, lambda: [randn(5)], False),
    (TwoOutputsHandlesNone, lambda: [randn(5)], True),
    (WithIndex, lambda: [randn(3, 4)], False),
    (WithIndexHandlesNone, lambda: [randn(3, 4)], True),
    (WithIndexMaterialized, lambda: [randn(3, 4)], True),
    (IgnoresY, lambda: [randn(5), randn(5, seed=1)], True),
    (SquareOnce, lambda: [randn(3, 2)], True),
]


@pytest.mark.parametrize("fn, make, correct", AGREEMENT, ids=[a[0].__name__ for a in AGREEMENT])
def test_the_default_verdict_agrees_with_torch_gradcheck(fn: Any, make: Any, correct: bool) -> None:
    args = make()
    ours = backward_check(fn, args).status.value == "pass"
    assert ours == torch_passes(fn, args) == correct
