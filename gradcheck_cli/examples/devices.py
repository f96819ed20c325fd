"""Device-agnostic example Functions: torch ops only, so they run on the CPU and on CUDA alike."""

from __future__ import annotations

from typing import Any

import torch
from torch import Tensor


class Softsign(torch.autograd.Function):
    """y = x / (1 + |x|), dy/dx = 1 / (1 + |x|)^2."""

    @staticmethod
    def forward(ctx: Any, x: Tensor) -> Tensor:
        ctx.save_for_backward(x)
        return x / (1 + x.abs())

    @staticmethod
    def backward(ctx: Any, grad: Tensor) -> Tensor:
        (x,) = ctx.saved_tensors
        return grad / (1 + x.abs()) ** 2


class Gather(torch.autograd.Function):
    """out = src[index] along dim 0; backward adds the gradients back with ``index_add_``.

    With repeated indices, ``index_add_`` on CUDA uses atomic adds, whose order (and so the
    last bits of the result) changes from run to run: a nondeterministic backward that needs a
    ``nondet_tol``. On the CPU it is deterministic.
    """

    @staticmethod
    def forward(ctx: Any, src: Tensor, index: Tensor) -> Tensor:
        ctx.save_for_backward(index)
        ctx.rows = src.shape[0]
        return src[index]

    @staticmethod
    def backward(ctx: Any, grad: Tensor) -> tuple[Tensor, None]:
        (index,) = ctx.saved_tensors
        out = grad.new_zeros((ctx.rows,) + grad.shape[1:])
        return out.index_add_(0, index, grad), None
