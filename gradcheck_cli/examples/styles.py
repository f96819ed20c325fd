"""Functions written in other styles the loader must handle: ``setup_context`` and keyword args."""

from __future__ import annotations

from typing import Any

import torch
from torch import Tensor


class ScaleRows(torch.autograd.Function):
    """``x * w[:, None]`` for ``x`` of shape ``(N, M)`` and ``w`` of shape ``(N,)``.

    Uses the ``forward(x, w)`` + ``setup_context(ctx, inputs, output)`` style (no ctx in forward),
    which also makes it usable under torch.func transforms (vmap, grad, jacrev).
    """

    generate_vmap_rule = True

    @staticmethod
    def forward(x: Tensor, w: Tensor) -> Tensor:
        return x * w.unsqueeze(-1)

    @staticmethod
    def setup_context(ctx: Any, inputs: tuple[Tensor, Tensor], output: Tensor) -> None:
        x, w = inputs
        ctx.save_for_backward(x, w)

    @staticmethod
    def backward(ctx: Any, grad_output: Tensor) -> tuple[Tensor, Tensor]:
        x, w = ctx.saved_tensors
        return grad_output * w.unsqueeze(-1), (grad_output * x).sum(-1)


class SumDim(torch.autograd.Function):
    """``x.sum(dim, keepdim)`` with ``dim`` and ``keepdim`` having defaults (pass them as kwargs)."""

    @staticmethod
    def forward(ctx: Any, x: Tensor, dim: int = -1, keepdim: bool = False) -> Tensor:
        ctx.input_shape = x.shape
        ctx.dim = dim
        ctx.keepdim = keepdim
        return x.sum(dim=dim, keepdim=keepdim)

    @staticmethod
    def backward(ctx: Any, grad_output: Tensor) -> tuple[Tensor, None, None]:
        grad = grad_output if ctx.keepdim else grad_output.unsqueeze(ctx.dim)
        return grad.expand(ctx.input_shape), None, None
