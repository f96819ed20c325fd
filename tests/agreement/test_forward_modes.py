"""The ``forward_over_reverse`` and ``batched_forward`` checks.

A labelled corpus (the Functions of ``gradcheck_cli.examples.forward_modes`` and a few written here:
correct ones, and ones with a wrong forward-mode derivative of backward or a jvp that is wrong only under
vmap) is run through both checks, and the verdicts must equal those of
``torch.autograd.gradgradcheck(check_fwd_over_rev=True, check_rev_over_rev=False)`` and
``torch.autograd.gradcheck(check_forward_ad=True, check_batched_forward_grad=True)`` on the same inputs.
What the checks cannot support (no jvp in backward's helper, a jvp that vmap refuses) skips under
`checks: all` and fails when named; torch raises on those.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable

import pytest
import torch
from torch.autograd import Function
from torch.autograd.function import once_differentiable

import gradcheck_cli
from gradcheck_cli.examples import forward_modes as fm
from gradcheck_cli.examples.higher import LogSumExp, MaxWithIndex, ScaledMul
from gradcheck_cli.results import CheckResult, Status

try:  # tests/agreement on sys.path (rootdir-style collection) or tests/ as a package
    from test_higher_order import DOUBLE_BACKWARD, FORWARD_AD, SinNoGradBackward
except ImportError:  # pragma: no cover
    from tests.agreement.test_higher_order import DOUBLE_BACKWARD, FORWARD_AD, SinNoGradBackward

DT = torch.float64


def _randn(g: torch.Generator, *shape: int) -> torch.Tensor:
    return torch.randn(shape, generator=g, dtype=DT).requires_grad_(True)


def check_of(name: str, fn: Any, args: tuple) -> CheckResult:
    result = gradcheck_cli.check(fn, args, checks=[name])
    assert result.error is None, result.error
    (check,) = result.checks
    return check


def under_all(name: str, fn: Any, args: tuple) -> CheckResult:
    """Check ``name`` as ``checks: all`` runs it (the check not named)."""
    result = gradcheck_cli.check(fn, args, checks=["all"])
    assert result.error is None, result.error
    return next(c for c in result.checks if c.check == name)


# ------------------------------------------------------------------------ Functions of their own


class ExpJvpTwice(fm.Exp):
    """exp whose jvp is 2x: backward uses the saved output, whose tangent comes from this jvp."""

    @staticmethod
    def jvp(ctx, t):
        (y,) = ctx.saved_tensors
        return 2 * t * y


class ProductDropsSecondTangent(Function):
    """a * b whose jvp forgets the tangent of b (backward right): a helper of BilinearByHelper."""

    @staticmethod
    def forward(ctx, a, b):
        ctx.save_for_backward(a, b)
        ctx.save_for_forward(a, b)
        return a * b

    @staticmethod
    def backward(ctx, g):
        a, b = ctx.saved_tensors
        return g * b, g * a

    @staticmethod
    def jvp(ctx, a_t, b_t):
        a, b = ctx.saved_tensors
        return a_t * b  # BUG: + a * b_t


class BilinearByHelper(fm.Bilinear):
    """(x * y).sum(-1) whose backward multiplies through ProductDropsSecondTangent."""

    @staticmethod
    def backward(ctx, grad):
        x, y = ctx.saved_tensors
        g = grad.unsqueeze(-1)
        return ProductDropsSecondTangent.apply(g, y), ProductDropsSecondTangent.apply(g, x)


class SinDetachedInBackward(fm.SinByHelper):
    """Right first-order backward computed on x.detach(): not differentiable in either mode."""

    @staticmethod
    def backward(ctx, grad):
        (x,) = ctx.saved_tensors
        return grad * x.detach().cos()


class SquareMixesBatch(Function):
    """x ** 2 whose jvp mixes the entries of a tangent under vmap only (it branches on being batched)."""

    @staticmethod
    def forward(ctx, x):
        ctx.save_for_forward(x)
        ctx.save_for_backward(x)
        return x**2

    @staticmethod
    def backward(ctx, g):
        (x,) = ctx.saved_tensors
        return 2 * x * g

    @staticmethod
    def jvp(ctx, t):
        (x,) = ctx.saved_tensors
        if "Batched" in str(torch._C._dispatch_keys(t)):  # BUG: a path of its own for batches
            return 2 * x * t.flip(-1)
        return 2 * x * t


class CubeBufferJvp(fm.Cube):
    """x ** 3 whose jvp writes into a buffer it created itself: vmap refuses it."""

    @staticmethod
    def jvp(ctx, t):
        (x,) = ctx.saved_tensors
        out = torch.zeros(x.shape, dtype=x.dtype)
        out.copy_(3 * x**2 * t)
        return out


# ------------------------------------------------------------------------------- the corpus


@dataclass(frozen=True)
class Case:
    name: str
    fn: Any
    make_args: Callable[[torch.Generator], tuple]
    correct: bool
    wrong_rows: tuple = field(default=())


def _x(g):
    return (_randn(g, 3, 4),)


def _two(g):
    return (_randn(g, 3, 4), _randn(g, 3, 4))


CORRECT = [
    Case("ok_cube", fm.Cube, _x, True),
    Case("ok_exp_saved_output", fm.Exp, _x, True),
    Case("ok_backward_calls_a_right_helper", fm.SinByHelper, _x, True),
    Case("ok_bilinear_two_inputs", fm.Bilinear, _two, True),
    Case("ok_scaled_mul_nontensor", ScaledMul, lambda g: (*_two(g), 2.5), True),
    Case("ok_logsumexp_int_dim", LogSumExp, lambda g: (_randn(g, 3, 5), 0), True),
    Case("ok_max_with_int_output", MaxWithIndex, lambda g: (_randn(g, 3, 5),), True),
    Case("ok_plain_callable", fm.softplus, lambda g: (_randn(g, 6), 2.0), True),
]

FORWARD_OVER_REVERSE = CORRECT + [
    Case("bad_helper_jvp_sign", fm.SinHelperWrongJvp, _x, False, ("x",)),
    Case("bad_helper_jvp_zero", fm.SinHelperZeroJvp, _x, False, ("x",)),
    Case("bad_helper_jvp_drops_a_term", BilinearByHelper, _two, False, ("x", "y")),
    Case("bad_own_jvp_2x_saved_output", ExpJvpTwice, _x, False, ("x",)),
]

BATCHED_FORWARD = CORRECT + [
    Case("bad_fallback_forgets_factor", fm.DoubleZeroFastPath, _x, False, ("x",)),
    Case("bad_batch_path_mixes_entries", SquareMixesBatch, _x, False, ("x",)),
]


def _args(case: Case) -> tuple:
    return case.make_args(torch.Generator().manual_seed(1234))


def _apply(fn: Any) -> Callable:
    return fn.apply if isinstance(fn, type) else fn


def torch_says(check: str, fn: Any, args: tuple) -> bool:
    try:
        if check == "forward_over_reverse":
            return bool(
                torch.autograd.gradgradcheck(
                    _apply(fn),
                    args,
                    check_fwd_over_rev=True,
                    check_rev_over_rev=False,
                    check_undefined_grad=False,
                    raise_exception=False,
                )
            )
        return bool(
            torch.autograd.gradcheck(
                _apply(fn),
                args,
                check_forward_ad=True,
                check_backward_ad=False,
                check_undefined_grad=False,
                check_batched_forward_grad=True,
                raise_exception=False,
            )
        )
    except Exception:  # torch raised instead of answering: not a pass
        return False


def test_corpus_is_big_enough():
    for cases in (FORWARD_OVER_REVERSE, BATCHED_FORWARD):
        assert sum(c.correct for c in cases) >= 8 and sum(not c.correct for c in cases) >= 2


@pytest.mark.parametrize(
    "check_name,case",
    [("forward_over_reverse", c) for c in FORWARD_OVER_REVERSE] + [("batched_forward", c) for c in BATCHED_FORWARD],
    ids=[f"forward_over_reverse-{c.name}" for c in FORWARD_OVER_REVERSE]
    + [f"batched_forward-{c.name}" for c in BATCHED_FORWARD],
)
def test_verdict_agrees_with_torch(check_name, case):
    args = _args(case)
    assert torch_says(check_name, case.fn, args) is case.correct, "the corpus label disagrees with torch"
    check = check_of(check_name, case.fn, args)
    assert check.status is (Status.PASS if case.correct else Status.FAIL), check.message
    failed = {r.name for r in check.inputs if r.status is Status.FAIL}
    assert failed == set(case.wrong_rows), (failed, check.message)
    for r in check.inputs:
        if r.status is Status.FAIL:
            assert r.mismatched and r.worst_index is not None and r.max_abs_err, r


def test_the_broken_helpers_pass_every_older_check():
    """What forward_over_reverse finds, backward, double_backward and forward_ad all miss (and torch's
    gradgradcheck in reverse over reverse too)."""
    for fn in (fm.SinHelperWrongJvp, fm.SinHelperZeroJvp):
        args = _x(torch.Generator().manual_seed(0))
        assert torch.autograd.gradgradcheck(fn.apply, args)
        result = gradcheck_cli.check(fn, args, checks=["backward", "double_backward", "forward_ad"])
        assert [c.status for c in result.checks] == [Status.PASS] * 3, [c.message for c in result.checks]


# ------------------------------------------------------------------------ forward_over_reverse in words


def test_a_wrong_helper_jvp_is_named_with_its_pattern():
    check = check_of("forward_over_reverse", fm.SinHelperWrongJvp, _x(torch.Generator().manual_seed(0)))
    assert check.message.startswith("the forward-mode derivative of backward along 'x' is wrong: sign flipped")
    assert [(r.name, r.status) for r in check.inputs] == [("x", Status.FAIL), ("grad_output 0", Status.PASS)]


def test_a_tangent_lost_in_forward_mode_only_is_wrong_everywhere():
    args = _x(torch.Generator().manual_seed(0))
    named = check_of("forward_over_reverse", fm.SinHelperZeroJvp, args)
    assert named.status is Status.FAIL
    assert "reverse mode (double_backward) finds a derivative there" in named.message
    assert "a Function that backward calls has a jvp that drops it" in named.message


@pytest.mark.slow
def test_helper_without_jvp_fails_when_named_and_skips_under_all_saying_where():
    args = _x(torch.Generator().manual_seed(0))
    named = check_of("forward_over_reverse", fm.SinHelperNoJvp, args)
    assert named.status is Status.FAIL and "named explicitly" in named.message
    assert named.message.startswith("backward cannot be pushed forward: ")
    assert "defines no jvp()" in named.message and "forward_modes.py:" in named.message
    assert under_all("forward_over_reverse", fm.SinHelperNoJvp, args).status is Status.SKIP
    assert not torch_says("forward_over_reverse", fm.SinHelperNoJvp, args)
    # the lost tangent of a helper is a finding everywhere, not an unsupported case
    assert under_all("forward_over_reverse", fm.SinHelperZeroJvp, args).status is Status.FAIL


def test_backward_outside_autograd_fails_named_and_under_all_alike():
    """its second derivatives come out silently zero: a fail under `all` too (issue 44; it was a warning)"""
    args = _x(torch.Generator().manual_seed(0))
    named = check_of("forward_over_reverse", SinDetachedInBackward, args)
    assert named.status is Status.FAIL
    assert "backward is not differentiable with respect to 'x'" in named.message
    assert "named explicitly" not in named.message and "that one decorator is the fix" in named.message
    every = under_all("forward_over_reverse", SinDetachedInBackward, args)
    assert (every.status, every.message) == (named.status, named.message)
    assert not torch_says("forward_over_reverse", SinDetachedInBackward, args)


def test_a_function_without_jvp_cannot_run_forward_on_dual_numbers():
    from gradcheck_cli.examples.vmap import Softplus  # backward only

    args = _x(torch.Generator().manual_seed(0))
    for name in ("forward_over_reverse", "batched_forward"):
        check = check_of(name, Softplus, args)
        assert check.status is Status.FAIL and "defines no jvp()" in check.message, check.message
        # called inside a plain callable: the same, at the line that calls it
        check = check_of(name, lambda x: Softplus.apply(x) + 1, args)
        assert check.status is Status.FAIL and "an autograd.Function it calls defines no jvp()" in check.message
        assert "test_forward_modes.py:" in check.message, check.message
    assert not torch_says("forward_over_reverse", Softplus, args)


# ------------------------------------------------------------------------ batched_forward in words


def test_a_fallback_taken_under_vmap_only_is_named_by_element_and_values():
    check = check_of("batched_forward", fm.DoubleZeroFastPath, _x(torch.Generator().manual_seed(0)))
    (x,) = check.inputs
    assert x.status is Status.FAIL and x.mismatched == 12 and x.max_abs_err == pytest.approx(1.0)
    assert check.message.startswith(
        "the tangent along 'x' differs when batched (max abs err 1, one-hot tangent at x[0, 0], output 0 [0, 0]; "
        "batched 1, alone 2)"
    )


@pytest.mark.parametrize("fn,words", [(fm.CubeItemJvp, "jvp calls .item()"), (CubeBufferJvp, "jvp writes batched")])
def test_jvp_code_vmap_refuses_fails_when_named(fn, words):
    args = _x(torch.Generator().manual_seed(0))
    check = check_of("batched_forward", fn, args)
    assert check.status is Status.FAIL and check.message.startswith(words), check.message
    assert "forward_modes.py:" in check.message or "test_forward_modes.py:" in check.message
    assert "batched_forward was named explicitly" in check.message
    assert not torch_says("batched_forward", fn, args)


def test_jvp_code_vmap_refuses_is_a_warning_under_all():
    args = _x(torch.Generator().manual_seed(0))
    result = gradcheck_cli.check(fm.CubeItemJvp, args, checks=["all"])
    check = next(c for c in result.checks if c.check == "batched_forward")
    assert check.status is Status.SKIP and "a warning under `checks: all`" in check.message
    assert any("jvp calls .item()" in w for w in check.warnings), check.warnings


def test_nothing_requires_grad_or_no_differentiable_output_is_a_skip():
    x = torch.randn(3, dtype=DT)
    for name in ("forward_over_reverse", "batched_forward"):
        check = check_of(name, lambda a, b: (a * b).sum(), (x, torch.randn(3, dtype=DT).requires_grad_()))
        assert check.status is Status.PASS  # 'a' does not require grad, 'b' does
        check = check_of(name, lambda a: (a > 0).long(), (x.clone().requires_grad_(),))
        assert check.status is Status.SKIP and "no output is differentiable" in check.message


def test_same_tensor_twice_and_complex():
    g = torch.Generator().manual_seed(3)
    x = _randn(g, 4)
    z = torch.randn(3, generator=g, dtype=torch.complex128).requires_grad_()
    for name in ("forward_over_reverse", "batched_forward"):
        assert check_of(name, lambda a, b: a * b.sin(), (x, x)).status is Status.PASS
        assert check_of(name, lambda a: a * a.sin(), (z,)).status is Status.PASS
    assert check_of("forward_over_reverse", lambda a: (a * a.conj()).real + a.abs(), (z,)).status is Status.PASS


def test_what_torch_cannot_batch_is_a_skip_not_a_fail():
    """conj() under torch's vmap over forward-mode AD trips an internal assert of torch (torch's gradcheck
    raises it too): torch's limit, not the function's."""
    z = torch.randn(3, generator=torch.Generator().manual_seed(3), dtype=torch.complex128).requires_grad_()
    fn = lambda a: (a * a.conj()).real  # noqa: E731
    check = check_of("batched_forward", fn, (z,))
    assert check.status is Status.SKIP and "cannot be checked here" in check.message, check.message
    assert "INTERNAL ASSERT FAILED" in check.message


# ------------------------------------------------------------------------ specs


@pytest.mark.slow
def test_shipped_specs_pass_and_broken_ones_fail(monkeypatch, invoke):
    import json

    monkeypatch.chdir(Path(__file__).resolve().parents[2])
    good = invoke("specs/forward_modes.yaml", "--no-isolate", "--format", "json")
    assert good.exit_code == 0, good.output
    for res in json.loads(good.stdout)["results"]:
        statuses = {c["check"]: c["status"] for c in res["checks"]}
        assert statuses["forward_over_reverse"] == statuses["batched_forward"] == "pass", (res["id"], statuses)
    bad = invoke("broken-specs/", "--no-isolate", "--format", "json", "-k", "forward_modes")
    assert bad.exit_code == 1, bad.output
    results = json.loads(bad.stdout)["results"]
    assert len(results) == 2 and all(r["status"] == "fail" for r in results)


class CubeDetachJvp(fm.Cube):
    """x ** 3 whose jvp detaches its tangent: right, but torch's vmap has no batching rule for aten::detach."""

    @staticmethod
    def jvp(ctx, t):
        (x,) = ctx.saved_tensors
        return 3 * x**2 * t.detach()


