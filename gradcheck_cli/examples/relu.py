"""The classic ReLU example."""

from __future__ import annotations

from typing import Any

import torch
from torch import Tensor


class ReLU(torch.autograd.Function):
    """``x.clamp(min=0)``; gradient is passed where ``x > 0``."""

    @staticmethod
    def forward(ctx: Any, x: Tensor) -> Tensor:
        ctx.save_for_backward(x)
        return x.clamp(min=0)

    @staticmethod
    def backward(ctx: Any, grad_output: Tensor) -> Tensor:
        (x,) = ctx.saved_tensors
        return grad_output * (x > 0).to(grad_output.dtype)
