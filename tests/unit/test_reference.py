"""The reference check (issue 15): kernels against a plain PyTorch reference, under both rules, and
intended gradients (reference_backward); its verdicts agree with finite differences on float64
Functions, and backward refuses half-precision-only Functions with advice instead of a wrong verdict."""

from __future__ import annotations

from typing import Any

import corpus
import pytest
import torch

from gradcheck_cli import check
from gradcheck_cli.examples import broken, kernels
from gradcheck_cli.results import ErrorKind, Pattern, Status
from gradcheck_cli.subject.target import Target

RELATIVE = {"rule": "relative"}
ALLCLOSE = {"rule": "allclose"}


def x(*shape: int, dtype: torch.dtype = torch.bfloat16, seed: int = 0, scale: float = 1.0) -> torch.Tensor:
    g = torch.Generator().manual_seed(seed)
    return (torch.randn(*shape, generator=g, dtype=torch.float64) * scale).to(dtype).requires_grad_()


def rows(result: Any) -> dict[str, Any]:
    (ref,) = [c for c in result.checks if c.check == "reference"]
    return {r.name: r for r in ref.inputs}


# ------------------------------------------------------------------- each example under each rule


@pytest.mark.parametrize("rule", [RELATIVE, ALLCLOSE, None], ids=["relative", "allclose", "default"])
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
@pytest.mark.parametrize(
    "fn, right",
    [(kernels.FusedGELU, True), (kernels.GELUBf16Inside, True), (broken.GELUWrongGrad, False)],
    ids=["fused", "bf16_inside", "wrong_4pct"],
)
def test_kernel_examples_get_their_verdict_under_each_rule(fn, right, dtype, rule):
    if fn is kernels.GELUBf16Inside and dtype is torch.float16:
        right = False  # computing in bfloat16 inside a float16 kernel loses 3 bits that float16 keeps
    result = check(fn, [x(16, 128, dtype=dtype)], reference=kernels.gelu_reference, reference_tolerance=rule)
    assert result.status is (Status.PASS if right else Status.FAIL), str(result)
    assert [c.check for c in result.checks] == ["reference"]  # no finite differences
    row = rows(result)["x"]
    assert row.numel == 16 * 128 and row.max_abs_err is not None and row.worst_index is not None
    if fn is broken.GELUWrongGrad:
        assert row.pattern is Pattern.CONSTANT_RATIO and row.ratio == pytest.approx(1.04, abs=5e-3)
        assert "1.04x the reference's" in result.checks[0].message
        assert rows(result)["output"].status is Status.PASS  # forward is right, only backward is off


def test_the_relative_rule_reports_the_baseline_and_allows_factor_times_it():
    result = check(broken.GELUWrongGrad, [x(16, 128)], reference=kernels.gelu_reference)
    row = rows(result)["x"]
    assert result.checks[0].mode == "relative" and row.factor == 2.0
    assert row.baseline_err and row.max_abs_err > 2 * row.baseline_err
    assert f"{row.max_abs_err / row.baseline_err:.3g}x the reference's own" in result.checks[0].message
    loose = check(
        broken.GELUWrongGrad,
        [x(16, 128)],
        reference=kernels.gelu_reference,
        reference_tolerance={"rule": "relative", "factor": 10.0},
    )
    assert loose.status is Status.PASS  # 4% is within 10x bfloat16's own error


def test_finite_differences_in_bfloat16_judge_the_kernels_wrongly_the_reference_rightly():
    # what the issue measured: a correct kernel computing in bfloat16 inside fails finite differences
    # in float64, and the 4%-wrong backward passes them in bfloat16; the reference gets all right
    inside = check(kernels.GELUBf16Inside, [x(8, 64, dtype=torch.float64)])
    assert inside.status is Status.FAIL
    by_reference = check(kernels.GELUBf16Inside, [x(8, 64)], reference=kernels.gelu_reference)
    assert by_reference.status is Status.PASS


