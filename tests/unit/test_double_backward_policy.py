"""double_backward's verdict on a correct first-order backward that is not differentiable (issue 28):
under `checks: all` a skip with the hazard as a warning, named a fail; a differentiable backward whose
second derivative is wrong fails either way. A labelled truth set."""

from __future__ import annotations

import importlib
from typing import Any, Callable

import pytest
import torch

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

# ------------------------------------------------ more correct first-order backwards that are not differentiable

class SavedCos(torch.autograd.Function):
    """sin, with cos computed in forward (no graph there) and saved"""
    @staticmethod
    def forward(ctx, x):
        ctx.save_for_backward(x.cos())
        return x.sin()
    @staticmethod
    def backward(ctx, g):
        (c,) = ctx.saved_tensors
        return g * c

class DataSquare(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x):
        ctx.save_for_backward(x)
        return x * x
    @staticmethod
    def backward(ctx, g):
        (x,) = ctx.saved_tensors
        return g * 2 * x.data

class SavedSigmoidSlope(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x):
        s = torch.sigmoid(x)
        ctx.save_for_backward(s * (1 - s))
        return s
    @staticmethod
    def backward(ctx, g):
        (slope,) = ctx.saved_tensors
        return g * slope

class NumpyTanh(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x):
        ctx.save_for_backward(x)
        return torch.tanh(x)
    @staticmethod
    def backward(ctx, g):
        (x,) = ctx.saved_tensors
        t = torch.from_numpy(np.tanh(x.detach().cpu().numpy())).to(x)
        return g * (1 - t * t)

class TolistCube(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x):
        ctx.save_for_backward(x)
        return x ** 3
    @staticmethod
    def backward(ctx, g):
        (x,) = ctx.saved_tensors
        return g * 3 * torch.tensor(x.tolist(), dtype=x.dtype) ** 2

class MaskedReluSquare(torch.autograd.Function):
    """relu(x)^2, with the mask and the slope 2 relu(x) made in forward"""
    @staticmethod
    def forward(ctx, x):
        mask = x > 0
        ctx.save_for_backward(mask, 2 * x * mask)
        return (x * mask) ** 2
    @staticmethod
    def backward(ctx, g):
        mask, slope = ctx.saved_tensors
        return g * slope * mask

class ArgmaxSquare(torch.autograd.Function):
    """(max over the last dim)^2, its argmax index and the max saved from forward"""
    @staticmethod
    def forward(ctx, x):
        m, idx = x.max(-1, keepdim=True)
        ctx.save_for_backward(idx, m)
        ctx.shape = x.shape
        return (m * m).squeeze(-1)
    @staticmethod
    def backward(ctx, g):
        idx, m = ctx.saved_tensors
        out = torch.zeros(ctx.shape, dtype=g.dtype)
        return out.scatter(-1, idx, 2 * m * g.unsqueeze(-1))

class OutMulSquare(torch.autograd.Function):
    """backward writes with out=, which autograd cannot record"""
    @staticmethod
    def forward(ctx, x):
        ctx.save_for_backward(x)
        return x * x
    @staticmethod
    def backward(ctx, g):
        (x,) = ctx.saved_tensors
        buf = torch.empty_like(x)
        torch.mul(x, 2, out=buf)
        return g * buf
