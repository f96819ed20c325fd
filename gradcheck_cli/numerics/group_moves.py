"""The moves of a group of compressed finite differences (see ``compressed``): its elements moved at once,
by +-eps each or by +-eps times random weights, and the steps those moves really take. Pure torch."""
from __future__ import annotations

import torch

from .realify import real_view, unravel

LOW = 1.25  # weights' magnitudes are uniform in [LOW, 2): w^2 - 1 >= LOW^2 - 1 (the curvature test divides by it)


def weights(n: int, gen: torch.Generator) -> torch.Tensor:
    """One weighting, a weight per column: magnitude uniform in [LOW, 2), random sign, independent."""
    sign = torch.randint(0, 2, (n,), generator=gen, dtype=torch.float64).mul_(2).sub_(1)
    return torch.rand(n, dtype=torch.float64, generator=gen).mul_(2 - LOW).add_(LOW).mul_(sign)


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