def test_a_half_precision_only_kernel_is_refused_by_finite_differences_with_advice():
    alone = check(kernels.FusedGELU, [x(8, 64)])
    assert alone.status is Status.ERROR and alone.error.kind is ErrorKind.SPEC
    assert "forward fails in float64" in alone.error.message and "reference: pkg.mod:fn" in alone.error.message
    under_all = check(kernels.FusedGELU, [x(8, 64)], checks=["all"])
    backward = under_all.checks[0]
    assert backward.check == "backward" and backward.status is Status.SKIP and "reference:" in backward.message
    both = check(kernels.FusedGELU, [x(8, 64)], checks=["backward", "reference"], reference=kernels.gelu_reference)
    assert [c.status for c in both.checks] == [Status.SKIP, Status.PASS]
    assert "the reference check judges it" in both.checks[0].message


def test_float32_that_fails_in_float64_still_differences_but_recommends_a_reference():
    def only_float32(t: torch.Tensor) -> torch.Tensor:
        if t.dtype is not torch.float32:
            raise TypeError("float32 only")
        return t * t

    result = check(only_float32, [x(4, dtype=torch.float32)])
    assert result.status is Status.PASS and any("reference: pkg.mod:fn" in w for c in result.checks for w in c.warnings)


# ------------------------------------------------------------------------- intended gradients


def test_a_straight_through_estimator_passes_against_its_intended_surrogate_and_fails_finite_differences():
    args = [x(6, 5, dtype=torch.float64, scale=2.0)]
    assert check(kernels.RoundSTE, args).status is Status.FAIL  # not the derivative of round
    result = check(kernels.RoundSTE, args, reference_backward=kernels.round_ste_intended)
    assert result.status is Status.PASS, str(result)
    assert "forward's outputs not compared" in result.checks[0].message
    clipped = check(broken.RoundSTEClipped, args, reference_backward=kernels.round_ste_intended)
    row = rows(clipped)["x"]
    assert clipped.status is Status.FAIL and row.pattern is Pattern.SOME_ELEMENTS
    assert row.mismatched == int((args[0].abs() > 1).sum())


def test_gradient_reversal_against_its_intended_gradient():
    args = [x(4, 5, dtype=torch.float64), 0.5]
    result = check(kernels.GradReverse, args, reference_backward=kernels.grad_reverse_intended)
    assert result.status is Status.PASS, str(result)
    assert [r.status for r in result.checks[0].inputs] == [Status.PASS, Status.SKIP]  # lambd is no tensor

    def wrong_scale(inputs: tuple, grad_outputs: tuple) -> tuple:
        return -2.0 * grad_outputs[0], None

    off = check(kernels.GradReverse, args, reference_backward=wrong_scale)
    assert off.status is Status.FAIL and rows(off)["x"].ratio == pytest.approx(0.25)


def test_reference_backward_must_return_one_gradient_per_argument():
    result = check(
        kernels.GradReverse, [x(3, dtype=torch.float64), 0.5], reference_backward=lambda inputs, grads: (grads[0],)
    )
    assert result.status is Status.ERROR and result.error.kind is ErrorKind.SPEC
    assert "reference_backward" in result.error.message and "1 value for 2 arguments" in result.error.message


def test_a_reference_with_other_outputs_is_an_error_that_says_so():
    result = check(kernels.GELUBf16Inside, [x(4, 3)], reference=lambda t: t.sum(0))
    assert result.status is Status.ERROR and "output 0 of the reference" in result.error.message
    assert "[3]" in result.error.message and "[4, 3]" in result.error.message


def test_a_reference_whose_output_does_not_require_grad_is_an_error_not_a_wrong_fail():
    result = check(kernels.GELUBf16Inside, [x(4, 3)], reference=lambda t: kernels.gelu_reference(t).detach())
    assert result.status is Status.ERROR and "does not require grad" in result.error.message
    assert "reference_backward" in result.error.message


