"""A failing row's words say what its numbers show, and no more (issue 27 item 9): a constant ratio only
where it accounts for the mismatching entries, a gradient where the outputs do not depend on the
elements said as such, and a max relative error that counts the mismatching entries."""

from __future__ import annotations

import json
import math

import pytest
import torch

from gradcheck_cli import check
from gradcheck_cli.results import Pattern, Status, to_dict

F64 = torch.float64


class DropsSmall(torch.autograd.Function):
    """y = scale * x; backward zeroes the gradients below 1e-3 (a 'sparsified' backward)."""

    @staticmethod
    def forward(ctx, x, scale):
        ctx.save_for_backward(scale)
        return scale * x

    @staticmethod
    def backward(ctx, g):
        (scale,) = ctx.saved_tensors
        grad = g * scale
        return grad.masked_fill(grad.abs() < 1e-3, 0.0), None


class DoubledDropsSmall(DropsSmall):
    @staticmethod
    def backward(ctx, g):
        (scale,) = ctx.saved_tensors
        grad = 2 * g * scale
        return grad.masked_fill(grad.abs() < 1e-3, 0.0), None


class MaskedMean(torch.autograd.Function):
    """The mean of x where mask is true; backward forgets the mask."""

    @staticmethod
    def forward(ctx, x, mask):
        ctx.count, ctx.shape = int(mask.sum()), x.shape
        return (x * mask).sum() / ctx.count

    @staticmethod
    def backward(ctx, g):
        return g.expand(ctx.shape) / ctx.count, None


class CausalSum(torch.autograd.Function):
    """y_i = sum of x_j for j <= i; backward forgets the causal mask (every y_i gets every x_j)."""

    @staticmethod
    def forward(ctx, x):
        return x.cumsum(0)

    @staticmethod
    def backward(ctx, g):
        return g.sum().expand(g.shape).clone()


def _small_and_large() -> list[torch.Tensor]:
    """x (9 x 10), and a scale of 25 elements about 1.5 and 65 of -1e-4 to -4e-4."""
    g = torch.Generator().manual_seed(0)
    x = torch.randn(9, 10, generator=g, dtype=F64, requires_grad=True)
    large = torch.zeros(90, dtype=torch.bool)
    large[torch.randperm(90, generator=g)[:25]] = True
    scale = torch.where(
        large, 1 + torch.rand(90, generator=g, dtype=F64), -(1e-4 + 3e-4 * torch.rand(90, generator=g, dtype=F64))
    )
    return [x, scale.view(9, 10)]


def _torch_fails(fn: type, args: list[torch.Tensor]) -> bool:
    return not torch.autograd.gradcheck(fn.apply, args, raise_exception=False)


@pytest.mark.parametrize("probes", [0, 4])
def test_a_gradient_wrong_in_65_of_90_elements_is_no_constant_ratio(probes):
    # it said "analytical is 1.00x numerical": a ratio of 0.99999999 fitted through everything, which the
    # 65 small elements (analytical 0) hardly moved
    args = _small_and_large()
    result = check(DropsSmall, args, probes=probes)
    row = result.checks[0].inputs[0]
    assert (result.status, row.pattern, row.ratio, row.mismatched) == (Status.FAIL, Pattern.SOME_ELEMENTS, None, 65)
    assert row.diagnosis == (
        "65 of 90 elements are wrong, the others match (worst x[2, 7] at output 0 [2, 7]: "
        "analytical 0, numerical -0.000394)"
    )
    assert row.max_rel_err == pytest.approx(1.0)  # |0 - n| / |n| at the mismatching elements
    assert _torch_fails(DropsSmall, args)


def test_a_ratio_that_leaves_the_mismatching_elements_unexplained_is_not_named():
    # 2x on 25 large elements, 0 on 65 small ones: the least-squares ratio 2.00 fits within rtol^2 (the
    # small ones weigh nothing), but explains none of the 65
    args = _small_and_large()
    result = check(DoubledDropsSmall, args)
    row = result.checks[0].inputs[0]
    assert (result.status, row.pattern, row.ratio, row.mismatched) == (Status.FAIL, Pattern.NO_PATTERN, None, 90)
    assert row.diagnosis.startswith("wrong everywhere, with no constant ratio or sign flip (worst x[")
    assert _torch_fails(DoubledDropsSmall, args)