def test_an_op_torch_cannot_batch_is_named_in_a_skip():
    args = _x(torch.Generator().manual_seed(0))
    check = check_of("batched_forward", CubeDetachJvp, args)
    assert check.status is Status.SKIP, check.message
    assert check.message.startswith("torch has no batching rule for aten::detach (used by jvp at ")
    assert "test_forward_modes.py:" in check.message
    assert check_of("forward_ad", CubeDetachJvp, args).status is Status.PASS


@pytest.mark.parametrize("fn", [fm.Cube, fm.Exp, fm.SinByHelper])
def test_float32_functions_pass_judged_in_float64(fn):
    x = torch.randn(3, 4, generator=torch.Generator().manual_seed(5)).requires_grad_()  # float32
    for name in ("forward_over_reverse", "batched_forward"):
        check = check_of(name, fn, (x,))
        assert check.status is Status.PASS, check.message
    assert check_of("forward_over_reverse", fm.SinHelperWrongJvp, (x,)).status is Status.FAIL


def test_a_function_without_jvp_called_in_forward_is_not_blamed_on_backward():
    from gradcheck_cli.examples.vmap import Softplus  # backward only

    check = check_of("forward_over_reverse", lambda x: Softplus.apply(x) * 2, _x(torch.Generator().manual_seed(0)))
    assert check.status is Status.FAIL
    assert check.message.startswith("forward-mode AD is not supported: an autograd.Function it calls defines no jvp()")
    assert "(forward over reverse runs forward on dual numbers, which needs it)" in check.message