def test_the_reference_check_named_without_a_reference_is_a_spec_error_and_skips_under_all():
    named = check(corpus.Square, [x(3, dtype=torch.float64)], checks=["reference"])
    assert named.status is Status.ERROR and "reference: pkg.mod:fn" in named.error.message
    under_all = check(corpus.Square, [x(3, dtype=torch.float64)], checks=["all"])
    (ref,) = [c for c in under_all.checks if c.check == "reference"]
    assert ref.status is Status.SKIP and under_all.status is Status.PASS


@pytest.mark.parametrize("dtype", [torch.float64, torch.float32])
def test_a_target_that_computes_in_bfloat16_inside_is_named_so(dtype):
    result = check(kernels.GELUBf16Inside, [x(8, 256, dtype=dtype)], reference=kernels.gelu_reference)
    assert result.status is Status.FAIL
    assert "is bfloat16's rounding: does it compute in bfloat16 inside?" in rows(result)["x"].diagnosis
    assert "dtype: bfloat16" in result.checks[0].message


def test_a_reference_in_a_lower_precision_sets_the_allclose_defaults():
    # a float64 target against a float32 reference: float64's 1e-7 would fail a correct target
    result = check(
        kernels.GELUBf16Inside,
        [x(8, 16, dtype=torch.float32)],
        reference=kernels.gelu_reference,
        reference_dtype="float64",
    )
    assert result.status is Status.FAIL  # bfloat16 inside a float32 kernel: float32's rtol 1.3e-6 catches it
    exact = check(corpus.Square, [x(8, 16, dtype=torch.float64)], reference=lambda t: t * t, reference_dtype="float32")
    assert exact.status is Status.PASS, str(exact)
    assert rows(exact)["x"].rtol == 1.3e-6


def test_nan_where_the_reference_has_nan_agrees_and_nan_elsewhere_fails():
    def log_kernel(t: torch.Tensor) -> torch.Tensor:
        return torch.log(t)

    class BadLog(torch.autograd.Function):
        @staticmethod
        def forward(ctx: Any, t: torch.Tensor) -> torch.Tensor:
            ctx.save_for_backward(t)
            return torch.log(t)

        @staticmethod
        def backward(ctx: Any, g: torch.Tensor) -> torch.Tensor:
            (t,) = ctx.saved_tensors
            return torch.where(t > 2, torch.nan, g / t)

    t = torch.tensor([-1.0, 0.5, 1.0, 3.0], dtype=torch.float64, requires_grad=True)  # log(-1) is NaN on both sides
    assert check(log_kernel, [t], reference=torch.log).status is Status.PASS
    bad = check(BadLog, [t], reference=torch.log)
    assert bad.status is Status.FAIL and rows(bad)["t"].pattern is Pattern.NONFINITE


# --------------------------------------------------------- the reference rule agrees with finite differences


def _autograd_of_forward(fn: type) -> Any:
    """The reference every corpus Function has: its own forward, differentiated by autograd (not by
    its hand-written backward)."""
    target = Target(fn.__name__, fn, True)
    return lambda *args: target.body(args)


AGREEMENT = [c for c in corpus.CORPUS if c.torch_can_judge]


@pytest.mark.parametrize("case", AGREEMENT, ids=[c.name for c in AGREEMENT])
def test_the_reference_check_agrees_with_finite_differences_on_float64_functions(case):
    args = case.make_args(torch.Generator().manual_seed(0))
    by_fd = check(case.fn, args, case.kwargs)
    by_reference = check(
        case.fn,
        args,
        case.kwargs,
        reference=_autograd_of_forward(case.fn),
        reference_tolerance={"rule": "allclose", "atol": 1e-5, "rtol": 1e-3},
    )
    if by_reference.status is Status.ERROR:
        pytest.skip(f"its forward is not differentiable by autograd as written: {by_reference.error.message}")
    assert by_fd.status is (Status.PASS if case.correct else Status.FAIL)
    assert by_reference.status is by_fd.status, str(by_reference)
    wrong_fd = {r.name for c in by_fd.checks for r in c.inputs if r.status is Status.FAIL}
    wrong_ref = {r.name for r in by_reference.checks[0].inputs if r.status is Status.FAIL and r.role == "argument"}
    assert wrong_ref == wrong_fd
