"""Functions that support every order: a differentiable backward and a ``jvp``.

They pass ``backward``, ``double_backward`` and ``forward_ad`` (see specs/higher.yaml). What
makes backward differentiable: it is written with torch ops on what ``ctx`` saved (inputs and
outputs), never on intermediates computed in forward (forward runs without autograd, so those
would carry no graph), and it is not marked ``@once_differentiable``. ``jvp`` reads what
``ctx.save_for_forward`` kept (in jvp, ``ctx.saved_tensors`` holds only that) and takes one
tangent per argument forward was called with (a default for arguments that may be left out).
"""

from __future__ import annotations

from typing import Any, Optional

import torch
from torch import Tensor


class Sin(torch.autograd.Function):
    """``sin(x)``: saves its input for both directions."""

    @staticmethod
    def forward(ctx: Any, x: Tensor) -> Tensor:
        ctx.save_for_backward(x)
        ctx.save_for_forward(x)
        return x.sin()

    @staticmethod
    def backward(ctx: Any, grad: Tensor) -> Tensor:
        (x,) = ctx.saved_tensors
        return grad * x.cos()

    @staticmethod
    def jvp(ctx: Any, x_t: Tensor) -> Tensor:
        (x,) = ctx.saved_tensors
        return x_t * x.cos()


class ScaledMul(torch.autograd.Function):
    """``scale * x * y`` with a non-tensor ``scale`` (it gets no gradient and no tangent)."""

    @staticmethod
    def forward(ctx: Any, x: Tensor, y: Tensor, scale: float = 1.0) -> Tensor:
        ctx.save_for_backward(x, y)
        ctx.save_for_forward(x, y)
        ctx.scale = scale
        return scale * x * y

    @staticmethod
    def backward(ctx: Any, grad: Tensor) -> tuple[Tensor, Tensor, None]:
        x, y = ctx.saved_tensors
        return ctx.scale * grad * y, ctx.scale * grad * x, None

    @staticmethod
    def jvp(ctx: Any, x_t: Tensor, y_t: Tensor, _scale_t: None = None) -> Tensor:
        x, y = ctx.saved_tensors
        return ctx.scale * (x_t * y + x * y_t)


class LogSumExp(torch.autograd.Function):
    """``logsumexp(x, dim)``: backward and jvp use the saved output, not a saved softmax."""

    @staticmethod
    def forward(ctx: Any, x: Tensor, dim: int = -1) -> Tensor:
        out = x.logsumexp(dim)
        ctx.save_for_backward(x, out)
        ctx.save_for_forward(x, out)
        ctx.dim = dim
        return out

    @staticmethod
    def backward(ctx: Any, grad: Tensor) -> tuple[Tensor, None]:
        x, out = ctx.saved_tensors
        return grad.unsqueeze(ctx.dim) * (x - out.unsqueeze(ctx.dim)).exp(), None

    @staticmethod
    def jvp(ctx: Any, x_t: Tensor, _dim_t: None = None) -> Tensor:
        x, out = ctx.saved_tensors
        return (x_t * (x - out.unsqueeze(ctx.dim)).exp()).sum(ctx.dim)


class MaxWithIndex(torch.autograd.Function):
    """``(max over the last dim, argmax [int64])``: an integer output gets no gradient and no tangent."""

    @staticmethod
    def forward(ctx: Any, x: Tensor) -> tuple[Tensor, Tensor]:
        values, index = x.max(-1)
        ctx.mark_non_differentiable(index)
        ctx.save_for_backward(x, index)
        ctx.save_for_forward(index)
        return values, index

    @staticmethod
    def backward(ctx: Any, grad: Tensor, _grad_index: Optional[Tensor]) -> Tensor:
        x, index = ctx.saved_tensors
        return torch.zeros_like(x).scatter(-1, index.unsqueeze(-1), grad.unsqueeze(-1))

    @staticmethod
    def jvp(ctx: Any, x_t: Tensor) -> tuple[Tensor, None]:
        (index,) = ctx.saved_tensors
        return x_t.gather(-1, index.unsqueeze(-1)).squeeze(-1), None


def softplus(x: Tensor, beta: float = 1.0) -> Tensor:
    """A plain function of torch ops: all three checks use torch's own derivatives."""
    return torch.nn.functional.softplus(x, beta=beta)


# Every order through hand-written code: sin's backward and jvp call the Function of cos, whose own
# backward and jvp call the Function of sin again, so the derivative of order N runs N hand-written
# backwards (``order: N`` in a spec checks each order up to N; see specs/higher.yaml).


class SinTower(torch.autograd.Function):
    """``sin(x)`` whose backward and jvp call ``CosTower`` (and it ``SinTower``): right at every order."""

    cos: Any = None  # the Function of cos its derivatives call (set below; a subclass may call another)

    @staticmethod
    def forward(ctx: Any, x: Tensor) -> Tensor:
        ctx.save_for_backward(x)
        ctx.save_for_forward(x)
        return x.sin()

    @classmethod
    def backward(cls, ctx: Any, grad: Tensor) -> Tensor:
        (x,) = ctx.saved_tensors
        return grad * cls.cos.apply(x)

    @classmethod
    def jvp(cls, ctx: Any, x_t: Tensor) -> Tensor:
        (x,) = ctx.saved_tensors
        return x_t * cls.cos.apply(x)


class CosTower(torch.autograd.Function):
    """``cos(x)`` whose backward and jvp call ``SinTower``: d/dx cos = -sin."""

    sin: Any = SinTower

    @staticmethod
    def forward(ctx: Any, x: Tensor) -> Tensor:
        ctx.save_for_backward(x)
        ctx.save_for_forward(x)
        return x.cos()

    @classmethod
    def backward(cls, ctx: Any, grad: Tensor) -> Tensor:
        (x,) = ctx.saved_tensors
        return -grad * cls.sin.apply(x)

    @classmethod
    def jvp(cls, ctx: Any, x_t: Tensor) -> Tensor:
        (x,) = ctx.saved_tensors
        return -x_t * cls.sin.apply(x)


SinTower.cos = CosTower


class _SinBackwardSignFlipped(SinTower):
    """BROKEN: sin whose backward returns -cos (its jvp is right)."""

    @classmethod
    def backward(cls, ctx: Any, grad: Tensor) -> Tensor:
        (x,) = ctx.saved_tensors
        return -grad * x.cos()


class _SinJvpSignFlipped(SinTower):
    """BROKEN: sin whose jvp returns -cos (its backward is right)."""

    @classmethod
    def jvp(cls, ctx: Any, x_t: Tensor) -> Tensor:
        (x,) = ctx.saved_tensors
        return -x_t * x.cos()


class _CosThirdWrong(CosTower):
    sin = _SinBackwardSignFlipped


class _CosThirdJvpWrong(CosTower):
    sin = _SinJvpSignFlipped


class SinThirdDerivativeWrong(SinTower):
    """BROKEN at order 3 only: backward and its derivative are right, but the derivative of that (the
    third derivative of sin, by the backward of the sin that cos's backward calls) has the wrong sign."""

    cos = _CosThirdWrong


class SinThirdJvpWrong(SinTower):
    """BROKEN at order 3 in forward mode only: backward differentiated once by reverse mode calls a sin
    whose jvp has the wrong sign (its backward is right, so reverse mode finds nothing)."""

    cos = _CosThirdJvpWrong
