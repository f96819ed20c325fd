"""A corpus of custom ``torch.autograd.Function`` classes with known verdicts.

Every entry of :data:`CORPUS` is a :class:`Case`: a Function class, a builder for
its positional arguments (reproducible from a ``torch.Generator``), keyword
arguments for ``forward`` and the label ``correct`` (is the hand-written
``backward`` right?).

The wrong ones are realistic mistakes (a flipped sign, a forgotten transpose or
factor, a missing chain-rule term, a mask that is too wide, ...), each one large
enough to be far outside gradcheck's default tolerances (eps=1e-6, atol=1e-5,
rtol=1e-3) for any seed.  Every tensor is float64 and has at most 64 elements;
inputs are drawn from the generator only and are kept away from kinks.

``torch_can_judge`` is False where ``torch.autograd.gradcheck`` itself crashes on
the case (it is still a valid case for gradcheck-cli).  ``wrong_args`` names the
``forward`` parameters whose gradient is wrong (empty for correct cases).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Callable

import torch
from torch.autograd import Function

DT = torch.float64


NOISE = ("max_abs_err", "max_rel_err", "worst_index", "worst_output", "analytical", "numerical")


def report_rows(result: Any, noise: bool = True) -> Any:
    """A result (or JSON: a report, a list of results) as JSON, without its times and its shrunk case: what two
    checks of the same case must share (a shrunk case is searched for within a wall-clock budget, so two runs
    find the same one only when neither runs out of time: tests/unit/test_shrink.py holds it to that).
    ``noise=False``: without a passing row's rounding noise too (its largest errors, where the largest is and
    the values there), for two computations whose summation orders differ (other chunk widths, other kernels)."""
    from gradcheck_cli.results import to_dict

    out = result if isinstance(result, (dict, list)) else to_dict(result)

    def strip(d: Any) -> Any:
        if isinstance(d, dict):
            quiet = not noise and d.get("status") == "pass" and "numel" in d
            return {
                k: None if quiet and k in NOISE else strip(v) for k, v in d.items() if k not in ("duration_s", "shrunk")
            }
        if isinstance(d, list):
            return [strip(v) for v in d]
        return d

    return strip(out)


def determined(row: Any) -> tuple[Any, ...]:
    """What the maths determines of a row (an ``InputReport``), for comparing two ways of checking the same case:
    its name, status and counts, and its worst place only where it fails. A passing row's worst entry is the
    argmax of rounding noise, which moves with the summation order and the CPU's vector instructions."""
    place = (row.worst_index, row.worst_output) if row.status.value == "fail" else None
    return (row.name, row.status, row.mismatched, row.numel, place)


def corpus_spec(case: Any, checks: tuple[str, ...] = ("backward",), entry: Any = None, **keys: Any) -> str:
    """The YAML spec of a corpus case (its Function as ``corpus:NAME``, its arguments as literal data drawn from
    seed 0), with ``checks`` and any other top-level ``keys`` (``distributed``, ...); ``entry`` maps each tensor
    argument's entry to the one written (``contiguous: false``, a placement)."""
    import yaml

    entries: list[dict[str, Any]] = []
    for a in case.make_args(torch.Generator().manual_seed(0)):
        if isinstance(a, torch.Tensor):
            tensor = {"data": a.tolist(), "dtype": str(a.dtype)[6:], "requires_grad": a.requires_grad}
            entries.append(entry(tensor) if entry else tensor)
        else:
            entries.append({"value": list(a) if isinstance(a, tuple) else a})
    spec = {
        "function": f"corpus:{case.fn.__name__}",
        "checks": list(checks),
        "inputs": entries,
        "kwargs": {k: {"value": v} for k, v in case.kwargs.items()},
        **keys,
    }
    return yaml.safe_dump(spec)


def verdict_of(result: Any) -> list[Any]:
    """What the maths determines of a case's result (a ``CaseResult``, or its JSON): its status, each check's
    status, and each row's status and mismatch count (not the errors' last bits)."""
    from gradcheck_cli.results import to_dict

    out = result if isinstance(result, dict) else to_dict(result)
    return [out["status"]] + [
        (c["check"], c["status"], [(r["name"], r.get("role"), r["status"], r["mismatched"]) for r in c["inputs"]])
        for c in out["checks"]
    ]


def one_input_function(forward: Callable, backward: Callable, name: str = "F") -> type:
    """A one-input autograd.Function from two plain functions: forward(x), backward(x, *grads)."""

    class F(Function):
        @staticmethod
        def forward(ctx, x):
            ctx.save_for_backward(x)
            return forward(x)

        @staticmethod
        def backward(ctx, *grads):
            (x,) = ctx.saved_tensors
            return backward(x, *grads)

    F.__name__ = name
    return F


