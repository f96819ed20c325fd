"""double_backward's verdict on a correct first-order backward that is not differentiable (issue 28): its
second derivatives come out silently zero, a fail named or under `checks: all` alike (issue 44); one whose
double backward raises in use (`out=`, @once_differentiable) skips under `all` and fails named; a
differentiable backward whose second derivative is wrong fails either way. The truth set is in
tests/truth_sets.py."""

from __future__ import annotations

import importlib
from typing import Any, Callable

import pytest
import torch

from gradcheck_cli import spec
from gradcheck_cli.results import Status
from gradcheck_cli.run import runner
from tests.truth_sets import (
    DOMAIN_EDGE,
    FLOAT32,
    LINEAR,
    LINEAR32,
    NOT_DIFFERENTIABLE,
    RIGHT,
    TRUTH,
    WRONG_JVP,
    WRONG_SECOND,
    X,
)
from tests.truth_sets import NOT_DIFFERENTIABLE_MODULE as MODULE

# the truth set (tests/truth_sets.py holds every check's, for the relations of tests/cli/test_selection_relations.py)


def double_backward(user_module, write_spec, function, checks):
    mod = user_module(MODULE)
    (case,) = spec.load_file(
        write_spec(f"""
        function: {mod}:{function}
        checks: {checks}
        inputs: [{{name: x, shape: [3, 4]}}]
    """)
    )
    assert not isinstance(case, spec.SpecError), case
    result = runner.run_case(case, "cpu")
    assert result.error is None, result.error
    return result, next(c for c in result.checks if c.check == "double_backward")


SILENT = [f for f in NOT_DIFFERENTIABLE if f != "OutMulSquare"]  # OutMulSquare: double backward raises in use


@pytest.mark.parametrize("function", SILENT)
def test_a_correct_backward_that_is_silently_not_differentiable_fails_under_all_as_named(
    user_module, write_spec, function
):
    """its Hessian-vector products and gradient penalties come out silently zero (PyTorch issue 104040): a
    fail under `all` too, in the words of the named check (issue 44; it was a skip with a warning)"""
    result, found = double_backward(user_module, write_spec, function, "all")
    assert found.status is Status.FAIL, found.message
    assert "backward is not differentiable with respect to 'x' and not marked @once_differentiable" in found.message
    assert "come out silently zero or partial" in found.message and "that one decorator is the fix" in found.message
    assert "wrong" not in found.message.split(";")[0]
    assert next(c for c in result.checks if c.check == "backward").status is Status.PASS
    _, named = double_backward(user_module, write_spec, function, "[double_backward]")
    assert (found.status, found.message, found.inputs) == (named.status, named.message, named.inputs)


@pytest.mark.parametrize("checks", ["all", "[double_backward]"])
def test_a_backward_whose_graph_autograd_cannot_record_skips_under_all_and_fails_named(user_module, write_spec, checks):
    """`out=` makes double backward raise in use (not a silent zero), as @once_differentiable does"""
    _, found = double_backward(user_module, write_spec, "OutMulSquare", checks)
    assert found.message.startswith("backward cannot be differentiated") and "out=" in found.message
    assert "that one decorator is the fix" in found.message
    if checks == "all":
        assert found.status is Status.SKIP and any("@once_differentiable" in w for w in found.warnings)
    else:
        assert found.status is Status.FAIL and "named explicitly" in found.message


@pytest.mark.parametrize("function", NOT_DIFFERENTIABLE + RIGHT + ["WrongSecondDerivative"])
def test_the_labels_agree_with_torch(user_module, function):
    """each label as torch.autograd.gradcheck / gradgradcheck say in float64: first order right, second
    order wrong (not differentiable, or wrong) or right"""
    fn = getattr(importlib.import_module(user_module(MODULE)), function)
    x = torch.randn(3, 4, dtype=torch.float64, generator=torch.Generator().manual_seed(0), requires_grad=True)
    assert torch.autograd.gradcheck(fn.apply, (x,))
    assert _gradgradcheck(fn.apply, (x,)) is (function in RIGHT)


@pytest.mark.parametrize("function", SILENT)
def test_the_same_backward_fails_when_double_backward_is_named(user_module, write_spec, function):
    """named, the hazard's words (it said "the derivative of backward ... is wrong")"""
    _, found = double_backward(user_module, write_spec, function, "[double_backward]")
    assert found.status is Status.FAIL, found.message
    assert found.message.startswith("backward is not differentiable with respect to 'x"), found.message
    assert "come out silently zero or partial" in found.message
    assert "named explicitly" not in found.message and "is wrong" not in found.message


@pytest.mark.parametrize("checks", ["all", "[double_backward]"])
def test_a_differentiable_backward_with_a_wrong_second_derivative_fails_everywhere(user_module, write_spec, checks):
    _, found = double_backward(user_module, write_spec, "WrongSecondDerivative", checks)
    assert found.status is Status.FAIL, found.message
    assert "not differentiable" not in found.message


