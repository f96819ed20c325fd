"""Stochastic Functions: forward draws random numbers from the global RNG (like dropout).

``gradcheck`` restores the RNG state before every forward, so the graph forward and each
finite-difference forward draw the same mask; ``torch.autograd.gradcheck`` does not, and
fails even the correct one.
"""

from __future__ import annotations

from typing import Any

import torch
from torch import Tensor


class Dropout(torch.autograd.Function):
    """Inverted dropout: zero each element with probability ``p``, scale the rest by 1 / (1 - p)."""

    @staticmethod
    def forward(ctx: Any, input: Tensor, p: float = 0.5) -> Tensor:
        mask = (torch.rand(input.shape, device=input.device) >= p).to(input.dtype) / (1 - p)
        ctx.save_for_backward(mask)
        ctx.p = p
        return input * mask

    @staticmethod
    def backward(ctx: Any, grad_output: Tensor) -> tuple[Tensor, None]:
        (mask,) = ctx.saved_tensors
        return grad_output * mask, None


class DropoutNoMask(Dropout):
    """Deliberately broken: backward scales by 1 / (1 - p) but forgets the mask."""

    @staticmethod
    def backward(ctx: Any, grad_output: Tensor) -> tuple[Tensor, None]:
        return grad_output / (1 - ctx.p), None  # BUG: scaled, but the mask is not applied
