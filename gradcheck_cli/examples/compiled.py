"""Functions for the compile check: torch.compile's gradients against eager's.

``RoundSTE`` is PyTorch issue 193279: a straight-through rounding Function whose gradient is 1
eagerly, and under ``torch.compile(torch.func.grad(loss), backend="aot_eager")`` 0 (the compiled
transform differentiates ``round`` instead of calling the Function's backward). ``ScaledTanh`` is
right under both; ``Dropout`` draws random numbers (inductor's RNG draws other ones than eager);
``LogItem`` breaks the graph (``.item()``).
"""

from __future__ import annotations

from typing import Any

import torch
from torch import Tensor


class RoundSTE(torch.autograd.Function):
    """Rounding with a straight-through estimator (setup_context style, so torch.func can run it)."""

    @staticmethod
    def forward(x: Tensor) -> Tensor:
        return torch.round(x)

    @staticmethod
    def setup_context(ctx: Any, inputs: tuple[Any, ...], output: Tensor) -> None:
        pass

    @staticmethod
    def backward(ctx: Any, grad: Tensor) -> Tensor:
        return grad


class ScaledTanh(torch.autograd.Function):
    """y = a * tanh(x): the same gradient eagerly and compiled."""

    @staticmethod
    def forward(x: Tensor, a: float) -> Tensor:
        return a * torch.tanh(x)

    @staticmethod
    def setup_context(ctx: Any, inputs: tuple[Any, ...], output: Tensor) -> None:
        x, a = inputs
        ctx.save_for_backward(x)
        ctx.a = a

    @staticmethod
    def backward(ctx: Any, grad: Tensor) -> tuple[Tensor, None]:
        (x,) = ctx.saved_tensors
        return grad * ctx.a * (1 - torch.tanh(x) ** 2), None


class Dropout(torch.autograd.Function):
    """Inverted dropout (p = 0.5) drawing its mask from the global RNG."""

    @staticmethod
    def forward(x: Tensor) -> Tensor:
        return x * (torch.rand_like(x) >= 0.5).to(x.dtype) * 2

    @staticmethod
    def setup_context(ctx: Any, inputs: tuple[Any, ...], output: Tensor) -> None:
        (x,) = inputs
        ctx.save_for_backward(x, output)

    @staticmethod
    def backward(ctx: Any, grad: Tensor) -> Tensor:
        x, out = ctx.saved_tensors
        return grad * torch.where(x != 0, out / x, 0)


def log_item(x: Tensor) -> Tensor:
    """exp(x) scaled by a Python float read with ``.item()``: torch.compile breaks the graph there."""
    scale = float(x.detach().abs().max().item())
    return torch.exp(x) / (1 + scale)
