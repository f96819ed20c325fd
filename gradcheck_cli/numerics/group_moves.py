"""The moves of a group of compressed finite differences (see ``compressed``): its elements moved at once,
by +-eps each or by +-eps times weights (spread within each group, or random), and the steps those moves
really take. Pure torch and NumPy."""

from __future__ import annotations

import math

import numpy as np
import torch

from .realify import real_view, unravel

LOW = 1.25  # weights' magnitudes are uniform in [LOW, 2): w^2 - 1 >= LOW^2 - 1 (the curvature test divides by it)
SPAN = 2.0  # a spread weighting's magnitudes are log-spaced on [1, SPAN]


def weights(n: int, gen: torch.Generator) -> torch.Tensor:
    """One weighting, a weight per column: magnitude uniform in [LOW, 2), random sign, independent."""
    sign = torch.randint(0, 2, (n,), generator=gen, dtype=torch.float64).mul_(2).sub_(1)
    return torch.rand(n, dtype=torch.float64, generator=gen).mul_(2 - LOW).add_(LOW).mul_(sign)


def separation(size: int) -> float:
    """The least |w_k / w_j - 1| between two columns of one group of ``size`` under ``spread``: the P = ceil(size / 2)
    columns of one sign take magnitudes SPAN^(i / (P - 1)), i < P, so two of one sign are a factor of at least
    SPAN^(1 / (P - 1)) apart (|w_k / w_j - 1| >= 1 - SPAN^(-1 / (P - 1)), the smaller way round), and two of
    opposite signs have w_k / w_j <= -1 / SPAN (|w_k / w_j - 1| >= 1 + 1 / SPAN); inf for one column."""
    if size < 2:
        return math.inf
    p = (size + 1) // 2
    return 1 + 1 / SPAN if p < 2 else 1 - SPAN ** (-1 / (p - 1))


def widest(d: float) -> int:
    """The largest group size whose ``separation`` exceeds ``d`` (1 where none of two does; 2^62 for d <= 0)."""
    if not d < separation(2):  # NaN too
        return 1
    if not d < separation(3):
        return 2
    if d <= 0:
        return 2**62
    p = max(2, math.floor(math.log(SPAN) / -math.log1p(-d)) + 1)  # about the last P with separation > d
    while p > 2 and not separation(2 * p) > d:
        p -= 1
    while separation(2 * p + 2) > d:
        p += 1
    return 2 * p


def spread(colours: torch.Tensor, n_groups: int, gen: torch.Generator) -> torch.Tensor:
    """One weighting, a weight per column, no two columns of a group closer than ``separation`` of its size: in
    each group (``colours``: a group per column) ceil(G / 2) slots of magnitude SPAN^(i / (P - 1)) with sign +
    and the others the first magnitudes with sign -, taken by its columns in a random order."""
    n = len(colours)
    col = colours.numpy()
    key = torch.rand(n, dtype=torch.float64, generator=gen).numpy()
    order = np.lexsort((key, col))  # by group, in a random order within each
    sizes = np.bincount(col, minlength=n_groups)
    starts = np.cumsum(sizes) - sizes
    rank = np.empty(n, dtype=np.int64)
    rank[order] = np.arange(n) - starts[col[order]]  # each column's slot in its group
    p = (sizes[col] + 1) // 2
    negative = rank >= p
    magnitude = SPAN ** (np.where(negative, rank - p, rank) / np.maximum(p - 1, 1))
    return torch.from_numpy(np.where(negative, -magnitude, magnitude).astype(np.float64))


def step_factors(x0: torch.Tensor, dtype: torch.dtype, eps: float, w: torch.Tensor | None) -> torch.Tensor:
    """Per column of one argument, 2 eps over the step its move really takes: (x0 + eps w) - (x0 - eps w),
    each rounded to the argument's (real) ``dtype`` as ``GroupMove`` rounds it (``x0``: its float64 values;
    ``w``: None for the unit move). A quotient times this is (f(x+) - f(x-)) / step, the derivative
    (plus w_k / w_j times what another element of the group adds there), with the rounding of the
    argument's moves taken out; inf where the step rounds to nothing."""
    s = torch.full_like(x0, eps) if w is None else w * eps
    plus, minus = (x0 + s).to(dtype).to(torch.float64), (x0 - s).to(dtype).to(torch.float64)
    return (2 * eps) / (plus - minus)


class GroupMove:
    """Real elements of several arguments moved at once, each to x0 + offset w (``to``), and put back
    bit-exactly: the finite-difference move of a group (see ``differences.Element``, whose rounding
    it keeps: x0 + offset w in float64, rounded once to the argument's dtype)."""

    def __init__(self, parts: list[tuple[torch.Tensor, torch.Tensor, torch.Tensor]]) -> None:
        self.parts = []
        for x, index, weights in parts:  # (argument, real indices within it, weights)
            real = real_view(x)
            at = (real.view(-1), (index,)) if real.is_contiguous() else (real, tuple(unravel(index, real.shape)))
            orig = at[0][at[1]].clone()
            self.parts.append((at[0], at[1], orig, orig.to(torch.float64), weights))
        self.offset = 0.0

    def to(self, offset: float) -> GroupMove:
        self.offset = offset
        return self

    def apply(self) -> None:
        for base, index, _, x0, weights in self.parts:
            base[index] = (x0 + self.offset * weights).to(base.dtype)

    def restore(self) -> None:
        for base, index, orig, _, _ in self.parts:
            base[index] = orig