'''

NOT_DIFFERENTIABLE = [
    "DetachedSquare",
    "NumpySine",
    "NoGradCube",
    "SavedCos",
    "DataSquare",
    "SavedSigmoidSlope",
    "NumpyTanh",
    "TolistCube",
    "MaskedReluSquare",
    "ArgmaxSquare",
    "OutMulSquare",
]
# an output saved for backward stays in the graph (autograd differentiates through the Function again),
# so these are differentiable and right: they must pass, never be called "not differentiable"
RIGHT = ["RightSquare", "SavedExp", "SavedTanh"]


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


@pytest.mark.parametrize("function", NOT_DIFFERENTIABLE)
def test_a_correct_backward_that_is_not_differentiable_is_a_warning_under_all(user_module, write_spec, function):
    result, found = double_backward(user_module, write_spec, function, "all")
    assert found.status is Status.SKIP, found.message
    if function == "OutMulSquare":  # autograd cannot even record backward's graph: the hazard is that it raises
        assert found.message.startswith("backward cannot be differentiated") and "out=" in found.message
        assert any("@once_differentiable" in w for w in found.warnings)
    else:
        assert "backward is not differentiable with respect to 'x' and not marked @once_differentiable" in found.message
        assert any("come out silently zero or partial" in w for w in found.warnings)
    assert "wrong" not in found.message
    assert next(c for c in result.checks if c.check == "backward").status is Status.PASS


@pytest.mark.parametrize("function", NOT_DIFFERENTIABLE + RIGHT + ["WrongSecondDerivative"])
def test_the_labels_agree_with_torch(user_module, function):
    """each label as torch.autograd.gradcheck / gradgradcheck say in float64: first order right, second
    order wrong (not differentiable, or wrong) or right"""
    fn = getattr(importlib.import_module(user_module(MODULE)), function)
    x = torch.randn(3, 4, dtype=torch.float64, generator=torch.Generator().manual_seed(0), requires_grad=True)
    assert torch.autograd.gradcheck(fn.apply, (x,))
    assert _gradgradcheck(fn.apply, (x,)) is (function in RIGHT)


@pytest.mark.parametrize("function", NOT_DIFFERENTIABLE)
def test_the_same_backward_fails_when_double_backward_is_named(user_module, write_spec, function):
    """with the words `checks: all` warns with (it said "the derivative of backward ... is wrong")"""
    _, found = double_backward(user_module, write_spec, function, "[double_backward]")
    assert found.status is Status.FAIL, found.message
    if function != "OutMulSquare":
        assert found.message.startswith("backward is not differentiable with respect to 'x"), found.message
        assert "come out silently zero or partial" in found.message
        assert "this check was named explicitly, so that fails (`checks: all` makes it a warning)" in found.message
        assert "is wrong" not in found.message


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

TRUTH = '''
import torch

def _save(ctx, *tensors):
    ctx.save_for_backward(*tensors)
    ctx.save_for_forward(*tensors)

class Square(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x):
        _save(ctx, x)
        return x * x
    @staticmethod
    def backward(ctx, g):
        (x,) = ctx.saved_tensors
        return g * 2 * x
    @staticmethod
    def jvp(ctx, t):
        (x,) = ctx.saved_tensors
        return t * 2 * x

class Sin(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x):
        _save(ctx, x)
        return x.sin()
    @staticmethod
    def backward(ctx, g):
        (x,) = ctx.saved_tensors
        return g * x.cos()
    @staticmethod
    def jvp(ctx, t):
        (x,) = ctx.saved_tensors
        return t * x.cos()

class Softplus(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x):
        _save(ctx, x)
        return torch.nn.functional.softplus(x)
    @staticmethod
    def backward(ctx, g):
        (x,) = ctx.saved_tensors
        return g * torch.sigmoid(x)
    @staticmethod
    def jvp(ctx, t):
        (x,) = ctx.saved_tensors
        return t * torch.sigmoid(x)

class Linear(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x, w):
        _save(ctx, x, w)
        return x @ w.t()
    @staticmethod
    def backward(ctx, g):
        x, w = ctx.saved_tensors
        return g @ w, g.t() @ x
    @staticmethod
    def jvp(ctx, tx, tw):
        x, w = ctx.saved_tensors
        return tx @ w.t() + x @ tw.t()

class CastExp(torch.autograd.Function):
    """computes in float32 inside, whatever the input's dtype"""
    @staticmethod
    def forward(ctx, x):
        _save(ctx, x)
        return x.float().exp().to(x.dtype)
    @staticmethod
    def backward(ctx, g):
        (x,) = ctx.saved_tensors
        return g * x.float().exp().to(x.dtype)
    @staticmethod
    def jvp(ctx, t):
        (x,) = ctx.saved_tensors
        return t * x.float().exp().to(x.dtype)

