"""Functions whose inputs live on a set, or are containers or callables: a Cholesky factor of an
SPD matrix, interpolation on sorted knots, entropy on the probability simplex, rows gathered by
indices bounded by another argument's size; a checkpoint that takes the function it recomputes."""

from __future__ import annotations

from typing import Any, Callable

import torch
from torch import Tensor


def _phi(x: Tensor) -> Tensor:
    """The lower triangle with the diagonal halved."""
    return x.tril() - 0.5 * torch.diag_embed(torch.diagonal(x, dim1=-2, dim2=-1))


class Cholesky(torch.autograd.Function):
    """``L = cholesky(A)`` of a symmetric positive-definite A. Only A's lower triangle is read, so the
    gradient means something on symmetric A only: its symmetric part (Murray 2016)."""

    @staticmethod
    def forward(ctx: Any, a: Tensor) -> Tensor:
        chol = torch.linalg.cholesky(a)
        ctx.save_for_backward(chol)
        return chol

    @staticmethod
    def backward(ctx: Any, grad: Tensor) -> Tensor:
        (chol,) = ctx.saved_tensors
        p = _phi(chol.mT @ grad)
        s = torch.linalg.solve_triangular(
            chol.mT, torch.linalg.solve_triangular(chol.mT, p, upper=True, left=True).mT, upper=True, left=True
        ).mT  # L^-T P L^-1
        return 0.5 * (s + s.mT)


class CholeskyNoHalf(Cholesky):
    """Broken: the diagonal of L^T dL is not halved, so the diagonal of the gradient is off."""

    @staticmethod
    def backward(ctx: Any, grad: Tensor) -> Tensor:
        (chol,) = ctx.saved_tensors
        p = (chol.mT @ grad).tril()
        s = torch.linalg.solve_triangular(
            chol.mT, torch.linalg.solve_triangular(chol.mT, p, upper=True, left=True).mT, upper=True, left=True
        ).mT
        return 0.5 * (s + s.mT)


def spd_of(x: Tensor) -> Tensor:
    """A parametrisation of SPD matrices by any square X: X X^T + I (for `param:`)."""
    return x @ x.mT + torch.eye(x.shape[-1], dtype=x.dtype, device=x.device)


class Interp(torch.autograd.Function):
    """Piecewise linear interpolation of ``values`` given at increasing ``knots``, at points ``x``
    (linear extrapolation outside). Meaningful only for sorted knots."""

    @staticmethod
    def forward(ctx: Any, x: Tensor, knots: Tensor, values: Tensor) -> Tensor:
        idx = torch.searchsorted(knots, x.detach()).clamp(1, knots.numel() - 1)
        x0, x1 = knots[idx - 1], knots[idx]
        w = (x - x0) / (x1 - x0)
        ctx.save_for_backward(idx, w, x1 - x0, values)
        return values[idx - 1] * (1 - w) + values[idx] * w

    @staticmethod
    def backward(ctx: Any, grad: Tensor) -> tuple[Tensor, None, Tensor]:
        idx, w, width, values = ctx.saved_tensors
        grad_x = grad * (values[idx] - values[idx - 1]) / width
        grad_values = torch.zeros_like(values)
        grad_values.index_add_(0, (idx - 1).flatten(), (grad * (1 - w)).flatten())
        grad_values.index_add_(0, idx.flatten(), (grad * w).flatten())
        return grad_x, None, grad_values


class Entropy(torch.autograd.Function):
    """``-sum(p log p)`` along the last dimension of probability rows ``p``."""

    @staticmethod
    def forward(ctx: Any, p: Tensor) -> Tensor:
        ctx.save_for_backward(p)
        return -(p * p.log()).sum(-1)

    @staticmethod
    def backward(ctx: Any, grad: Tensor) -> Tensor:
        (p,) = ctx.saved_tensors
        return -grad.unsqueeze(-1) * (p.log() + 1)


class Gather(torch.autograd.Function):
    """``x[index]``: rows of ``x`` picked by integer ``index`` (repeats allowed)."""

    @staticmethod
    def forward(ctx: Any, x: Tensor, index: Tensor) -> Tensor:
        ctx.save_for_backward(index)
        ctx.rows = x.shape[0]
        return x[index]

    @staticmethod
    def backward(ctx: Any, grad: Tensor) -> tuple[Tensor, None]:
        (index,) = ctx.saved_tensors
        out = grad.new_zeros((ctx.rows,) + grad.shape[1:])
        return out.index_add_(0, index, grad), None


class Checkpoint(torch.autograd.Function):
    """``run_function(x)`` without keeping its graph: backward runs it again (activation checkpointing)."""

    @staticmethod
    def forward(ctx: Any, run_function: Callable[[Tensor], Tensor], x: Tensor) -> Tensor:
        ctx.run_function = run_function
        ctx.save_for_backward(x)
        with torch.no_grad():
            return run_function(x)

    @staticmethod
    def backward(ctx: Any, grad: Tensor) -> tuple[None, Tensor]:
        (x,) = ctx.saved_tensors
        with torch.enable_grad():
            leaf = x.detach().requires_grad_()
            (grad_x,) = torch.autograd.grad(ctx.run_function(leaf), leaf, grad)
        return None, grad_x


class CheckpointStale(Checkpoint):
    """Broken: backward recomputes with the identity instead of ``run_function``."""

    @staticmethod
    def backward(ctx: Any, grad: Tensor) -> tuple[None, Tensor]:
        return None, grad
