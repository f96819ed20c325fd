"""Sparse inputs (``layout: sparse_coo | sparse_csr``): their specified elements, the sparse tensor, and
the dense variable the checks perturb and differentiate in its place.

The checks see a sparse input as a dense tensor of its shape (so rows name elements by their dense index,
``x[2, 5]``), which reaches the target as the sparse tensor ``Sparsify`` makes of it. With masked
semantics (torch's ``masked=True``) only the specified elements go into it: the others are no variables,
their finite differences are zero, and a gradient there fails unless it is zero (within the tolerance).
Without (``masked: false``, torch's ``masked=False``), every element is a variable: an unspecified one
that a perturbation moves off zero is specified in that call, as torch's finite differences specify every
element."""

from __future__ import annotations

import warnings
from typing import Any, Callable, Optional

import torch

from ..spec import Sparse

LAYOUTS = {"sparse_coo": torch.sparse_coo, "sparse_csr": torch.sparse_csr}


def pattern(
    sparse: Sparse, shape: tuple[int, ...], gen: torch.Generator, nonzero: Optional[torch.Tensor] = None
) -> torch.Tensor:
    """The specified elements of a tensor of ``shape`` as a boolean mask: the spec's ``indices``, or a
    ``density`` fraction of the elements (at least one) drawn from ``gen``, or the elements that are
    ``nonzero`` (literal data). IndexError names an index outside ``shape``."""
    mask = torch.zeros(shape, dtype=torch.bool)
    if sparse.indices is not None:
        for index in sparse.indices:
            if len(index) != len(shape) or any(i >= s for i, s in zip(index, shape)):
                raise IndexError(f"{list(index)} is outside shape {list(shape)}")
            mask[index] = True
    elif sparse.density is not None:
        n = mask.numel()
        k = min(n, max(1, round(sparse.density * n)))
        mask.view(-1)[torch.randperm(n, generator=gen)[:k]] = True
    elif nonzero is not None:
        mask = nonzero.detach().cpu() != 0
    return mask


def make(dense: torch.Tensor, mask: torch.Tensor, layout: str) -> torch.Tensor:
    """The sparse tensor (``layout``) whose specified elements are ``dense``'s where ``mask`` is set
    (differentiable in ``dense``: the gradient of an element outside ``mask`` is zero)."""
    where = mask.to(dense.device)
    index = where.nonzero().t()
    coo = torch.sparse_coo_tensor(index, dense[where], tuple(dense.shape), is_coalesced=True, check_invariants=False)
    if layout == "sparse_coo":
        return coo
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", "Sparse CSR tensor support is in beta")
        return coo.to_sparse_csr()


def specified(t: torch.Tensor) -> torch.Tensor:
    """The mask of ``t``'s specified elements (``t`` sparse COO or CSR)."""
    coo = t.detach().to_sparse_coo().coalesce()
    mask = torch.zeros(tuple(t.shape), dtype=torch.bool, device=t.device)
    mask[tuple(coo.indices())] = True
    return mask


class Sparsify(torch.autograd.Function):
    """Dense variable -> the sparse input the target gets. Backward hands on the gradient the target's
    backward returned for its sparse input, densified, wherever its elements are: a gradient outside the
    specified elements reaches the comparison (which, with masked semantics, expects zero there)."""

    @staticmethod
    def forward(ctx: Any, dense: torch.Tensor, mask: torch.Tensor, layout: str, masked: bool) -> torch.Tensor:
        ctx.shape = dense.shape
        # without masked semantics every element is a variable: one a perturbation moved off zero is specified
        keep = mask.to(dense.device) if masked else mask.to(dense.device) | (dense != 0)
        return make(dense.detach(), keep, layout)

    @staticmethod
    def backward(ctx: Any, grad: torch.Tensor) -> tuple[torch.Tensor, None, None, None]:
        return (grad.to_dense() if grad.layout is not torch.strided else grad), None, None, None


def transform(mask: torch.Tensor, layout: str, masked: bool) -> Callable[[Any], Any]:
    """The map from the checks' dense variable to the sparse input of ``layout`` with ``mask``'s elements."""

    def to_sparse(value: Any) -> Any:
        if not isinstance(value, torch.Tensor) or value.layout is not torch.strided:
            return value
        return Sparsify.apply(value, mask, layout, masked)

    return to_sparse


MASKED = "only they are variables"  # the end of a masked sparse input's row's `via`


def described(mask: torch.Tensor, layout: str, masked: bool) -> str:
    """What a sparse input's row says it is checked through."""
    semantics = MASKED if masked else "every element is a variable (masked: false)"
    return f"{layout}, {int(mask.sum())} of {mask.numel()} elements specified; {semantics}"


def outside(name: str, via: Optional[str]) -> str:
    """What to add where backward gives argument ``name`` a gradient the outputs do not depend on: for a
    sparse input with masked semantics (its row's ``via``), that those elements are its unspecified ones."""
    if not (via and via.endswith(MASKED)):
        return ""
    return (
        f"; '{name}' is sparse with masked semantics: its unspecified elements are no variables, so their "
        "gradient must be zero: return it at the specified elements only (e.g. grad.sparse_mask(x)), or write "
        "`masked: false` if every element is a variable (as for torch.mm)"
    )
