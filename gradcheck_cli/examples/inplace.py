"""In-place Functions: forward changes its input and marks it dirty (``ctx.mark_dirty``).

Called on a leaf that requires grad, autograd refuses them ("a leaf Variable that requires grad is
being used in an in-place operation"); gradcheck calls them on copies of the arguments (detected, or
``clone_inputs: true``), so they are checked like any other Function.
"""

from __future__ import annotations

from typing import Any

import torch
from torch import Tensor


class ExpInPlace(torch.autograd.Function):
    """x.exp_(): the result is saved (the input is gone), and d exp(x) / dx = exp(x)."""

    @staticmethod
    def forward(ctx: Any, x: Tensor) -> Tensor:
        x.exp_()
        ctx.mark_dirty(x)
        ctx.save_for_backward(x)
        return x

    @staticmethod
    def backward(ctx: Any, grad: Tensor) -> Tensor:
        (out,) = ctx.saved_tensors
        return grad * out


class ScaleInPlace(torch.autograd.Function):
    """x.mul_(a) for a number a."""

    @staticmethod
    def forward(ctx: Any, x: Tensor, a: float) -> Tensor:
        ctx.a = a
        x.mul_(a)
        ctx.mark_dirty(x)
        return x

    @staticmethod
    def backward(ctx: Any, grad: Tensor) -> tuple[Tensor, None]:
        return grad * ctx.a, None


class ScaleInPlaceForgetsFactor(ScaleInPlace):
    """Deliberately broken: backward forgets the factor a."""

    @staticmethod
    def backward(ctx: Any, grad: Tensor) -> tuple[Tensor, None]:
        return grad, None  # BUG: should be grad * ctx.a