@dataclass(frozen=True)
class Case:
    name: str
    fn: type  # the Function class (call as fn.apply)
    make_args: Callable[[torch.Generator], tuple]
    correct: bool
    kwargs: dict = field(default_factory=dict)
    # False where torch.autograd.gradcheck itself raises on this case.
    torch_can_judge: bool = True
    # forward()'s parameter names whose hand-written gradient is wrong.
    wrong_args: tuple = ()
    # Why torch.autograd.gradcheck cannot judge it (when torch_can_judge is False).
    torch_note: str = ""


# --------------------------------------------------------------------------- inputs


def _randn(g: torch.Generator, *shape: int, scale: float = 1.0, grad: bool = True) -> torch.Tensor:
    return (torch.randn(shape, generator=g, dtype=DT) * scale).requires_grad_(grad)


def _uniform(g: torch.Generator, *shape: int, lo: float, hi: float, grad: bool = True) -> torch.Tensor:
    t = lo + (hi - lo) * torch.rand(shape, generator=g, dtype=DT)
    return t.requires_grad_(grad)


def _away(
    g: torch.Generator, *shape: int, kinks: tuple = (0.0,), margin: float = 0.1, lo: float = -2.0, hi: float = 2.0
) -> torch.Tensor:
    """Uniform values in [lo, hi] pushed at least ``margin`` away from every kink."""
    t = lo + (hi - lo) * torch.rand(shape, generator=g, dtype=DT)
    for k in kinks:
        d = t - k
        t = torch.where(d.abs() < margin, torch.where(d >= 0, k + margin, k - margin), t)
    return t.requires_grad_(True)


def _mixed_signs(g: torch.Generator, *shape: int, lo: float = 0.2, hi: float = 2.0) -> torch.Tensor:
    """Magnitudes in [lo, hi] with alternating signs: always both signs, never near 0."""
    mag = lo + (hi - lo) * torch.rand(shape, generator=g, dtype=DT)
    n = mag.numel()
    sign = torch.tensor([1.0 if i % 2 == 0 else -1.0 for i in range(n)], dtype=DT).reshape(shape)
    return (mag * sign).requires_grad_(True)


# ------------------------------------------------------------------ elementwise, 1 input


class Exp(Function):
    @staticmethod
    def forward(ctx, x):
        y = x.exp()
        ctx.save_for_backward(y)
        return y

    @staticmethod
    def backward(ctx, g):
        (y,) = ctx.saved_tensors
        return g * y


class ExpAllZeroGrad(Exp):
    @staticmethod
    def backward(ctx, g):
        (y,) = ctx.saved_tensors
        return torch.zeros_like(y)


class Sin(Function):
    @staticmethod
    def forward(ctx, x):
        ctx.save_for_backward(x)
        return x.sin()

    @staticmethod
    def backward(ctx, g):
        (x,) = ctx.saved_tensors
        return g * x.cos()


class SinSignError(Sin):
    @staticmethod
    def backward(ctx, g):
        (x,) = ctx.saved_tensors
        return -g * x.cos()  # d/dx sin = cos, not -cos


class Tanh(Function):
    @staticmethod
    def forward(ctx, x):
        t = x.tanh()
        ctx.save_for_backward(t)
        return t

    @staticmethod
    def backward(ctx, g):
        (t,) = ctx.saved_tensors
        return g * (1 - t * t)


class TanhOnePercentOff(Tanh):
    @staticmethod
    def backward(ctx, g):
        (t,) = ctx.saved_tensors
        return g * (1 - t * t) * 1.01  # tiny, but 10x above rtol=1e-3


class Sigmoid(Function):
    @staticmethod
    def forward(ctx, x):
        s = torch.sigmoid(x)
        ctx.save_for_backward(x, s)
        return s

    @staticmethod
    def backward(ctx, g):
        x, s = ctx.saved_tensors
        return g * s * (1 - s)


class SigmoidUsesInput(Sigmoid):
    @staticmethod
    def backward(ctx, g):
        x, s = ctx.saved_tensors
        return g * x * (1 - x)  # used the input instead of the saved output


class Square(Function):
    @staticmethod
    def forward(ctx, x):
        ctx.save_for_backward(x)
        return x * x

    @staticmethod
    def backward(ctx, g):
        (x,) = ctx.saved_tensors
        return 2 * g * x


class SquareForgotTwo(Square):
    @staticmethod
    def backward(ctx, g):
        (x,) = ctx.saved_tensors
        return g * x  # forgot the factor 2


class Sqrt(Function):
    @staticmethod
    def forward(ctx, x):
        r = x.sqrt()
        ctx.save_for_backward(r)
        return r

    @staticmethod
    def backward(ctx, g):
        (r,) = ctx.saved_tensors
        return 0.5 * g / r


