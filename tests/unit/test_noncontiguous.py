"""The ``noncontiguous`` check: backward again with the same values laid out otherwise in memory.

Its truth set: Functions right for every layout pass; a backward right only for contiguous tensors fails,
naming the side whose layout broke it; a backward wrong for contiguous tensors too is the backward check's
to report (a skip here)."""

from __future__ import annotations

from typing import Any

import pytest
import torch

import gradcheck_cli
from gradcheck_cli.checks.noncontiguous import relaid
from gradcheck_cli.examples import broken, layouts
from gradcheck_cli.examples.linear import LinearFunction
from gradcheck_cli.results import Status


def _check(fn: Any, *shapes: tuple[int, ...]) -> Any:
    torch.manual_seed(0)
    args = [torch.randn(*s, dtype=torch.float64, requires_grad=True) for s in shapes]
    (found,) = gradcheck_cli.check(fn, args, checks=["noncontiguous"]).checks
    return found


class ViewInput(torch.autograd.Function):
    """Forward flattens its argument with .view: it raises for a transposed one."""

    @staticmethod
    def forward(ctx: Any, x: torch.Tensor) -> torch.Tensor:
        ctx.shape = x.shape
        return x.view(-1) * 2

    @staticmethod
    def backward(ctx: Any, g: torch.Tensor) -> torch.Tensor:
        return (g * 2).reshape(ctx.shape)


class Seen(torch.autograd.Function):
    """Records the layouts it is called with (x * 3, right for every layout)."""

    inputs: list[bool] = []
    grads: list[bool] = []

    @staticmethod
    def forward(ctx: Any, x: torch.Tensor) -> torch.Tensor:
        Seen.inputs.append(x.is_contiguous())
        return x * 3

    @staticmethod
    def backward(ctx: Any, g: torch.Tensor) -> torch.Tensor:
        Seen.grads.append(g.is_contiguous())
        return g * 3


@pytest.mark.parametrize(
    "fn,shapes",
    [
        (layouts.RowScale, [(3, 4), (3,)]),
        (LinearFunction, [(4, 3), (5, 3), (5,)]),
        (torch.sin, [(2, 3, 4)]),
        (Seen, [(5,)]),
        (Seen, [(1, 1)]),  # a single element: no other layout, and nothing wrong
    ],
)
def test_a_backward_right_for_every_layout_passes(fn, shapes):
    found = _check(fn, *shapes)
    assert found.status is Status.PASS, found.message
    assert found.message.startswith("3 random grad_outputs: the gradients of ")
    assert found.message.endswith(
        "are the same with non-contiguous arguments and grad_outputs (transposed, or strided where 1-D)"
    )


def test_the_function_sees_non_contiguous_arguments_and_grad_outputs():
    Seen.inputs.clear(), Seen.grads.clear()
    assert _check(Seen, (3, 4)).status is Status.PASS
    assert False in Seen.inputs and False in Seen.grads


@pytest.mark.parametrize(
    "fn,shapes,words",
    [
        (
            layouts.RowScaleView,
            [(3, 4), (3,)],
            "with non-contiguous grad_outputs (transposed, or strided where 1-D), backward raised RuntimeError: view size",
        ),
        (
            layouts.RowScaleRawStorage,
            [(3, 4), (3,)],
            "backward is wrong when the grad_outputs are non-contiguous (transposed, or strided where 1-D) and right",
        ),
        (ViewInput, [(3, 4)], "with non-contiguous arguments (transposed, or strided where 1-D), forward raised"),
    ],
)
def test_a_backward_right_only_for_contiguous_tensors_fails_naming_the_side(fn, shapes, words):
    found = _check(fn, *shapes)
    assert found.status is Status.FAIL and words in found.message, found.message
    assert "arguments and grad_outputs" not in found.message  # the side alone that breaks it, not both


def test_a_forward_that_computes_otherwise_in_another_layout_and_is_right_passes():
    # dropout: rand_like follows the strides, so a transposed x gets its random numbers in another order
    # and the gradients change; the function in that layout agrees with its own finite differences
    # (a wrong FAIL before: the gradients were only compared with the contiguous ones)
    from gradcheck_cli.examples.compiled import Dropout

    found = _check(Dropout, (3, 4))
    assert found.status is Status.PASS, found.message
    assert "the gradients change when the arguments are non-contiguous" in found.message
    assert "and so does the function" in found.message


