"""Functions written to work under vmap and with undefined gradients (specs/vmap.yaml).

Each shows one way to pass the ``batched`` and ``undefined_grad`` checks: an old-style
Function whose backward is vmap-safe, ``generate_vmap_rule = True`` with ``setup_context``,
a hand-written ``vmap`` staticmethod, and a two-output Function that handles the None
gradients it gets after ``ctx.set_materialize_grads(False)``.
"""

from __future__ import annotations

from typing import Any, Optional

import torch
from torch import Tensor


class Softplus(torch.autograd.Function):
    """``log(1 + exp(x))``, old style (``forward(ctx, ...)``): no vmap over forward, but its
    backward is pure tensor arithmetic, so a batch of grad_outputs goes through it."""

    @staticmethod
    def forward(ctx: Any, x: Tensor) -> Tensor:
        ctx.save_for_backward(x)
        return torch.nn.functional.softplus(x)

    @staticmethod
    def backward(ctx: Any, grad_output: Tensor) -> Tensor:
        (x,) = ctx.saved_tensors
        return grad_output * torch.sigmoid(x)


class WeightedSum(torch.autograd.Function):
    """``(x * w).sum(-1)`` for ``x`` of shape ``(N, M)`` and ``w`` of shape ``(M,)``, with
    ``generate_vmap_rule = True``: torch.func.vmap batches forward and backward by itself."""

    generate_vmap_rule = True

    @staticmethod
    def forward(x: Tensor, w: Tensor) -> Tensor:
        return (x * w).sum(-1)

    @staticmethod
    def setup_context(ctx: Any, inputs: tuple[Tensor, Tensor], output: Tensor) -> None:
        ctx.save_for_backward(*inputs)

    @staticmethod
    def backward(ctx: Any, grad_output: Tensor) -> tuple[Tensor, Tensor]:
        x, w = ctx.saved_tensors
        g = grad_output.unsqueeze(-1)
        return g * w, (g * x).sum(0)


class Cube(torch.autograd.Function):
    """``x ** 3`` with a hand-written ``vmap`` staticmethod: forward is elementwise, so the
    batched call is forward on the batched tensor, with the batch dimension where it came in."""

    @staticmethod
    def forward(x: Tensor) -> Tensor:
        return x**3

    @staticmethod
    def setup_context(ctx: Any, inputs: tuple[Tensor], output: Tensor) -> None:
        ctx.save_for_backward(inputs[0])

    @staticmethod
    def backward(ctx: Any, grad_output: Tensor) -> Tensor:
        (x,) = ctx.saved_tensors
        return 3 * x**2 * grad_output

    @staticmethod
    def vmap(info: Any, in_dims: tuple[Optional[int]], x: Tensor) -> tuple[Tensor, Optional[int]]:
        return Cube.apply(x), in_dims[0]


class SinCos(torch.autograd.Function):
    """``(sin(x), cos(x))`` with ``ctx.set_materialize_grads(False)``: when the loss uses only
    one output, backward gets None for the other and skips its term."""

    @staticmethod
    def forward(ctx: Any, x: Tensor) -> tuple[Tensor, Tensor]:
        ctx.set_materialize_grads(False)
        ctx.save_for_backward(x)
        return torch.sin(x), torch.cos(x)

    @staticmethod
    def backward(ctx: Any, grad_sin: Optional[Tensor], grad_cos: Optional[Tensor]) -> Optional[Tensor]:
        (x,) = ctx.saved_tensors
        grad = None
        if grad_sin is not None:
            grad = grad_sin * torch.cos(x)
        if grad_cos is not None:
            term = -grad_cos * torch.sin(x)
            grad = term if grad is None else grad + term
        return grad
