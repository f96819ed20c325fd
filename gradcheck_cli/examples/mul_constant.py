"""Multiplication of a tensor by a non-tensor (Python float) constant."""

from __future__ import annotations

from typing import Any

import torch
from torch import Tensor


class MulConstant(torch.autograd.Function):
    """``tensor * constant``; the constant gets no gradient."""

    @staticmethod
    def forward(ctx: Any, tensor: Tensor, constant: float) -> Tensor:
        ctx.constant = constant
        return tensor * constant

    @staticmethod
    def backward(ctx: Any, grad_output: Tensor) -> tuple[Tensor, None]:
        return grad_output * ctx.constant, None