@pytest.mark.parametrize("function", RIGHT)
@pytest.mark.parametrize("checks", ["all", "[double_backward]"])
def test_a_right_differentiable_backward_passes(user_module, write_spec, function, checks):
    _, found = double_backward(user_module, write_spec, function, checks)
    assert found.status is Status.PASS, found.message


def _gradgradcheck(fn: Callable[..., Any], args: tuple[Any, ...], **tolerance: float) -> bool:
    """torch's verdict on the second derivative: True, or False where it fails or backward cannot be recorded."""
    try:
        return bool(torch.autograd.gradgradcheck(fn, args, raise_exception=False, **tolerance))
    except RuntimeError:
        return False


# ------------------------------------------------ float32, domain edges, broken: the truth set of double_backward,
# forward_ad and undefined_grad (issue 28)


def judge(user_module, write_spec, function: str, inputs: str, checks: str) -> Any:
    """The case's result through the CLI's entry (runner.run_case), on the CPU."""
    mod = user_module(TRUTH, "truthmod")
    (case,) = spec.load_file(write_spec(f"function: {mod}:{function}\nchecks: {checks}\ninputs: {inputs}\n"))
    assert not isinstance(case, spec.SpecError), case
    result = runner.run_case(case, "cpu")
    assert result.error is None, result.error
    return result


def check(result: Any, name: str) -> Any:
    return next(c for c in result.checks if c.check == name)


@pytest.mark.slow
@pytest.mark.parametrize("function,inputs", FLOAT32 + DOMAIN_EDGE, ids=lambda v: v if "[" not in v else "")
def test_correct_float32_and_domain_edge_functions_pass_or_skip_under_all(user_module, write_spec, function, inputs):
    result = judge(user_module, write_spec, function, inputs, "all")
    for name in ("backward", "double_backward", "forward_ad", "undefined_grad"):
        found = check(result, name)
        assert found.status in (Status.PASS, Status.SKIP), (name, found.message)
        assert "wrong" not in found.message, (name, found.message)


@pytest.mark.parametrize("function,inputs", FLOAT32 + DOMAIN_EDGE[:5], ids=lambda v: v if "[" not in v else "")
def test_named_they_pass_too(user_module, write_spec, function, inputs):
    """every one but Entmax15, whose second derivative autograd makes NaN off its support (a fail, named)"""
    result = judge(user_module, write_spec, function, inputs, "[double_backward, forward_ad]")
    for name in ("double_backward", "forward_ad"):
        assert check(result, name).status is Status.PASS, (name, check(result, name).message)


def test_entmax_nan_second_derivative_is_the_domain_edge_story_not_wrong(user_module, write_spec):
    result = judge(user_module, write_spec, "Entmax15", "[{name: x, shape: [3, 5]}]", "all")
    found = check(result, "double_backward")
    assert found.status is Status.SKIP and "wrong" not in found.message
    assert found.message.startswith("backward, differentiated, gives NaN or infinite values at x[")
    assert "edge of its domain" in found.message and found.warnings
    named = check(
        judge(user_module, write_spec, "Entmax15", "[{name: x, shape: [3, 5]}]", "[double_backward]"), "double_backward"
    )
    assert named.status is Status.FAIL and "edge of its domain" in named.message


def test_float32_inside_is_judged_at_a_larger_step(user_module, write_spec):
    result = judge(user_module, write_spec, "CastExp", X, "[double_backward, forward_ad]")
    for name in ("double_backward", "forward_ad"):
        found = check(result, name)
        assert found.status is Status.PASS, found.message
        assert any(
            "computes in float32 or lower precision inside" in w and "judged at eps" in w for w in found.warnings
        ), found.warnings


@pytest.mark.slow
@pytest.mark.parametrize("checks", ["all", "[double_backward]"])
@pytest.mark.parametrize("function,inputs", WRONG_SECOND, ids=lambda v: v if "[" not in v else "")
def test_a_wrong_second_derivative_fails(user_module, write_spec, function, inputs, checks):
    found = check(judge(user_module, write_spec, function, inputs, checks), "double_backward")
    assert found.status is Status.FAIL, found.message
    assert "is wrong" in found.message and "not differentiable" not in found.message


@pytest.mark.slow
@pytest.mark.parametrize("checks", ["all", "[forward_ad]"])
@pytest.mark.parametrize("function,inputs", WRONG_JVP, ids=lambda v: v if "[" not in v else "")
def test_a_wrong_jvp_fails(user_module, write_spec, function, inputs, checks):
    found = check(judge(user_module, write_spec, function, inputs, checks), "forward_ad")
    assert found.status is Status.FAIL, found.message
    assert "is wrong" in found.message


@pytest.mark.parametrize("checks", ["all", "[undefined_grad]"])
def test_a_backward_that_crashes_on_an_undefined_grad_fails(user_module, write_spec, checks):
    found = check(judge(user_module, write_spec, "TwoOutputsCrashOnNone", X, checks), "undefined_grad")
    assert found.status is Status.FAIL, found.message