class SqrtForgotHalf(Sqrt):
    @staticmethod
    def backward(ctx, g):
        (r,) = ctx.saved_tensors
        return g / r  # forgot the 0.5


class SinOfSquare(Function):
    @staticmethod
    def forward(ctx, x):
        ctx.save_for_backward(x)
        return (x * x).sin()

    @staticmethod
    def backward(ctx, g):
        (x,) = ctx.saved_tensors
        return g * (x * x).cos() * 2 * x


class SinOfSquareMissingChain(SinOfSquare):
    @staticmethod
    def backward(ctx, g):
        (x,) = ctx.saved_tensors
        return g * (x * x).cos()  # missing the inner derivative 2x


class LeakyRelu(Function):
    @staticmethod
    def forward(ctx, x, slope=0.1):
        ctx.save_for_backward(x)
        ctx.slope = slope
        return torch.where(x > 0, x, slope * x)

    @staticmethod
    def backward(ctx, g):
        (x,) = ctx.saved_tensors
        return torch.where(x > 0, g, ctx.slope * g), None


class LeakyReluWrongNegativeSlope(LeakyRelu):
    @staticmethod
    def backward(ctx, g):
        (x,) = ctx.saved_tensors
        return torch.where(x > 0, g, torch.zeros_like(g)), None  # ReLU's backward: wrong where x < 0


class Clamp(Function):
    @staticmethod
    def forward(ctx, x, lo, hi):
        ctx.save_for_backward(x)
        ctx.lo, ctx.hi = lo, hi
        return x.clamp(lo, hi)

    @staticmethod
    def backward(ctx, g):
        (x,) = ctx.saved_tensors
        inside = (x > ctx.lo) & (x < ctx.hi)
        return g * inside.to(g.dtype), None, None


class ClampMaskMissingUpper(Clamp):
    @staticmethod
    def backward(ctx, g):
        (x,) = ctx.saved_tensors
        inside = x > ctx.lo  # forgot the upper bound: wrong only where x > hi
        return g * inside.to(g.dtype), None, None


# ------------------------------------------------------------------------ multi-input


class Mul(Function):
    @staticmethod
    def forward(ctx, x, y):
        ctx.save_for_backward(x, y)
        return x * y

    @staticmethod
    def backward(ctx, g):
        x, y = ctx.saved_tensors
        return g * y, g * x


class MulOneWrongElement(Mul):
    @staticmethod
    def backward(ctx, g):
        x, y = ctx.saved_tensors
        gx = g * y
        gx[0, 1] += 0.5  # a single wrong entry
        return gx, g * x


class Linear(Function):
    @staticmethod
    def forward(ctx, x, weight, bias):
        ctx.save_for_backward(x, weight)
        return x @ weight.T + bias

    @staticmethod
    def backward(ctx, g):
        x, weight = ctx.saved_tensors
        return g @ weight, g.T @ x, g.sum(0)


class LinearWrongWeightOnly(Linear):
    @staticmethod
    def backward(ctx, g):
        x, weight = ctx.saved_tensors
        # divided the weight gradient by the batch size, as if the loss were a mean
        return g @ weight, (g.T @ x) / x.shape[0], g.sum(0)


class Broadcast(Function):
    """x * y + z with x: (3, 4), y: (4,), z: (3, 1)."""

    @staticmethod
    def forward(ctx, x, y, z):
        ctx.save_for_backward(x, y)
        return x * y + z

    @staticmethod
    def backward(ctx, g):
        x, y = ctx.saved_tensors
        return g * y, (g * x).sum(0), g.sum(1, keepdim=True)


class BroadcastMeanInsteadOfSum(Broadcast):
    @staticmethod
    def backward(ctx, g):
        x, y = ctx.saved_tensors
        return g * y, (g * x).mean(0), g.sum(1, keepdim=True)  # mean, not sum, over the broadcast dim


class Affine(Function):
    """x * w + b, where w is a constant (requires_grad=False) in the corpus."""

    @staticmethod
    def forward(ctx, x, w, b):
        ctx.save_for_backward(x, w)
        return x * w + b

    @staticmethod
    def backward(ctx, g):
        x, w = ctx.saved_tensors
        gx = g * w if ctx.needs_input_grad[0] else None
        gw = g * x if ctx.needs_input_grad[1] else None
        gb = g if ctx.needs_input_grad[2] else None
        return gx, gw, gb


class AffineForgotW(Affine):
    @staticmethod
    def backward(ctx, g):
        x, w = ctx.saved_tensors
        return g, None, g  # forgot to multiply the x gradient by w


