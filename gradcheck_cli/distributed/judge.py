"""The coordinator's verdict: each rank's gradient of each argument against its part of the numerical
gradient of the global objective, one row per argument and rank (``x@rank1``), and what the ranks'
gradients show together: a factor of world_size (an all-reduce too many, or a missing division), partial
gradients (a missing all-reduce), only the rank's own slice of a gradient every rank needs whole (a missing
all-gather), another slice than the rank's (a split along the wrong dim)."""

from __future__ import annotations

import copy
from typing import Optional

import torch

from ..checks.parts.argument_rows import agreement, fill
from ..checks.parts.diagnosis import diagnose
from ..core.tolerance import Limits, within
from ..results import InputReport, Pattern
from .placements import Placement


def rows(
    template: InputReport, grads: list[torch.Tensor], wanted: list[torch.Tensor], limits: Limits
) -> list[InputReport]:
    """One row per rank for the argument of ``template``: rank r's gradient ``grads[r]`` against ``wanted[r]``."""
    out = []
    for r, (a, n) in enumerate(zip(grads, wanted)):
        row = copy.copy(template)
        row.name, row.shape, row.numel = f"{template.name}@rank{r}", list(a.shape), a.numel()
        entry = agreement(a.unsqueeze(0), n.unsqueeze(0), limits)
        fill(row, entry, a, lambda _: None)
        if row.numel:
            diagnose(row, entry, tuple(a.shape))
        out.append(row)
    return out


def across_ranks(
    name: str,
    placement: Placement,
    grads: list[torch.Tensor],
    wanted: list[torch.Tensor],
    full: torch.Tensor,
    ranked: list[InputReport],
    limits: Limits,
) -> Optional[str]:
    """What the ranks' gradients of argument ``name`` show together, in words (None: nothing beyond each
    row's own diagnosis); the failing rows take it as their diagnosis. ``full``: the argument's whole
    numerical gradient (a shard(d) argument's global one)."""
    failing = [row for row in ranked if row.mismatched]
    if not failing:
        return None
    size = len(grads)
    said: Optional[str] = None
    if size > 1 and all(row.mismatched and row.pattern is Pattern.CONSTANT_RATIO and row.ratio for row in ranked):
        ratios = [row.ratio or 0.0 for row in ranked]
        if all(abs(r - size) <= 1e-2 * size for r in ratios):
            said = (
                f"every rank's gradient of '{name}' is {size:.2f}x the numerical one (world_size {size}): "
                "an all-reduce too many, or a missing division by world_size?"
            )
    if said is None and placement.kind == "replicate" and size > 1:
        dim = _own_slices(grads, full, size, limits)
        if dim is not None:
            said = (
                f"each rank's gradient of '{name}' holds only its own slice along dim {dim} (zeros elsewhere), but "
                f"'{name}' is replicate: every rank needs the whole gradient (a missing all-gather in backward?)"
            )
        elif bool(within(torch.stack(grads).sum(0), full, limits.atol, limits.rtol).all()):
            said = (
                f"the ranks' gradients of '{name}' are partial: they add up to the numerical gradient, which "
                "every rank should hold (a missing all-reduce in backward?)"
            )
    if said is None and placement.kind == "shard":
        found = [
            (r, _slice_of(a, full, size, limits)) for r, (row, a) in enumerate(zip(ranked, grads)) if row.mismatched
        ]
        named = [(r, where) for r, where in found if where is not None]
        if named and len(named) == len(failing):
            dims = {d for _, (_, d, _) in named}
            if all(s == r for r, (s, _, _) in named) and len(dims) == 1:
                d = dims.pop()
                said = (
                    f"each rank's gradient of '{name}' is its slice of the gradient along dim {d}"
                    f"{' (reshaped)' if any(shaped for _, (_, _, shaped) in named) else ''}, not along dim "
                    f"{placement.dim} ({placement}): a split or gather along the wrong dim?"
                )
            else:
                said = (
                    "; ".join(
                        f"'{name}@rank{r}' is rank {s}'s slice of the gradient along dim {d}"
                        f"{' (reshaped)' if shaped else ''}, not rank {r}'s along dim {placement.dim}"
                        for r, (s, d, shaped) in named
                    )
                    + ": a split or gather along the wrong dim, or the ranks' chunks in the wrong order?"
                )
    if said is not None:
        for row in failing:
            row.diagnosis = said
    return said


def _own_slices(grads: list[torch.Tensor], full: torch.Tensor, size: int, limits: Limits) -> Optional[int]:
    """The dim d along which each rank's gradient is the whole gradient's chunk r, with zeros elsewhere."""
    for d in range(full.dim()):
        if full.shape[d] % size:
            continue
        fits = True
        for r, a in enumerate(grads):
            want = torch.zeros_like(full)
            want.narrow(d, r * (full.shape[d] // size), full.shape[d] // size).copy_(full.chunk(size, d)[r])
            if not bool(within(a, want, limits.atol, limits.rtol).all()):
                fits = False
                break
        if fits:
            return d
    return None


def _slice_of(a: torch.Tensor, full: torch.Tensor, size: int, limits: Limits) -> Optional[tuple[int, int, bool]]:
    """Which slice of the global gradient ``full`` a rank's gradient ``a`` is: (rank s, dim d, reshaped) for
    the chunk s along dim d of ``full`` (of ``a``'s size, reshaped to ``a``'s shape where it differs)."""
    for d in range(full.dim()):
        if full.shape[d] % size:
            continue
        for s, chunk in enumerate(full.chunk(size, d)):
            if chunk.numel() == a.numel() and bool(within(a, chunk.reshape(a.shape), limits.atol, limits.rtol).all()):
                return s, d, chunk.shape != a.shape
    return None