def _float64(inputs: str) -> tuple[torch.Tensor, ...]:
    """Float64 arguments for torch's checks: away from any edge (the labels hold for the Function, and torch
    cannot judge at an edge)."""
    gen = torch.Generator().manual_seed(1)
    shapes = {LINEAR32: [(3, 4), (5, 4)], LINEAR: [(3, 4), (5, 4)]}.get(inputs, [(3, 4)])
    return tuple((torch.rand(s, dtype=torch.float64, generator=gen) * 0.8 + 0.1).requires_grad_() for s in shapes)


@pytest.mark.parametrize(
    "function,inputs,first,second",
    [
        *[(f, i, True, True) for f, i in FLOAT32 + DOMAIN_EDGE],
        *[(f, i, True, False) for f, i in WRONG_SECOND],
        *[(f, i, True, True) for f, i in WRONG_JVP],
    ],
    ids=lambda v: v if isinstance(v, str) and "[" not in v else "",
)
def test_the_truth_set_labels_agree_with_torch(user_module, function, inputs, first, second):
    """gradcheck / gradgradcheck (and the jvp with check_forward_ad) in float64 at inner points; float32
    inside: at eps 1e-2 with float32's tolerances, where torch's default step measures rounding"""
    fn = getattr(importlib.import_module(user_module(TRUTH, "truthmod")), function)
    args = _float64(inputs)
    loose = {"eps": 1e-2, "atol": 1e-3, "rtol": 1e-2} if function.startswith("Cast") else {}
    if function == "Entmax15":  # every element in the support: sqrt(y) away from 0
        args = (torch.tensor([[0.1, 0.2, 0.15, 0.12, 0.18]], dtype=torch.float64, requires_grad=True),)
    assert torch.autograd.gradcheck(fn.apply, args, raise_exception=False, **loose) is first
    assert _gradgradcheck(fn.apply, args, **loose) is second
    if (function, inputs) in WRONG_JVP or function in ("Square", "Sin", "Softplus", "CastExp", "Sqrt"):
        right = (function, inputs) not in WRONG_JVP
        assert (
            torch.autograd.gradcheck(
                fn.apply, args, check_forward_ad=True, check_backward_ad=False, raise_exception=False, **loose
            )
            is right
        )


WRONG_SHAPE = """
import torch

class WrongShape(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x):
        ctx.save_for_backward(x)
        return x * x
    @staticmethod
    def backward(ctx, g):
        (x,) = ctx.saved_tensors
        return (g * 2 * x)[:2]
"""


@pytest.mark.parametrize("checks", ["[backward]", "[backward, double_backward]", "[double_backward]"])
def test_a_broken_contract_is_the_same_fail_whichever_checks_run(user_module, write_spec, checks):
    """it was an error of the whole case ("backward raised", exit 3) once double_backward ran"""
    mod = user_module(WRONG_SHAPE, "shapemod")
    (case,) = spec.load_file(
        write_spec(f"function: {mod}:WrongShape\nchecks: {checks}\ninputs: [{{name: x, shape: [3, 4]}}]\n")
    )
    result = runner.run_case(case, "cpu")
    assert result.error is None, result.error
    assert result.status is Status.FAIL
    for found in result.checks:
        assert found.status is Status.FAIL
        assert (
            found.message == "backward returned shape [2, 4] for 'x' of shape [3, 4]: a gradient has its input's shape"
        )


@pytest.mark.slow
@pytest.mark.parametrize("checks", ["all", "[batched]", "[undefined_grad]"])
def test_a_broken_contract_is_no_error_under_any_check(user_module, write_spec, checks):
    """under `all` the batched check's call of backward raised: an error of the whole case (exit 3); now every
    check that meets the broken contract fails with backward's words, and the others skip"""
    mod = user_module(WRONG_SHAPE, "shapemod_all")
    (case,) = spec.load_file(
        write_spec(f"function: {mod}:WrongShape\nchecks: {checks}\ninputs: [{{name: x, shape: [3, 4]}}]\n")
    )
    result = runner.run_case(case, "cpu")
    assert result.error is None, result.error
    assert result.status is Status.FAIL
    words = "backward returned shape [2, 4] for 'x' of shape [3, 4]: a gradient has its input's shape"
    for found in result.checks:
        assert found.status is Status.SKIP or words in found.message, (found.check, found.status, found.message)
    assert {c.check for c in result.checks if c.status is Status.FAIL} >= ({"backward"} if checks == "all" else set())


@pytest.mark.parametrize("name", ["double_backward", "batched", "undefined_grad"])
def test_the_library_api_reports_a_broken_contract_as_the_runner_does(user_module, name):
    """check(..., checks=[name]) runs each check through runner.run_check, as a spec run does (batched
    from Python was an error)"""
    import gradcheck_cli

    fn = importlib.import_module(user_module(WRONG_SHAPE, "shapemod_api")).WrongShape
    x = torch.randn(3, 4, dtype=torch.float64, requires_grad=True)
    result = gradcheck_cli.check(fn, [x], checks=[name])
    assert result.error is None, result.error
    (found,) = result.checks
    assert found.status is Status.FAIL
    assert found.message == "backward returned shape [2, 4] for 'x' of shape [3, 4]: a gradient has its input's shape"