class CastTanh(torch.autograd.Function):
    """computes in float32 inside"""
    @staticmethod
    def forward(ctx, x):
        _save(ctx, x)
        return x.float().tanh().to(x.dtype)
    @staticmethod
    def backward(ctx, g):
        (x,) = ctx.saved_tensors
        t = x.float().tanh().to(x.dtype)
        return g * (1 - t * t)
    @staticmethod
    def jvp(ctx, tangent):
        (x,) = ctx.saved_tensors
        t = x.float().tanh().to(x.dtype)
        return tangent * (1 - t * t)

class Sqrt(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x):
        _save(ctx, x)
        return x.sqrt()
    @staticmethod
    def backward(ctx, g):
        (x,) = ctx.saved_tensors
        return g / (2 * x.sqrt())
    @staticmethod
    def jvp(ctx, t):
        (x,) = ctx.saved_tensors
        return t / (2 * x.sqrt())

class Log(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x):
        _save(ctx, x)
        return x.log()
    @staticmethod
    def backward(ctx, g):
        (x,) = ctx.saved_tensors
        return g / x
    @staticmethod
    def jvp(ctx, t):
        (x,) = ctx.saved_tensors
        return t / x

class Acos(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x):
        _save(ctx, x)
        return x.acos()
    @staticmethod
    def backward(ctx, g):
        (x,) = ctx.saved_tensors
        return -g / (1 - x * x).sqrt()
    @staticmethod
    def jvp(ctx, t):
        (x,) = ctx.saved_tensors
        return -t / (1 - x * x).sqrt()

class Relu(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x):
        _save(ctx, x)
        return x.clamp(min=0)
    @staticmethod
    def backward(ctx, g):
        (x,) = ctx.saved_tensors
        return g * (x > 0).to(g.dtype)
    @staticmethod
    def jvp(ctx, t):
        (x,) = ctx.saved_tensors
        return t * (x > 0).to(t.dtype)

class Abs(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x):
        _save(ctx, x)
        return x.abs()
    @staticmethod
    def backward(ctx, g):
        (x,) = ctx.saved_tensors
        return g * x.sign()
    @staticmethod
    def jvp(ctx, t):
        (x,) = ctx.saved_tensors
        return t * x.sign()

class Entmax15(torch.autograd.Function):
    """1.5-entmax over the last dim (sparse support); backward uses sqrt(y), at 0 off the support"""
    @staticmethod
    def forward(ctx, x):
        x = x / 2
        x = x - x.max(-1, keepdim=True).values
        xs, _ = torch.sort(x, dim=-1, descending=True)
        rho = torch.arange(1, x.shape[-1] + 1, dtype=x.dtype)
        mean = xs.cumsum(-1) / rho
        mean_sq = (xs ** 2).cumsum(-1) / rho
        delta = (1 - rho * (mean_sq - mean ** 2)) / rho
        tau = mean - delta.clamp(min=0).sqrt()
        support = (tau <= xs).sum(-1, keepdim=True)
        y = (x - tau.gather(-1, support - 1)).clamp(min=0) ** 2
        ctx.save_for_backward(y)
        return y
    @staticmethod
    def backward(ctx, g):
        (y,) = ctx.saved_tensors
        gppr = y.sqrt()
        dx = g * gppr
        q = dx.sum(-1, keepdim=True) / gppr.sum(-1, keepdim=True)
        return dx - q * gppr

# ------------------------------------------------ broken

class SinWrongSecond(torch.autograd.Function):
    """backward's value is right, its derivative in x has 0.3 g cos x too much"""
    @staticmethod
    def forward(ctx, x):
        ctx.save_for_backward(x)
        return x.sin()
    @staticmethod
    def backward(ctx, g):
        (x,) = ctx.saved_tensors
        return g * (x.cos() + 0.3 * (x.sin() - x.sin().detach()))

class LinearWrongSecond(torch.autograd.Function):
    """the gradient of w is right in value, but its derivative in grad_output is doubled"""
    @staticmethod
    def forward(ctx, x, w):
        ctx.save_for_backward(x, w)
        return x @ w.t()
    @staticmethod
    def backward(ctx, g):
        x, w = ctx.saved_tensors
        return g @ w, (2 * g - g.detach()).t() @ x