class IgnoresSecondInput(Function):
    """Output depends on x only; y is accepted but unused."""

    @staticmethod
    def forward(ctx, x, y):
        e = x.exp()
        ctx.save_for_backward(e)
        return e

    @staticmethod
    def backward(ctx, g):
        (e,) = ctx.saved_tensors
        return g * e, None


class IgnoresSecondInputZeros(IgnoresSecondInput):
    @staticmethod
    def backward(ctx, g):
        (e,) = ctx.saved_tensors
        return g * e, torch.zeros_like(e)


class IgnoresSecondInputButGradsIt(IgnoresSecondInput):
    @staticmethod
    def backward(ctx, g):
        (e,) = ctx.saved_tensors
        return g * e, g  # copy-paste: y gets a gradient though the output ignores it


class Scalars(Function):
    """0-d inputs: a * b + sin(a)."""

    @staticmethod
    def forward(ctx, a, b):
        ctx.save_for_backward(a, b)
        return a * b + a.sin()

    @staticmethod
    def backward(ctx, g):
        a, b = ctx.saved_tensors
        return g * (b + a.cos()), g * a


class ScalarsSwapped(Scalars):
    @staticmethod
    def backward(ctx, g):
        a, b = ctx.saved_tensors
        return g * (a + a.cos()), g * a  # used a where b belongs in a's gradient


# -------------------------------------------------------------- matmul, bmm, outer


class MatMul(Function):
    @staticmethod
    def forward(ctx, a, b):
        ctx.save_for_backward(a, b)
        return a @ b

    @staticmethod
    def backward(ctx, g):
        a, b = ctx.saved_tensors
        return g @ b.T, a.T @ g


class MatMulMissingTranspose(MatMul):
    """Used with a square (3, 3) and b (3, 4), so the wrong shape still matches."""

    @staticmethod
    def backward(ctx, g):
        a, b = ctx.saved_tensors
        return g @ b.T, a @ g  # forgot a's transpose


class Bmm(Function):
    @staticmethod
    def forward(ctx, a, b):
        ctx.save_for_backward(a, b)
        return torch.bmm(a, b)

    @staticmethod
    def backward(ctx, g):
        a, b = ctx.saved_tensors
        return torch.bmm(g, b.mT), torch.bmm(a.mT, g)


class BmmSwappedOperands(Bmm):
    """Used with square per-batch matrices, so the swapped product has the right shape."""

    @staticmethod
    def backward(ctx, g):
        a, b = ctx.saved_tensors
        return torch.bmm(b.mT, g), torch.bmm(a.mT, g)  # operands of a's gradient swapped


class Outer(Function):
    @staticmethod
    def forward(ctx, u, v):
        ctx.save_for_backward(u, v)
        return torch.outer(u, v)

    @staticmethod
    def backward(ctx, g):
        u, v = ctx.saved_tensors
        return g @ v, g.T @ u


class OuterTransposed(Outer):
    """Used with equal lengths, so the transposed product has the right shape."""

    @staticmethod
    def backward(ctx, g):
        u, v = ctx.saved_tensors
        return g.T @ v, g.T @ u  # u's gradient contracts the wrong axis


# ----------------------------------------------------------------------- reductions


class SumDim(Function):
    @staticmethod
    def forward(ctx, x, dim, keepdim=False):
        ctx.shape, ctx.dim, ctx.keepdim = x.shape, dim, keepdim
        return x.sum(dim, keepdim=keepdim)

    @staticmethod
    def backward(ctx, g):
        if not ctx.keepdim:
            g = g.unsqueeze(ctx.dim)
        return g.expand(ctx.shape), None, None


class SumDimWrongExpand(SumDim):
    """Used with a square input and keepdim=False, so the wrong expand still fits."""

    @staticmethod
    def backward(ctx, g):
        return g.unsqueeze(0).expand(ctx.shape), None, None  # re-inserted the wrong dim


class MeanDim(Function):
    @staticmethod
    def forward(ctx, x, dim):
        ctx.shape, ctx.dim = x.shape, dim
        return x.mean(dim)

    @staticmethod
    def backward(ctx, g):
        return g.unsqueeze(ctx.dim).expand(ctx.shape) / ctx.shape[ctx.dim], None


class MeanDimWrongDivisor(MeanDim):
    @staticmethod
    def backward(ctx, g):
        return g.unsqueeze(ctx.dim).expand(ctx.shape) / ctx.shape[0], None  # size of the wrong dim


class Mean(Function):
    @staticmethod
    def forward(ctx, x):
        ctx.shape, ctx.n = x.shape, x.numel()
        return x.mean()

    @staticmethod
    def backward(ctx, g):
        return g.expand(ctx.shape) / ctx.n


