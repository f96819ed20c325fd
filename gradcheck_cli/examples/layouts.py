"""Functions whose backward depends on how a tensor is laid out in memory (for the ``noncontiguous`` check):
one right for every layout, and two right only for contiguous tensors, as hand-written backwards often are."""

from __future__ import annotations

from typing import Any

import torch
from torch import Tensor


class RowScale(torch.autograd.Function):
    """``x * s[:, None]`` for a matrix ``x`` and a vector ``s``; backward reshapes, which works for any layout."""

    @staticmethod
    def forward(ctx: Any, x: Tensor, s: Tensor) -> Tensor:
        ctx.save_for_backward(x, s)
        return x * s[:, None]

    @staticmethod
    def backward(ctx: Any, grad: Tensor) -> tuple[Tensor, Tensor]:
        x, s = ctx.saved_tensors
        flat = (grad * x).reshape(x.shape[0], -1)  # reshape: a copy where a view is impossible
        return grad * s[:, None], flat.sum(1)


class RowScaleView(RowScale):
    """Backward calls ``.view`` on the incoming gradient: it raises for a transposed grad_output."""

    @staticmethod
    def backward(ctx: Any, grad: Tensor) -> tuple[Tensor, Tensor]:
        x, s = ctx.saved_tensors
        flat = grad.view(-1).view(x.shape) * x  # BUG: .view needs a contiguous grad_output
        return grad * s[:, None], flat.sum(1)


class RowScaleRawStorage(RowScale):
    """Backward reads the gradient's storage as if it were contiguous, as a kernel that takes a data
    pointer without checking the strides does: the values come out permuted for a transposed one."""

    @staticmethod
    def backward(ctx: Any, grad: Tensor) -> tuple[Tensor, Tensor]:
        x, s = ctx.saved_tensors
        raw = grad.as_strided(grad.shape, torch.empty(grad.shape).stride())  # BUG: assumes contiguous strides
        return raw * s[:, None], (raw * x).sum(1)