class SqrtWrongSecond(torch.autograd.Function):
    """near sqrt's domain edge, and wrong there too"""
    @staticmethod
    def forward(ctx, x):
        ctx.save_for_backward(x)
        return x.sqrt()
    @staticmethod
    def backward(ctx, g):
        (x,) = ctx.saved_tensors
        return g / (2 * x.sqrt()) * (1 + 2 * (x - x.detach()) / x.detach())

class CastExpWrongSecond(torch.autograd.Function):
    """computes in float32 inside; backward's derivative is 1.1x"""
    @staticmethod
    def forward(ctx, x):
        ctx.save_for_backward(x)
        return x.float().exp().to(x.dtype)
    @staticmethod
    def backward(ctx, g):
        (x,) = ctx.saved_tensors
        e = x.float().exp().to(x.dtype)
        return g * (e + 0.1 * (e - e.detach()))

class SquareJvpTwice(Square):
    @staticmethod
    def jvp(ctx, t):
        (x,) = ctx.saved_tensors
        return t * 4 * x

class LinearJvpDropsW(Linear):
    @staticmethod
    def jvp(ctx, tx, tw):
        x, w = ctx.saved_tensors
        return tx @ w.t()

class SinJvpSign(Sin):
    @staticmethod
    def jvp(ctx, t):
        (x,) = ctx.saved_tensors
        return -t * x.cos()

class CastExpJvpOff(CastExp):
    @staticmethod
    def jvp(ctx, t):
        (x,) = ctx.saved_tensors
        return 1.1 * t * x.float().exp().to(x.dtype)

class TwoOutputsCrashOnNone(torch.autograd.Function):
    """two outputs; backward multiplies each grad_output, which is None when the loss does not use its output"""
    @staticmethod
    def forward(ctx, x):
        ctx.set_materialize_grads(False)
        ctx.save_for_backward(x)
        return x * 2, x * x
    @staticmethod
    def backward(ctx, ga, gb):
        (x,) = ctx.saved_tensors
        return ga.mul(2) + gb.mul(2 * x)
'''

X = "[{name: x, shape: [3, 4]}]"
X32 = "[{name: x, shape: [3, 4], dtype: float32}]"
LINEAR32 = "[{name: x, shape: [3, 4], dtype: float32}, {name: w, shape: [5, 4], dtype: float32}]"
LINEAR = "[{name: x, shape: [3, 4]}, {name: w, shape: [5, 4]}]"
# correct Functions that run in float32, or compute in float32 inside
FLOAT32 = [("Square", X32), ("Sin", X32), ("Softplus", X32), ("Linear", LINEAR32), ("CastExp", X), ("CastTanh", X)]
# correct Functions at or within eps of a kink or domain edge of backward (or of an operation inside it)
DOMAIN_EDGE = [
    ("Sqrt", "[{name: x, shape: [6], dist: uniform, low: 0.0, high: 1.0e-5}]"),
    ("Log", "[{name: x, data: [1.0e-7, 1.0, 4.0, 5.0e-7]}]"),
    ("Acos", "[{name: x, data: [0.9999999, 0.5, -0.9999995]}]"),
    ("Relu", "[{name: x, data: [0.0, 1.0, -2.0, 1.0e-7]}]"),
    ("Abs", "[{name: x, data: [4.0e-7, 1.5, -2.0, -3.0e-7]}]"),
    ("Entmax15", "[{name: x, shape: [3, 5]}]"),
]
WRONG_SECOND = [
    ("SinWrongSecond", X),
    ("SinWrongSecond", X32),
    ("LinearWrongSecond", LINEAR),
    ("SqrtWrongSecond", "[{name: x, shape: [6], dist: uniform, low: 0.0, high: 1.0e-5}]"),
    ("CastExpWrongSecond", X),
]
WRONG_JVP = [
    ("SquareJvpTwice", X),
    ("SquareJvpTwice", X32),
    ("LinearJvpDropsW", LINEAR),
    ("SinJvpSign", X32),
    ("CastExpJvpOff", X),
]


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
