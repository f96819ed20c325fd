"""Functions of sparse inputs (``layout: sparse_coo | sparse_csr`` in a spec): correct ones under masked
semantics (only the specified elements are variables, as ``torch.sparse.mm``), one correct when every
element is a variable (``masked: false``, as ``torch.mm``), and the bugs hand-written sparse backwards have.
``specs/sparse.yaml`` checks the correct ones; ``broken-specs/sparse_*.yaml`` the broken ones."""

from __future__ import annotations

from typing import Any

import torch
from torch import Tensor


def _values_at(grad: Tensor, x: Tensor) -> Tensor:
    """``grad`` (dense) at ``x``'s specified elements, as a sparse tensor of ``x``'s layout."""
    coo = x.detach().to_sparse_coo().coalesce()
    picked = torch.sparse_coo_tensor(
        coo.indices(), grad[tuple(coo.indices())], x.shape, is_coalesced=True, check_invariants=False
    )
    return picked if x.layout is torch.sparse_coo else picked.to_sparse_csr()  # CSR: torch warns that it is beta


class SparseDenseMM(torch.autograd.Function):
    """``x @ w`` for a sparse ``x`` (COO or CSR) and a dense ``w``; x's gradient at its specified elements
    only (masked semantics, as ``torch.sparse.mm``)."""

    @staticmethod
    def forward(ctx: Any, x: Tensor, w: Tensor) -> Tensor:
        ctx.save_for_backward(x, w)
        return x.to_dense() @ w

    @staticmethod
    def backward(ctx: Any, grad: Tensor) -> tuple[Tensor, Tensor]:
        x, w = ctx.saved_tensors
        return _values_at(grad @ w.t(), x), x.to_dense().t() @ grad


class SparseDenseMMTransposed(SparseDenseMM):
    """x's gradient transposed (``(grad w^T)^T`` at the specified elements, for a square x)."""

    @staticmethod
    def backward(ctx: Any, grad: Tensor) -> tuple[Tensor, Tensor]:
        x, w = ctx.saved_tensors
        return _values_at((grad @ w.t()).t(), x), x.to_dense().t() @ grad  # BUG: transposed


class SparseDenseMMDenseGrad(SparseDenseMM):
    """x's gradient dense: ``grad @ w^T`` at every element, also the unspecified ones. Right when every
    element is a variable (``masked: false``, as ``torch.mm``), wrong under masked semantics. Its backward
    densifies x with ``masked_grad=False``, so that its own derivative is that of every element too."""

    @staticmethod
    def backward(ctx: Any, grad: Tensor) -> tuple[Tensor, Tensor]:
        x, w = ctx.saved_tensors
        return grad @ w.t(), x.to_dense(masked_grad=False).t() @ grad


class SparseSum(torch.autograd.Function):
    """The sum of a sparse tensor's specified values, per row (``torch.sparse.sum(x, 1)``, dense)."""

    @staticmethod
    def forward(ctx: Any, x: Tensor) -> Tensor:
        ctx.save_for_backward(x)
        return x.to_dense().sum(1)

    @staticmethod
    def backward(ctx: Any, grad: Tensor) -> Tensor:
        (x,) = ctx.saved_tensors
        return _values_at(grad[:, None].expand(x.shape), x)


class SparseSumScaled(SparseSum):
    """The gradient twice too large."""

    @staticmethod
    def backward(ctx: Any, grad: Tensor) -> Tensor:
        (x,) = ctx.saved_tensors
        return _values_at(2 * grad[:, None].expand(x.shape), x)  # BUG: 2x


class SparseSquare(torch.autograd.Function):
    """Each row's sum of the squares of the specified values (a CSR op's gradient depends on the values)."""

    @staticmethod
    def forward(ctx: Any, x: Tensor) -> Tensor:
        ctx.save_for_backward(x)
        return (x.to_dense() ** 2).sum(1)

    @staticmethod
    def backward(ctx: Any, grad: Tensor) -> Tensor:
        (x,) = ctx.saved_tensors
        return _values_at(2 * grad[:, None] * x.to_dense(), x)


class SparseSquareNoFactor(SparseSquare):
    """The factor 2 of the square's derivative forgotten."""

    @staticmethod
    def backward(ctx: Any, grad: Tensor) -> Tensor:
        (x,) = ctx.saved_tensors
        return _values_at(grad[:, None] * x.to_dense(), x)  # BUG: d(v^2)/dv = 2v
