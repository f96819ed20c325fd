"""Tensors as flat real vectors, and small helpers that every numerical module shares.

Complex tensors are handled as pairs of reals ("realified"): a complex element is (re, im).
Pure torch, no I/O.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, Callable, TypeVar

import torch

from . import engine

Call = Callable[[Sequence[Any]], tuple[Any, ...]]
Vjp = Callable[..., tuple[Any, ...]]  # signature of torch.autograd.grad
Flat = TypeVar("Flat", int, torch.Tensor)  # one flat position, or a tensor of them


def vjp(
    outputs: Sequence[torch.Tensor], inputs: Sequence[torch.Tensor], grad_outputs: Sequence[torch.Tensor]
) -> tuple[Any, ...]:
    """Vector-Jacobian product through the graph (kept for more calls); None for unused inputs.
    Values only: a gradient that requires grad (backward computed it with grad mode on, or returned
    a parameter) is detached, as the tool only reads it."""
    grads: tuple[Any, ...] = engine.grad(outputs, inputs, grad_outputs, retain_graph=True, allow_unused=True)
    return tuple(strided(g.detach()) if isinstance(g, torch.Tensor) else g for g in grads)


def strided(t: torch.Tensor) -> torch.Tensor:
    """A sparse tensor (a gradient that nn.Embedding(sparse=True)-style backwards return, which autograd
    accepts for a dense input) as its dense values; any other as it is."""
    return t if t.layout == torch.strided else t.to_dense()


def as_tuple(out: Any) -> tuple[Any, ...]:
    """A forward's return value as a tuple of outputs."""
    return tuple(out) if isinstance(out, (tuple, list)) else (out,)


def is_float_tensor(value: Any) -> bool:
    """Whether ``value`` is a floating-point or complex tensor (one that can carry a gradient)."""
    return isinstance(value, torch.Tensor) and (value.is_floating_point() or value.is_complex())


def real_view(t: torch.Tensor) -> torch.Tensor:
    """``t`` as real numbers: complex elements as (re, im) pairs, a view of ``t``, except for a
    lazily conjugated tensor (``z.conj()``, as a correct complex backward returns), which has no
    real view and is resolved into a copy first."""
    return torch.view_as_real(t.resolve_conj()) if t.is_complex() else t


def real_flat(t: torch.Tensor) -> torch.Tensor:
    """A flat real view of contiguous ``t`` (no copy, unless ``t`` is lazily conjugated: see ``real_view``)."""
    return real_view(t).view(-1)


def unravel(flat: Flat, shape: Sequence[int]) -> list[Flat]:
    """The multi-index of flat (row-major) position ``flat`` in ``shape``; of every position at once
    for a tensor of them (as ``torch.unravel_index``, whose argument checks import sympy, a third of
    a second, on a process's first call)."""
    index = []
    for size in reversed(shape):
        index.append(flat % size)
        flat = flat // size
    return index[::-1]


def element_ref(t: torch.Tensor) -> Callable[[int], tuple[torch.Tensor, Any]]:
    """For in-place perturbation: real element j of ``t`` (any strides) as (tensor, index)."""
    real = torch.view_as_real(t) if t.is_complex() else t
    if real.is_contiguous():
        flat = real.view(-1)
        return lambda j: (flat, j)
    return lambda j: (real, tuple(unravel(j, real.shape)))


def real_numel(t: torch.Tensor) -> int:
    """The number of real elements of ``t``: two per complex element."""
    return t.numel() * (2 if t.is_complex() else 1)


def outputs_vector(outputs: tuple[Any, ...], positions: Sequence[int], copy: bool = True) -> torch.Tensor:
    """The realified, flattened, float64 concatenation of the chosen outputs: a copy, or, with
    ``copy=False``, a view of the output where there is only one and it is float64."""
    if not positions:
        return torch.zeros(0, dtype=torch.float64)
    parts = [real_view(o.detach()).reshape(-1).to(torch.float64) for o in (outputs[p] for p in positions)]
    return parts[0] if len(parts) == 1 and not copy else torch.cat(parts)
