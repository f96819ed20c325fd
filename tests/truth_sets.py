"""Every check's labelled truth set, in one importable place: right Functions (a check must pass or skip
them) and broken ones (it must fail them), each with the spec text that checks it. The relations of
tests/cli/test_selection_relations.py run them all (a check named alone, in a list, and under `all`), and
each check's own tests import the sets they judge.

A set's Functions live in a module source (``SOURCES``: written into a test's tmp_path by the ``user_module``
fixture under its key as the module name) or are importable (``tests.compile_truth``); ``LABELLED`` lists
every entry as a ``Labelled``: the source's key ('' for an import path), the function, the spec's inputs or
other keys, the check its label is about, and the label.

For the next contributor: a new check's truth set goes here (its source and its ``Labelled`` entries), so
that the relations run over it without another line; a label must agree with torch's own checker where
torch can judge (each set's tests say so).
"""

from __future__ import annotations

from dataclasses import dataclass

from tests import compile_truth

# ------------------------------------------------ double_backward: correct first-order backwards that are not
# differentiable (issue 28; since issue 44 a fail named or under `all`), and right differentiable ones

NOT_DIFFERENTIABLE_MODULE = '''
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


# ------------------------------------------------ how a check is selected (issue 44, item 7)

SELECTION = """
import torch
from torch.autograd.function import once_differentiable

class QuantiserSTE(torch.autograd.Function):
    \"\"\"a quantiser to steps of 1/256 with a straight-through backward: forward is a step function, whose
    derivative is zero between its steps, so the identity is not its derivative\"\"\"
    @staticmethod
    def forward(ctx, x):
        return torch.round(x * 256) / 256
    @staticmethod
    def backward(ctx, g):
        return g

class SharedScaleThird(torch.autograd.Function):
    \"\"\"y = x * w, w shared over the batch of 3 (a QP layer's batch-shared parameter): backward gives w 1/3 of
    its gradient, and overwrites in place a tensor its own graph saved (tanh's output), so double backward
    raises\"\"\"
    @staticmethod
    def forward(ctx, x, w):
        ctx.save_for_backward(x, w)
        return x * w
    @staticmethod
    def backward(ctx, g):
        x, w = ctx.saved_tensors
        gw = torch.tanh(g * x)
        gw.copy_(g * x / x.shape[0])
        return g * w, gw.sum(0)

class RaisesOnPositive(torch.autograd.Function):
    \"\"\"forward accepts every x; backward raises where an x is positive\"\"\"
    @staticmethod
    def forward(ctx, x):
        ctx.save_for_backward(x)
        return x * x
    @staticmethod
    def backward(ctx, g):
        (x,) = ctx.saved_tensors
        if bool((x > 0).any()):
            raise ValueError("backward cannot handle a positive x")
        return g * 2 * x

class ForwardRaises(torch.autograd.Function):
    \"\"\"forward raises: nothing can be checked (an error of the case, under every check)\"\"\"
    @staticmethod
    def forward(ctx, x):
        raise ValueError("forward cannot handle any x")
    @staticmethod
    def backward(ctx, g):
        return g

class ViewsGrad(torch.autograd.Function):
    \"\"\"backward views grad_output as if contiguous: it raises for a non-contiguous one\"\"\"
    @staticmethod
    def forward(ctx, x):
        ctx.save_for_backward(x)
        return x * x
    @staticmethod
    def backward(ctx, g):
        (x,) = ctx.saved_tensors
        return (g.view(-1) * 2 * x.reshape(-1)).view(x.shape)

class OnceSquare(torch.autograd.Function):
    \"\"\"DetachedSquare (NOT_DIFFERENTIABLE_MODULE) declared @once_differentiable: double backward raises in
    use, as it should\"\"\"
    @staticmethod
    def forward(ctx, x):
        ctx.save_for_backward(x)
        return x * x
    @staticmethod
    @once_differentiable
    def backward(ctx, g):
        (x,) = ctx.saved_tensors
        return g * 2 * x.detach()
"""

X44 = "inputs: [{name: x, shape: [3, 4]}]"
STE_INPUTS = "inputs: [{name: x, shape: [8, 8], std: 0.5}]"
SHARED_INPUTS = "inputs: [{name: x, shape: [3, 4]}, {name: w, shape: [4]}]"
NEGATIVE_AND_POSITIVE = "inputs: [{name: x, data: [[-1.5, 0.5], [2.0, -0.25]]}]"

SOURCES = {"dbmod": NOT_DIFFERENTIABLE_MODULE, "truthmod": TRUTH, "selmod": SELECTION}


@dataclass(frozen=True)
class Labelled:
    """One labelled Function of a check's truth set."""

    module: str  # the key of its source in SOURCES, or '' where ``function`` is an import path
    function: str  # the class name in that source, or an import path
    body: str  # the spec's text besides `function:` and `checks:` (its inputs, `init:`)
    check: str  # the check the label is about
    right: bool  # True: the check must pass or skip it (under `all`); False: it must fail it everywhere

    @property
    def path(self) -> str:
        """The spec's `function:`."""
        return f"{self.module}:{self.function}" if self.module else self.function

    @property
    def id(self) -> str:
        """A test id: the check, the function (with its source's key), and the label."""
        where = f"{self.module}." if self.module else ""
        return f"{self.check}-{where}{self.function.rpartition(':')[2]}-{'right' if self.right else 'broken'}"


def _inputs(flow: str) -> str:
    return f"inputs: {flow}"


LABELLED: list[Labelled] = [
    Labelled("truthmod", "Square", X44, "backward", True),
    Labelled("selmod", "QuantiserSTE", STE_INPUTS, "backward", False),
    Labelled("selmod", "SharedScaleThird", SHARED_INPUTS, "backward", False),
    Labelled("selmod", "RaisesOnPositive", NEGATIVE_AND_POSITIVE, "backward", False),
    Labelled("truthmod", "Square", X44, "noncontiguous", True),
    Labelled("selmod", "ViewsGrad", X44, "noncontiguous", False),
    Labelled("selmod", "OnceSquare", X44, "double_backward", True),
    # silently not differentiable: a fail everywhere; OutMulSquare's double backward raises in use (`out=`), as a
    # backward marked @once_differentiable does: a skip under `all` (a fail when named)
    *[Labelled("dbmod", f, _inputs(X), "double_backward", f == "OutMulSquare") for f in NOT_DIFFERENTIABLE],
    *[Labelled("dbmod", f, _inputs(X), "double_backward", True) for f in RIGHT],
    Labelled("dbmod", "WrongSecondDerivative", _inputs(X), "double_backward", False),
    *[
        Labelled("truthmod", f, _inputs(i), c, True)
        for f, i in FLOAT32 + DOMAIN_EDGE
        for c in ("double_backward", "forward_ad")
    ],
    *[Labelled("truthmod", f, _inputs(i), "double_backward", False) for f, i in WRONG_SECOND],
    *[Labelled("truthmod", f, _inputs(i), "forward_ad", False) for f, i in WRONG_JVP],
    Labelled("truthmod", "Square", _inputs(X), "undefined_grad", True),
    Labelled("truthmod", "TwoOutputsCrashOnNone", _inputs(X), "undefined_grad", False),
    *[
        Labelled("", f, b, "compile", True)
        for f, b in compile_truth.RIGHT_IN_PLACE + compile_truth.RIGHT_PLAIN + compile_truth.RIGHT_STATEFUL
    ],
    *[Labelled("", f, b, "compile", False) for f, b, *_ in compile_truth.BROKEN],
]