class Norm(Function):
    @staticmethod
    def forward(ctx, x):
        n = x.norm()
        ctx.save_for_backward(x, n)
        return n

    @staticmethod
    def backward(ctx, g):
        x, n = ctx.saved_tensors
        return g * x / n


class NormMissingDivision(Norm):
    @staticmethod
    def backward(ctx, g):
        x, n = ctx.saved_tensors
        return g * x  # forgot to divide by the norm


class LogSumExp(Function):
    @staticmethod
    def forward(ctx, x, dim=-1):
        out = x.logsumexp(dim)
        ctx.save_for_backward(x, out)
        ctx.dim = dim
        return out

    @staticmethod
    def backward(ctx, g):
        x, out = ctx.saved_tensors
        return g.unsqueeze(ctx.dim) * (x - out.unsqueeze(ctx.dim)).exp(), None


class LogSumExpUnnormalized(LogSumExp):
    @staticmethod
    def backward(ctx, g):
        x, out = ctx.saved_tensors
        return g.unsqueeze(ctx.dim) * x.exp(), None  # forgot to subtract the logsumexp


# ----------------------------------------------------------------- softmax, cumsum


class Softmax(Function):
    @staticmethod
    def forward(ctx, x, dim=-1):
        s = x.softmax(dim)
        ctx.save_for_backward(s)
        ctx.dim = dim
        return s

    @staticmethod
    def backward(ctx, g):
        (s,) = ctx.saved_tensors
        return s * (g - (g * s).sum(ctx.dim, keepdim=True)), None


class SoftmaxDiagonalOnly(Softmax):
    @staticmethod
    def backward(ctx, g):
        (s,) = ctx.saved_tensors
        return g * s * (1 - s), None  # only the diagonal of the Jacobian (sigmoid-style)


class Cumsum(Function):
    @staticmethod
    def forward(ctx, x, dim):
        ctx.dim = dim
        return x.cumsum(dim)

    @staticmethod
    def backward(ctx, g):
        d = ctx.dim
        return g.flip(d).cumsum(d).flip(d), None


class CumsumWrongDirection(Cumsum):
    @staticmethod
    def backward(ctx, g):
        return g.cumsum(ctx.dim), None  # must accumulate from the end, not the start


# ------------------------------------------------- keyword, default, non-tensor args


class ScaleShiftPow(Function):
    """scale * x**power + shift: keyword arguments with defaults."""

    @staticmethod
    def forward(ctx, x, scale=1.0, shift=0.0, power=2):
        ctx.save_for_backward(x)
        ctx.scale, ctx.power = scale, power
        return scale * x**power + shift

    @staticmethod
    def backward(ctx, g):
        (x,) = ctx.saved_tensors
        return g * ctx.scale * ctx.power * x ** (ctx.power - 1), None, None, None


class ScaleShiftPowForgotScale(ScaleShiftPow):
    @staticmethod
    def backward(ctx, g):
        (x,) = ctx.saved_tensors
        return g * ctx.power * x ** (ctx.power - 1), None, None, None  # forgot scale


class PermutePow(Function):
    """alpha * x.permute(dims)**n (+ bias): a tuple of ints, a float, an int and None."""

    @staticmethod
    def forward(ctx, x, dims, alpha, n, bias=None):
        xp = x.permute(dims)
        ctx.save_for_backward(xp)
        ctx.dims, ctx.alpha, ctx.n = dims, alpha, n
        out = alpha * xp**n
        return out if bias is None else out + bias

    @staticmethod
    def backward(ctx, g):
        (xp,) = ctx.saved_tensors
        inverse = [0] * len(ctx.dims)
        for i, d in enumerate(ctx.dims):
            inverse[d] = i
        gx = (g * ctx.alpha * ctx.n * xp ** (ctx.n - 1)).permute(inverse)
        gbias = g if ctx.needs_input_grad[4] else None
        return gx, None, None, None, gbias


class PermutePowNotInverted(PermutePow):
    """Used with a cubic input and a 3-cycle, so the un-inverted permutation still fits."""

    @staticmethod
    def backward(ctx, g):
        (xp,) = ctx.saved_tensors
        gx = (g * ctx.alpha * ctx.n * xp ** (ctx.n - 1)).permute(ctx.dims)  # not inverted
        return gx, None, None, None, None


# ------------------------------------------------------------------ multiple outputs


class MulAndSin(Function):
    """Two float outputs: (x * y, sin(x))."""

    @staticmethod
    def forward(ctx, x, y):
        ctx.save_for_backward(x, y)
        return x * y, x.sin()

    @staticmethod
    def backward(ctx, g1, g2):
        x, y = ctx.saved_tensors
        return g1 * y + g2 * x.cos(), g1 * x


