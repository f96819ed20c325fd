"""Max-pooling Functions: one with a non-differentiable int64 output, one built on max_pool1d."""

from __future__ import annotations

from typing import Any, Optional

import torch
import torch.nn.functional as F
from torch import Tensor


class GlobalMaxPool(torch.autograd.Function):
    """Max over the last dim; returns ``(values, indices)`` with int64 ``indices``."""

    @staticmethod
    def forward(ctx: Any, x: Tensor) -> tuple[Tensor, Tensor]:
        values, indices = x.max(dim=-1)
        ctx.save_for_backward(indices)
        ctx.input_shape = x.shape
        ctx.mark_non_differentiable(indices)
        return values, indices

    @staticmethod
    def backward(ctx: Any, grad_values: Tensor, grad_indices: Optional[Tensor]) -> Tensor:
        (indices,) = ctx.saved_tensors
        grad_x = grad_values.new_zeros(ctx.input_shape)
        grad_x.scatter_(-1, indices.unsqueeze(-1), grad_values.unsqueeze(-1))
        return grad_x


class SquareMaxPool1d(torch.autograd.Function):
    """``max_pool1d(x ** 2, kernel_size=2)`` over the last dim of an ``(N, C, L)`` input."""

    @staticmethod
    def forward(ctx: Any, x: Tensor) -> Tensor:
        pooled, indices = F.max_pool1d(x * x, kernel_size=2, return_indices=True)
        ctx.save_for_backward(x, indices)
        return pooled

    @staticmethod
    def backward(ctx: Any, grad_output: Tensor) -> Tensor:
        x, indices = ctx.saved_tensors
        # indices are positions along the last dim of the (squared) input. The buffer is made
        # from grad_output, not x: under vmap (batched gradients) grad_output carries the batch
        # dimension, and an in-place scatter into a tensor without it would fail.
        grad_square = grad_output.new_zeros(x.shape).scatter_add_(-1, indices, grad_output)
        return grad_square * 2 * x