class Doubled(DropsSmall):
    @staticmethod
    def backward(ctx, g):
        (scale,) = ctx.saved_tensors
        return 2 * g * scale, None


def test_a_ratio_that_explains_every_mismatch_is_still_named():
    result = check(Doubled, _small_and_large())
    row = result.checks[0].inputs[0]
    assert (row.pattern, row.diagnosis, row.ratio) == (
        Pattern.CONSTANT_RATIO,
        "analytical is 2.00x numerical",
        pytest.approx(2.0),
    )


@pytest.mark.parametrize("probes", [0, 4])
def test_a_masked_mean_that_forgets_its_mask_gives_a_gradient_the_outputs_do_not_depend_on(probes):
    # it said "6 of 10 elements are wrong, the others match" with "max rel err 1.4e-10": relative error
    # skipped the elements whose numerical gradient is 0, which are exactly the wrong ones
    x = torch.randn(10, dtype=F64, generator=torch.Generator().manual_seed(0), requires_grad=True)
    mask = torch.tensor([1, 0, 0, 1, 0, 1, 0, 0, 1, 0], dtype=torch.bool)
    result = check(MaskedMean, [x, mask], probes=probes)
    row = result.checks[0].inputs[0]
    assert (result.status, row.pattern, row.mismatched) == (Status.FAIL, Pattern.ZERO_NUMERICAL, 6)
    assert row.diagnosis == (
        "analytical is non-zero at 6 elements the outputs do not depend on (e.g. x[1]: analytical 0.25, numerical 0)"
    )
    assert result.checks[0].message == f"gradient of 'x': {row.diagnosis}"
    assert row.max_rel_err == math.inf  # |0.25 - 0| / 0
    assert to_dict(row)["max_rel_err"] is None  # JSON has no infinity
    assert " inf " in str(result)  # the table's max rel err
    assert _torch_fails(MaskedMean, [x, mask])


def test_a_causal_sum_that_forgets_its_mask_is_said_entry_by_entry():
    # each x_j moves the outputs y_i for i >= j, so the columns are not zero: the wrong entries are
    x = torch.randn(5, dtype=F64, generator=torch.Generator().manual_seed(0), requires_grad=True)
    result = check(CausalSum, [x])
    row = result.checks[0].inputs[0]
    assert (result.status, row.pattern, row.mismatched) == (Status.FAIL, Pattern.ZERO_NUMERICAL, 4)
    assert row.diagnosis == (
        "analytical is non-zero where the outputs do not depend on x: at 10 Jacobian entries "
        "of 4 elements (e.g. x[1] at output 0 [0]: analytical 1, numerical 0)"
    )
    assert _torch_fails(CausalSum, [x])


FIRST_TWO = """
import torch


class FirstTwo(torch.autograd.Function):
    # the sum of x's first two elements; backward gives every element the gradient

    @staticmethod
    def forward(ctx, x):
        ctx.shape = x.shape
        return x[:2].sum()

    @staticmethod
    def backward(ctx, g):
        return g.expand(ctx.shape).clone()
"""


def test_the_json_report_writes_an_infinite_relative_error_as_null(user_module, write_spec, invoke):
    user_module(FIRST_TWO)
    write_spec("function: usermod:FirstTwo\ninputs: [{name: x, shape: [4]}]\n", "specs/s.yaml")
    result = invoke("specs/s.yaml", "--no-isolate", "--format", "json")
    assert result.exit_code == 1, result.output
    (row,) = json.loads(result.stdout)["results"][0]["checks"][0]["inputs"]
    assert (row["pattern"], row["max_rel_err"], row["max_abs_err"]) == ("zero_numerical", None, 1.0)
    assert row["diagnosis"] == (
        "analytical is non-zero at 2 elements the outputs do not depend on (e.g. x[2]: analytical 1, numerical 0)"
    )