class MulAndSinDropsSecond(MulAndSin):
    @staticmethod
    def backward(ctx, g1, g2):
        x, y = ctx.saved_tensors
        return g1 * y, g1 * x  # x's gradient misses the contribution of the second output


class ArgmaxFirstLogSumExp(Function):
    """(argmax over the last dim [int64], logsumexp over the last dim): the int output first."""

    @staticmethod
    def forward(ctx, x):
        out = x.logsumexp(-1)
        ctx.save_for_backward(x, out)
        return x.argmax(-1), out

    @staticmethod
    def backward(ctx, g_idx, g):
        x, out = ctx.saved_tensors
        return g.unsqueeze(-1) * (x - out.unsqueeze(-1)).exp()


class ArgmaxFirstLogSumExpUnnormalized(ArgmaxFirstLogSumExp):
    @staticmethod
    def backward(ctx, g_idx, g):
        x, out = ctx.saved_tensors
        return g.unsqueeze(-1) * x.exp()  # forgot to subtract the logsumexp


class LogSumExpThenArgmax(Function):
    """(logsumexp over the last dim, argmax over the last dim [int64]): the int output last."""

    @staticmethod
    def forward(ctx, x):
        out = x.logsumexp(-1)
        ctx.save_for_backward(x, out)
        return out, x.argmax(-1)

    @staticmethod
    def backward(ctx, g, g_idx):
        x, out = ctx.saved_tensors
        return g.unsqueeze(-1) * (x - out.unsqueeze(-1)).exp()


class MaskFirstHalfSquare(Function):
    """(positive mask [float, mark_non_differentiable], x**2 / 2): the non-differentiable output first."""

    @staticmethod
    def forward(ctx, x):
        mask = (x > 0).to(x.dtype)
        ctx.mark_non_differentiable(mask)
        ctx.save_for_backward(x)
        return mask, 0.5 * x * x

    @staticmethod
    def backward(ctx, g_mask, g):
        (x,) = ctx.saved_tensors
        return g * x


class MaskFirstHalfSquareGradsSwapped(MaskFirstHalfSquare):
    @staticmethod
    def backward(ctx, g, g_mask):  # parameters in the wrong order: uses the mask's (zero) gradient
        (x,) = ctx.saved_tensors
        return g * x


# ---------------------------------------------------------------------- setup_context


class SetupContextMulExp(Function):
    """x * exp(alpha * y), written in the forward / setup_context style."""

    @staticmethod
    def forward(x, y, alpha=1.0):
        return x * (alpha * y).exp()

    @staticmethod
    def setup_context(ctx, inputs, output):
        x, y, alpha = inputs
        ctx.save_for_backward(x, y)
        ctx.alpha = alpha

    @staticmethod
    def backward(ctx, g):
        x, y = ctx.saved_tensors
        e = (ctx.alpha * y).exp()
        return g * e, g * x * e * ctx.alpha, None


class SetupContextMulExpSignError(SetupContextMulExp):
    @staticmethod
    def backward(ctx, g):
        x, y = ctx.saved_tensors
        e = (ctx.alpha * y).exp()
        return g * e, -g * x * e * ctx.alpha, None  # sign error in y's gradient only


# ------------------------------------------------------------------------- builders


def _x34(g):
    return (_randn(g, 3, 4),)


def _two34(g):
    return (_randn(g, 3, 4), _randn(g, 3, 4))


def _linear_args(g):
    return (_randn(g, 2, 3), _randn(g, 4, 3), _randn(g, 4))


def _broadcast_args(g):
    return (_randn(g, 3, 4), _randn(g, 4), _randn(g, 3, 1))


def _affine_args(g):
    return (_randn(g, 3, 4), _randn(g, 3, 4, grad=False), _randn(g, 3, 4))


def _scalars(g):
    return (_randn(g), _randn(g))


def _clamp_args(g):
    return (_away(g, 3, 4, kinks=(-0.5, 0.5), margin=0.1, lo=-1.5, hi=1.5), -0.5, 0.5)


def _clamp_args_with_overflow(g):
    # Make sure some entries are above hi, where the wrong mask differs.
    x = _away(g, 3, 4, kinks=(-0.5, 0.5), margin=0.1, lo=-1.5, hi=1.5).detach()
    x[0, 0], x[1, 2] = 1.2, 0.9
    return (x.requires_grad_(True), -0.5, 0.5)


def _positive34(g):
    return (_uniform(g, 3, 4, lo=0.5, hi=2.0),)


_INT_OUTPUT_NOTE = (
    "torch.autograd.gradcheck raises IndexError: its numerical Jacobians "
    "skip integer outputs but are then realigned with all outputs by position"
)


