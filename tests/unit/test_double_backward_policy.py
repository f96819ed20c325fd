"""double_backward's verdict on a correct first-order backward that is not differentiable (issue 28):
under `checks: all` a skip with the hazard as a warning, named a fail; a differentiable backward whose
second derivative is wrong fails either way. A labelled truth set."""
from __future__ import annotations

import pytest

from gradcheck_cli import runner, spec
from gradcheck_cli.results import Status

MODULE = '''
import numpy as np
import torch

class SavedExp(torch.autograd.Function):
    """forward's output saved: autograd differentiates backward through the Function itself"""
    @staticmethod
    def forward(ctx, x):
        y = x.exp()
        ctx.save_for_backward(y)
        return y
    @staticmethod
    def backward(ctx, g):
        (y,) = ctx.saved_tensors
        return g * y

class DetachedSquare(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x):
        ctx.save_for_backward(x)
        return x * x
    @staticmethod
    def backward(ctx, g):
        (x,) = ctx.saved_tensors
        return g * 2 * x.detach()

class NumpySine(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x):
        ctx.save_for_backward(x)
        return x.sin()
    @staticmethod
    def backward(ctx, g):
        (x,) = ctx.saved_tensors
        return g * torch.from_numpy(np.cos(x.detach().numpy()))

class NoGradCube(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x):
        ctx.save_for_backward(x)
        return x ** 3
    @staticmethod
    def backward(ctx, g):
        (x,) = ctx.saved_tensors
        with torch.no_grad():
            d = 3 * x * x
        return g * d

class SavedTanh(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x):
        y = torch.tanh(x)
        ctx.save_for_backward(y)
        return y
    @staticmethod
    def backward(ctx, g):
        (y,) = ctx.saved_tensors
        return g * (1 - y * y)

class WrongSecondDerivative(torch.autograd.Function):
    """backward's value is right (2 x g) but its derivative in x has 5 g too much: differentiable, wrong"""
    @staticmethod
    def forward(ctx, x):
        ctx.save_for_backward(x)
        return x * x
    @staticmethod
    def backward(ctx, g):
        (x,) = ctx.saved_tensors
        return g * (2 * x + 5 * (x - x.detach()))

class RightSquare(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x):
        ctx.save_for_backward(x)
        return x * x
    @staticmethod
    def backward(ctx, g):
        (x,) = ctx.saved_tensors
        return g * 2 * x
'''

NOT_DIFFERENTIABLE = ["DetachedSquare", "NumpySine", "NoGradCube"]
# an output saved for backward stays in the graph (autograd differentiates through the Function again),
# so these are differentiable and right: they must pass, never be called "not differentiable"
RIGHT = ["RightSquare", "SavedExp", "SavedTanh"]


def double_backward(user_module, write_spec, function, checks):
    mod = user_module(MODULE)
    (case,) = spec.load_file(write_spec(f"""
        function: {mod}:{function}
        checks: {checks}
        inputs: [{{name: x, shape: [3, 4]}}]
    """))
    assert not isinstance(case, spec.SpecError), case
    result = runner.run_case(case, "cpu")
    assert result.error is None, result.error
    return result, next(c for c in result.checks if c.check == "double_backward")


@pytest.mark.parametrize("function", NOT_DIFFERENTIABLE)
def test_a_correct_backward_that_is_not_differentiable_is_a_warning_under_all(user_module, write_spec, function):
    result, found = double_backward(user_module, write_spec, function, "all")
    assert found.status is Status.SKIP, found.message
    assert "backward is not differentiable with respect to 'x' and not marked @once_differentiable" in found.message
    assert any("come out silently zero or partial" in w for w in found.warnings)
    assert next(c for c in result.checks if c.check == "backward").status is Status.PASS


@pytest.mark.parametrize("function", NOT_DIFFERENTIABLE)
def test_the_same_backward_fails_when_double_backward_is_named(user_module, write_spec, function):
    _, found = double_backward(user_module, write_spec, function, "[double_backward]")
    assert found.status is Status.FAIL, found.message


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