class SinOnce(fm.SinByHelper):
    """Right, with a jvp, and backward marked @once_differentiable: no second derivative declared."""

    @staticmethod
    @once_differentiable
    def backward(ctx, grad):
        (x,) = ctx.saved_tensors
        return grad * x.cos()


def test_once_differentiable_fails_when_named_and_skips_under_all():
    args = _x(torch.Generator().manual_seed(0))
    named = check_of("forward_over_reverse", SinOnce, args)
    assert named.status is Status.FAIL and named.message.startswith("backward is marked @once_differentiable")
    assert under_all("forward_over_reverse", SinOnce, args).status is Status.SKIP
    assert not torch_says("forward_over_reverse", SinOnce, args)  # torch finds no tangent through it


# ------------------------------------------------------------------------ the older corpora


def _batched_part_of_torchs_check(fn: Any, args: tuple) -> bool:
    """torch's check_batched_forward_grad alone (gradcheck runs it after judging the jvp's values, which
    forward_ad judges here)."""
    import sys

    try:
        return bool(sys.modules["torch.autograd.gradcheck"]._test_batched_grad_forward_ad(_apply(fn), args))
    except Exception:  # torch raised instead of answering: not a pass
        return False


OLDER = {f"double_backward-{c.name}": c for c in DOUBLE_BACKWARD} | {f"forward_ad-{c.name}": c for c in FORWARD_AD}


