"""Functions for the forward-mode checks that go beyond one jvp: ``forward_over_reverse`` (backward
differentiated by forward-mode AD) and ``batched_forward`` (jvp under vmap, a batch of tangents at once).

Correct ones pass both (specs/forward_modes.yaml). The broken ones each carry one realistic mistake that
``backward``, ``double_backward`` and ``forward_ad`` all miss (broken-specs/forward_modes_*.yaml): a helper
Function that backward calls has a right backward and a wrong jvp, so reverse-over-reverse second
derivatives are right and forward-over-reverse ones (Hessian-vector products in forward mode) are wrong;
a jvp whose fallback path, taken only under vmap, forgets a factor.
"""

from __future__ import annotations

from typing import Any

import torch
from torch import Tensor

# ------------------------------------------------------------------ correct


class Cube(torch.autograd.Function):
    """``x ** 3``: backward and jvp use the saved input."""

    @staticmethod
    def forward(ctx: Any, x: Tensor) -> Tensor:
        ctx.save_for_backward(x)
        ctx.save_for_forward(x)
        return x**3

    @staticmethod
    def backward(ctx: Any, grad: Tensor) -> Tensor:
        (x,) = ctx.saved_tensors
        return 3 * x**2 * grad

    @staticmethod
    def jvp(ctx: Any, x_t: Tensor) -> Tensor:
        (x,) = ctx.saved_tensors
        return 3 * x**2 * x_t


class Exp(torch.autograd.Function):
    """``exp(x)``: backward uses the saved output, so pushing backward forward goes through jvp's tangent."""

    @staticmethod
    def forward(ctx: Any, x: Tensor) -> Tensor:
        y = x.exp()
        ctx.save_for_backward(y)
        ctx.save_for_forward(y)
        return y

    @staticmethod
    def backward(ctx: Any, grad: Tensor) -> Tensor:
        (y,) = ctx.saved_tensors
        return grad * y

    @staticmethod
    def jvp(ctx: Any, x_t: Tensor) -> Tensor:
        (y,) = ctx.saved_tensors
        return x_t * y


class Cos(torch.autograd.Function):
    """``cos(x)``, right in every direction: a helper that backwards below call."""

    @staticmethod
    def forward(ctx: Any, x: Tensor) -> Tensor:
        ctx.save_for_backward(x)
        ctx.save_for_forward(x)
        return x.cos()

    @staticmethod
    def backward(ctx: Any, grad: Tensor) -> Tensor:
        (x,) = ctx.saved_tensors
        return -grad * x.sin()

    @staticmethod
    def jvp(ctx: Any, x_t: Tensor) -> Tensor:
        (x,) = ctx.saved_tensors
        return -x_t * x.sin()


class SinByHelper(torch.autograd.Function):
    """``sin(x)`` whose backward calls the helper Function ``Cos``: forward mode goes through its jvp."""

    helper: Any = Cos

    @classmethod
    def forward(cls, ctx: Any, x: Tensor) -> Tensor:
        ctx.save_for_backward(x)
        ctx.save_for_forward(x)
        return x.sin()

    @classmethod
    def backward(cls, ctx: Any, grad: Tensor) -> Tensor:
        (x,) = ctx.saved_tensors
        return grad * cls.helper.apply(x)

    @staticmethod
    def jvp(ctx: Any, x_t: Tensor) -> Tensor:
        (x,) = ctx.saved_tensors
        return x_t * x.cos()


class Bilinear(torch.autograd.Function):
    """``(x * y).sum(-1)``, two arguments: the derivatives of backward mix them."""

    @staticmethod
    def forward(ctx: Any, x: Tensor, y: Tensor) -> Tensor:
        ctx.save_for_backward(x, y)
        ctx.save_for_forward(x, y)
        return (x * y).sum(-1)

    @staticmethod
    def backward(ctx: Any, grad: Tensor) -> tuple[Tensor, Tensor]:
        x, y = ctx.saved_tensors
        g = grad.unsqueeze(-1)
        return g * y, g * x

    @staticmethod
    def jvp(ctx: Any, x_t: Tensor, y_t: Tensor) -> Tensor:
        x, y = ctx.saved_tensors
        return (x_t * y + x * y_t).sum(-1)


def softplus(x: Tensor, beta: float = 1.0) -> Tensor:
    """A plain function of torch ops: both directions come from torch's formulas."""
    return torch.nn.functional.softplus(x, beta=beta)


# ------------------------------------------------------------------ broken


class CosWrongJvp(Cos):
    """``Cos`` with the sign of its jvp lost (its backward is right)."""

    @staticmethod
    def jvp(ctx: Any, x_t: Tensor) -> Tensor:
        (x,) = ctx.saved_tensors
        return x_t * x.sin()  # BUG: d cos = -sin


class SinHelperWrongJvp(SinByHelper):
    """BROKEN for forward_over_reverse only: backward calls ``CosWrongJvp``, whose backward is right
    (double_backward passes) and whose jvp has the wrong sign, so backward pushed forward is wrong."""

    helper = CosWrongJvp


class CosZeroJvp(Cos):
    """``Cos`` whose jvp drops the tangent (a constant-looking shortcut)."""

    @staticmethod
    def jvp(ctx: Any, x_t: Tensor) -> Tensor:
        return torch.zeros_like(x_t)  # BUG: the tangent is lost


class SinHelperZeroJvp(SinByHelper):
    """BROKEN for forward_over_reverse only: backward's helper pushes no tangent forward, so the
    forward-mode derivative of backward is zero where the reverse-mode one is not."""

    helper = CosZeroJvp


class CosNoJvp(torch.autograd.Function):
    """``cos(x)`` without a jvp: forward-mode AD cannot go through it."""

    @staticmethod
    def forward(ctx: Any, x: Tensor) -> Tensor:
        ctx.save_for_backward(x)
        return x.cos()

    @staticmethod
    def backward(ctx: Any, grad: Tensor) -> Tensor:
        (x,) = ctx.saved_tensors
        return -grad * x.sin()


class SinHelperNoJvp(SinByHelper):
    """Right, but its backward cannot be pushed forward: the helper it calls has no jvp
    (forward_over_reverse skips under `checks: all`, fails when named)."""

    helper = CosNoJvp


class DoubleZeroFastPath(torch.autograd.Function):
    """BROKEN for batched_forward only: ``2 x`` whose jvp has a fast path for a zero tangent and a
    fallback for when the fast path's ``.item()`` cannot run (under vmap) that forgets the factor 2: right
    one tangent at a time, wrong under vmap."""

    @staticmethod
    def forward(ctx: Any, x: Tensor) -> Tensor:
        return 2 * x

    @staticmethod
    def backward(ctx: Any, grad: Tensor) -> Tensor:
        return 2 * grad

    @staticmethod
    def jvp(ctx: Any, x_t: Tensor) -> Tensor:
        try:
            if x_t.abs().max().item() == 0.0:  # a zero tangent pushes forward to zero
                return torch.zeros_like(x_t)
            return 2 * x_t
        except RuntimeError:  # .item() refused (under a transform)
            return x_t  # BUG: the factor 2 is forgotten on this path


class CubeItemJvp(Cube):
    """``x ** 3`` whose jvp calls ``.item()`` (to skip a zero tangent): right one tangent at a time, but
    vmap refuses it (batched_forward: a warning under `checks: all`, a fail when named)."""

    @staticmethod
    def jvp(ctx: Any, x_t: Tensor) -> Tensor:
        (x,) = ctx.saved_tensors
        if x_t.abs().max().item() == 0.0:
            return torch.zeros_like(x_t)
        return 3 * x**2 * x_t