CORPUS: list[Case] = [
    # ----------------------------------------------------------------- correct
    Case("ok_exp", Exp, _x34, True),
    Case("ok_sin", Sin, _x34, True),
    Case("ok_tanh", Tanh, lambda g: (_randn(g, 3, 4, scale=0.7),), True),
    Case("ok_sigmoid", Sigmoid, _x34, True),
    Case("ok_square", Square, _x34, True),
    Case("ok_sqrt", Sqrt, _positive34, True),
    Case("ok_sin_of_square", SinOfSquare, _x34, True),
    Case("ok_leaky_relu_default_slope", LeakyRelu, lambda g: (_mixed_signs(g, 3, 4),), True),
    Case("ok_clamp_float_args", Clamp, _clamp_args, True),
    Case("ok_mul", Mul, _two34, True),
    Case("ok_linear_three_inputs", Linear, _linear_args, True),
    Case("ok_broadcast", Broadcast, _broadcast_args, True),
    Case("ok_input_without_grad", Affine, _affine_args, True),
    Case("ok_output_ignores_input_none", IgnoresSecondInput, _two34, True),
    Case("ok_output_ignores_input_zeros", IgnoresSecondInputZeros, _two34, True),
    Case("ok_0d_scalars", Scalars, _scalars, True),
    Case("ok_matmul_nonsquare", MatMul, lambda g: (_randn(g, 2, 3), _randn(g, 3, 4)), True),
    Case("ok_bmm", Bmm, lambda g: (_randn(g, 2, 2, 3), _randn(g, 2, 3, 4)), True),
    Case("ok_outer", Outer, lambda g: (_randn(g, 3), _randn(g, 5)), True),
    Case("ok_sum_dim_int_arg", SumDim, lambda g: (_randn(g, 3, 4), 1), True),
    Case("ok_sum_dim_keepdim_kwarg", SumDim, lambda g: (_randn(g, 3, 4), 0), True, kwargs={"keepdim": True}),
    Case("ok_mean_dim", MeanDim, lambda g: (_randn(g, 3, 4), 1), True),
    Case("ok_mean_all_0d_output", Mean, _x34, True),
    Case("ok_norm", Norm, lambda g: (_randn(g, 6),), True),
    Case("ok_logsumexp_default_dim", LogSumExp, _x34, True),
    Case("ok_logsumexp_dim_kwarg", LogSumExp, _x34, True, kwargs={"dim": 0}),
    Case("ok_softmax", Softmax, _x34, True),
    Case("ok_cumsum", Cumsum, lambda g: (_randn(g, 3, 4), 1), True),
    Case("ok_kwargs_scale_power", ScaleShiftPow, lambda g: (_randn(g, 3, 4),), True, kwargs={"power": 3, "scale": 0.5}),
    Case("ok_defaults_only", ScaleShiftPow, lambda g: (_randn(g, 3, 4),), True),
    Case(
        "ok_nontensor_tuple_float_int_none", PermutePow, lambda g: (_randn(g, 2, 3, 4), (2, 0, 1), 0.7, 2, None), True
    ),
    Case(
        "ok_nontensor_with_bias_tensor",
        PermutePow,
        lambda g: (_randn(g, 2, 3, 4), (2, 0, 1), 0.7, 2, _randn(g, 4, 2, 3)),
        True,
    ),
    Case("ok_two_float_outputs", MulAndSin, _two34, True),
    Case("ok_int64_output_first", ArgmaxFirstLogSumExp, _x34, True, torch_can_judge=False, torch_note=_INT_OUTPUT_NOTE),
    Case("ok_int64_output_last", LogSumExpThenArgmax, _x34, True),
    Case("ok_nondiff_output_first", MaskFirstHalfSquare, lambda g: (_mixed_signs(g, 3, 4),), True),
    Case("ok_setup_context", SetupContextMulExp, _two34, True),
    Case("ok_setup_context_kwarg", SetupContextMulExp, _two34, True, kwargs={"alpha": 0.5}),
    # ------------------------------------------------------------------- wrong
    Case("bad_exp_all_zeros", ExpAllZeroGrad, _x34, False, wrong_args=("x",)),
    Case("bad_sin_sign", SinSignError, _x34, False, wrong_args=("x",)),
    Case("bad_tanh_1_01x", TanhOnePercentOff, lambda g: (_randn(g, 3, 4, scale=0.7),), False, wrong_args=("x",)),
    Case("bad_sigmoid_uses_input", SigmoidUsesInput, _x34, False, wrong_args=("x",)),
    Case("bad_square_forgot_2x", SquareForgotTwo, _x34, False, wrong_args=("x",)),
    Case("bad_sqrt_forgot_half", SqrtForgotHalf, _positive34, False, wrong_args=("x",)),
    Case("bad_sin_of_square_missing_chain", SinOfSquareMissingChain, _x34, False, wrong_args=("x",)),
    Case(
        "bad_leaky_relu_mask_negative_only",
        LeakyReluWrongNegativeSlope,
        lambda g: (_mixed_signs(g, 3, 4),),
        False,
        wrong_args=("x",),
    ),
    Case("bad_clamp_mask_missing_upper", ClampMaskMissingUpper, _clamp_args_with_overflow, False, wrong_args=("x",)),
    Case("bad_mul_single_wrong_element", MulOneWrongElement, _two34, False, wrong_args=("x",)),
    Case("bad_linear_wrong_weight_only", LinearWrongWeightOnly, _linear_args, False, wrong_args=("weight",)),
    Case("bad_broadcast_mean_instead_of_sum", BroadcastMeanInsteadOfSum, _broadcast_args, False, wrong_args=("y",)),
    Case("bad_input_without_grad_forgot_w", AffineForgotW, _affine_args, False, wrong_args=("x",)),
    Case("bad_ignored_input_gets_grad", IgnoresSecondInputButGradsIt, _two34, False, wrong_args=("y",)),
    Case("bad_0d_swapped_operand", ScalarsSwapped, _scalars, False, wrong_args=("a",)),
    Case(
        "bad_matmul_missing_transpose",
        MatMulMissingTranspose,
        lambda g: (_randn(g, 3, 3), _randn(g, 3, 4)),
        False,
        wrong_args=("b",),
    ),
    Case(
        "bad_bmm_swapped_operands",
        BmmSwappedOperands,
        lambda g: (_randn(g, 2, 3, 3), _randn(g, 2, 3, 3)),
        False,
        wrong_args=("a",),
    ),
    Case("bad_outer_transposed", OuterTransposed, lambda g: (_randn(g, 4), _randn(g, 4)), False, wrong_args=("u",)),
    Case("bad_sum_wrong_dim_expand", SumDimWrongExpand, lambda g: (_randn(g, 4, 4), 1), False, wrong_args=("x",)),
    Case("bad_mean_wrong_dim_divisor", MeanDimWrongDivisor, lambda g: (_randn(g, 3, 4), 1), False, wrong_args=("x",)),
    Case("bad_norm_missing_division", NormMissingDivision, lambda g: (_randn(g, 6),), False, wrong_args=("x",)),
    Case("bad_logsumexp_unnormalized", LogSumExpUnnormalized, _x34, False, wrong_args=("x",)),
    Case("bad_softmax_diagonal_only", SoftmaxDiagonalOnly, _x34, False, wrong_args=("x",)),
    Case("bad_cumsum_wrong_direction", CumsumWrongDirection, lambda g: (_randn(g, 3, 4), 1), False, wrong_args=("x",)),
    Case(
        "bad_kwargs_forgot_scale",
        ScaleShiftPowForgotScale,
        lambda g: (_randn(g, 3, 4),),
        False,
        kwargs={"scale": 2.5, "shift": 1.0},
        wrong_args=("x",),
    ),
    Case(
        "bad_nontensor_permutation_not_inverted",
        PermutePowNotInverted,
        lambda g: (_randn(g, 3, 3, 3), (1, 2, 0), 0.7, 2, None),
        False,
        wrong_args=("x",),
    ),
    Case("bad_two_outputs_drops_second", MulAndSinDropsSecond, _two34, False, wrong_args=("x",)),
    Case(
        "bad_int64_output_first",
        ArgmaxFirstLogSumExpUnnormalized,
        _x34,
        False,
        wrong_args=("x",),
        torch_can_judge=False,
        torch_note=_INT_OUTPUT_NOTE,
    ),
    Case(
        "bad_nondiff_output_first_grads_swapped",
        MaskFirstHalfSquareGradsSwapped,
        lambda g: (_mixed_signs(g, 3, 4),),
        False,
        wrong_args=("x",),
    ),
    Case(
        "bad_setup_context_sign_y_only",
        SetupContextMulExpSignError,
        _two34,
        False,
        kwargs={"alpha": 0.5},
        wrong_args=("y",),
    ),
]

_names = [c.name for c in CORPUS]
assert len(_names) == len(set(_names)), "duplicate case names"
del _names


def module_source(*functions: type) -> str:
    """The text of a module that defines ``functions`` (classes of this corpus) as written here: for the
    user modules that tests write, so a test's module starts from these definitions, not a copy of them."""
    import inspect

    return "import torch\nfrom torch.autograd import Function\n\n\n" + "\n\n".join(
        inspect.getsource(f) for f in functions
    )