@pytest.mark.parametrize("key", sorted(OLDER))
def test_forward_over_reverse_agrees_with_torch_on_the_older_corpora(key):
    case = OLDER[key]
    args = case.make_args(torch.Generator().manual_seed(1234))
    check = check_of("forward_over_reverse", case.fn, args)
    if case.fn is SinNoGradBackward:
        # backward under torch.no_grad(): forward mode still carries the right tangent through it, so this check
        # passes; torch fails it because its outputs do not require grad ("Numerical gradient for function
        # expected to be zero"), a reverse-mode property that double_backward judges
        assert check.status is Status.PASS, check.message
        assert not torch_says("forward_over_reverse", case.fn, args)
        assert check_of("double_backward", case.fn, args).status is Status.FAIL
        return
    assert (check.status is Status.PASS) is torch_says("forward_over_reverse", case.fn, args), check.message


@pytest.mark.parametrize("key", sorted(k for k in OLDER if k.startswith("forward_ad-")))
def test_batched_forward_agrees_with_torchs_batched_part_on_wrong_and_right_jvps(key):
    """A wrong jvp that is wrong the same way batched is forward_ad's finding, not this check's."""
    case = OLDER[key]
    args = case.make_args(torch.Generator().manual_seed(1234))
    assert _batched_part_of_torchs_check(case.fn, args)
    assert check_of("batched_forward", case.fn, args).status is Status.PASS
