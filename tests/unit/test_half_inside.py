"""A forward that computes in bfloat16 or float16 inside: finite differences cannot judge it at any step.

Its outputs change in steps of 2**-7 |y| (bfloat16) or 2**-10 |y| (float16), and its input is rounded
to the same grid before use, so a central difference at the largest step gradcheck-cli takes
(eps 1e-2) still measures rounding, up to about 0.4 |y| / |x| in bfloat16. Judging again there (as a
float32-inside forward is, issue 34) told a correct kernel that "12380 of 32768 elements are wrong".
Now such an argument is not judged by finite differences: where a reference is given the reference
check judges it (the backward row is skipped and says so); without one it fails with "no verdict on
backward" and the advice, never "wrong", named or under `checks: all` alike. A wrong backward still fails: the reference check catches it.
"""

from __future__ import annotations

from typing import Any

import pytest
import torch

from gradcheck_cli import check
from gradcheck_cli.results import Status

INSIDE = (torch.bfloat16, torch.float16)


def make(inside: torch.dtype, factor: float = 1.0) -> type:
    class TanhInside(torch.autograd.Function):
        """tanh computed in ``inside`` precision, whatever dtype it is given; backward likewise."""

        @staticmethod
        def forward(ctx: Any, x: torch.Tensor) -> torch.Tensor:
            ctx.save_for_backward(x)
            return torch.tanh(x.to(inside)).to(x.dtype)

        @staticmethod
        def backward(ctx: Any, g: torch.Tensor) -> torch.Tensor:
            (x,) = ctx.saved_tensors
            t = torch.tanh(x.to(inside))
            return (factor * g.to(inside) * (1 - t * t)).to(x.dtype)

    return TanhInside


def tanh_reference(x: torch.Tensor) -> torch.Tensor:
    return torch.tanh(x)


def x_of(dtype: torch.dtype) -> torch.Tensor:
    gen = torch.Generator().manual_seed(0)
    return (2 * torch.randn(256, generator=gen, dtype=torch.float64)).to(dtype).requires_grad_()


def by_name(result: Any) -> dict[str, Any]:
    assert result.error is None, result.error
    return {c.check: c for c in result.checks}


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float64])
@pytest.mark.parametrize("inside", INSIDE)
def test_with_a_reference_the_reference_check_judges_it(inside, dtype):
    checks = by_name(check(make(inside), [x_of(dtype)], checks=["backward", "reference"], reference=tanh_reference))
    bw = checks["backward"]
    assert bw.status is Status.SKIP, bw.message
    assert bw.inputs[0].status is Status.SKIP
    assert "wrong" not in bw.message and not any("wrong" in w for w in bw.warnings), (bw.message, bw.warnings)
    assert any(
        w.startswith("'x' not checked: finite differences cannot check it at eps=")
        and w.endswith("the reference check judges it")
        for w in bw.warnings
    ), bw.warnings
    if dtype != torch.float64:  # in float64 the reference check says it computes in a lower precision inside
        assert checks["reference"].status is Status.PASS, checks["reference"].message


@pytest.mark.parametrize("inside", INSIDE)
def test_named_without_a_reference_it_fails_with_no_verdict_and_the_advice_not_wrong(inside):
    (bw,) = check(make(inside), [x_of(torch.float64)], checks=["backward"]).checks
    assert bw.status is Status.FAIL, bw.message
    assert "no verdict on backward" in bw.message and "give `reference: pkg.mod:fn`" in bw.message, bw.message
    assert "are wrong" not in bw.message and "is wrong" not in bw.message, bw.message
    assert "not linear" not in bw.message, bw.message  # backward's own rounding is not a nonlinearity


@pytest.mark.parametrize("factor", [1.0, 1.5])
@pytest.mark.parametrize("inside", INSIDE)
def test_a_backward_that_computes_in_half_precision_inside_is_linear_in_grad_output(inside, factor):
    (bw,) = check(make(inside, factor), [x_of(torch.float64)], checks=["backward"]).checks
    assert "not linear" not in bw.message, bw.message


@pytest.mark.slow
def test_under_all_without_a_reference_backward_fails_with_the_advice_as_named():
    """`all` is never laxer than the default check (issue 44: it was a skip, so `all` passed what the default
    failed, a straight-through quantiser among them)"""
    args = [x_of(torch.float64)]
    bw = by_name(check(make(torch.bfloat16), args, checks="all"))["backward"]
    named = by_name(check(make(torch.bfloat16), args))["backward"]
    assert bw.status is Status.FAIL and "no verdict on backward" in bw.message, bw.message
    assert "give `reference: pkg.mod:fn`" in bw.message and "wrong" not in bw.message
    assert (bw.status, bw.message, bw.inputs) == (named.status, named.message, named.inputs)


@pytest.mark.parametrize("inside", INSIDE)
def test_a_wrong_backward_still_fails_through_the_reference(inside):
    result = check(
        make(inside, 1.5), [x_of(torch.bfloat16)], checks=["backward", "reference"], reference=tanh_reference
    )
    checks = by_name(result)
    assert checks["reference"].status is Status.FAIL, checks["reference"].message
    assert result.status is Status.FAIL