def test_the_same_functions_pass_the_backward_check_with_contiguous_tensors():
    # what makes the cases above a layout bug: the ordinary check passes them
    for fn, shapes in [(layouts.RowScaleView, [(3, 4), (3,)]), (layouts.RowScaleRawStorage, [(3, 4), (3,)])]:
        torch.manual_seed(0)
        args = [torch.randn(*s, dtype=torch.float64, requires_grad=True) for s in shapes]
        assert gradcheck_cli.check(fn, args).status is Status.PASS
        assert torch.autograd.gradcheck(fn.apply, tuple(args))


def test_a_backward_wrong_with_contiguous_tensors_too_is_the_backward_checks_to_fail():
    # this check asks whether the layout changes backward's answer: here it does not (backward fails it)
    found = _check(broken.LinearDoubleBias, (4, 3), (5, 3), (5,))
    assert found.status is Status.PASS, found.message
    args = [torch.randn(*s, dtype=torch.float64, requires_grad=True) for s in [(4, 3), (5, 3), (5,)]]
    assert gradcheck_cli.check(broken.LinearDoubleBias, args).status is Status.FAIL


class Strict(torch.autograd.Function):
    """A kernel wrapper that refuses non-contiguous tensors in forward and in backward (right otherwise)."""

    @staticmethod
    def forward(ctx: Any, x: torch.Tensor) -> torch.Tensor:
        if not x.is_contiguous():
            raise ValueError("the kernel needs a contiguous x")
        return x * 2

    @staticmethod
    def backward(ctx: Any, g: torch.Tensor) -> torch.Tensor:
        if not g.is_contiguous():
            raise ValueError("the kernel needs a contiguous grad")
        return g * 2


def test_rows_hold_what_the_layouts_that_ran_compared():
    found = _check(layouts.RowScaleView, (3, 4), (3,))
    # the grad_outputs' layout raises; the arguments' alone do not, and compare equal
    assert found.status is Status.FAIL and [r.status for r in found.inputs] == [Status.PASS, Status.PASS]


def test_a_function_that_raises_for_every_layout_leaves_its_rows_unjudged_and_names_each_side():
    found = _check(Strict, (3, 4))
    assert found.status is Status.FAIL and [r.status for r in found.inputs] == [Status.SKIP]
    assert (
        "with non-contiguous arguments (transposed, or strided where 1-D), forward raised ValueError" in found.message
    )
    assert (
        "with non-contiguous grad_outputs (transposed, or strided where 1-D), backward raised ValueError"
        in found.message
    )


@pytest.mark.parametrize("shape", [(), (1,), (5,), (3, 4), (2, 3, 4), (3, 1), (0, 3)])
def test_relaid_keeps_the_values_and_the_gradient_and_is_non_contiguous_where_it_can_be(shape):
    x = torch.randn(shape, dtype=torch.float64, requires_grad=True)
    y = relaid(x)
    assert torch.equal(y, x) and y.shape == x.shape
    assert y.is_contiguous() is (x.numel() <= 1)
    g = torch.randn(shape, dtype=torch.float64)
    (got,) = torch.autograd.grad(y, x, g)
    assert torch.equal(got, g)


# ------------------------------------------------------------------------ `contiguous: false` on an input

SPEC = """
function: test_noncontiguous_seen:Seen
inputs: [{{name: x, shape: [3, 4]{extra}}}]
"""


@pytest.fixture
def seen_module(monkeypatch):
    import sys
    import types

    module = types.ModuleType("test_noncontiguous_seen")
    module.Seen = Seen  # type: ignore[attr-defined]
    monkeypatch.setitem(sys.modules, "test_noncontiguous_seen", module)


@pytest.mark.parametrize("extra,contiguous", [("", True), (", contiguous: true", True), (", contiguous: false", False)])
def test_an_input_marked_contiguous_false_reaches_the_target_non_contiguous_in_every_call(
    seen_module, write_spec, extra, contiguous
):
    from gradcheck_cli import spec
    from gradcheck_cli.runner import run_case

    (case,) = spec.load_file(write_spec(SPEC.format(extra=extra)))
    assert case.inputs[0].contiguous is contiguous
    Seen.inputs.clear()
    result = run_case(case, "cpu")
    assert result.status is Status.PASS, result
    assert Seen.inputs and set(Seen.inputs) == {contiguous}  # every forward, the finite differences' too


def test_a_bad_contiguous_value_is_a_spec_error_naming_the_key(write_spec):
    from gradcheck_cli import spec

    (err,) = spec.load_file(write_spec(SPEC.format(extra=", contiguous: 'no'")))
    assert isinstance(err, spec.SpecError)
    assert "inputs[0].contiguous: expected true or false (false: the tensor reaches the target non-contiguous)" in str(
        err
    )
