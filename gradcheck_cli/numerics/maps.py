"""Where an argument's mismatches are: its first mismatching multi-indices, and a small 2-D map of its
per-element error (pictures of the error). Pure torch."""

from __future__ import annotations

import math
from collections.abc import Sequence

import torch

from .realify import unravel


def per_element(values: torch.Tensor, is_complex: bool) -> torch.Tensor:
    """A per-real-column vector as one value per element: a complex element's two parts by their max
    (a bool mask: either part)."""
    if not is_complex:
        return values
    pairs = values.view(-1, 2)
    return pairs.any(1) if values.dtype == torch.bool else pairs.amax(1)


def first_indices(mask: torch.Tensor, shape: Sequence[int], cap: int) -> list[list[int]]:
    """The multi-indices (into ``shape``) of the first ``cap`` true elements of the flat ``mask``, in
    row-major order."""
    flat = mask.reshape(-1).nonzero().view(-1)[:cap].tolist()
    return [unravel(k, shape) for k in flat]


def view_2d(shape: Sequence[int]) -> tuple[int, int]:
    """The 2-D view of an argument: its last dim across, the others flattened down (a 0-d one is 1 x 1)."""
    if not shape:
        return 1, 1
    return math.prod(shape[:-1]), shape[-1]


def downsample(
    values: torch.Tensor, shape: Sequence[int], cells: int, side: int = 256
) -> tuple[torch.Tensor, tuple[int, int]]:
    """``values`` (one per element of ``shape``) as its 2-D view, each cell the max over a block of
    elements (``blocks``), and the block's (height, width)."""
    rows, cols = view_2d(shape)
    bh, bw = blocks(rows, cols, cells, side)
    return pooled(values.detach().to("cpu", torch.float64).reshape(rows, cols), bh, bw), (bh, bw)


def blocks(rows: int, cols: int, cells: int, side: int = 256) -> tuple[int, int]:
    """The block (height, width) one cell of a ``rows`` x ``cols`` map stands for: at most ``cells`` cells and,
    unless it is one row (a 1-d argument, drawn wrapped), ``side`` cells a side. Blocks grow by halving the
    longer side, so a long thin argument stays long and thin."""
    bh = bw = 1
    while math.ceil(rows / bh) * math.ceil(cols / bw) > cells or (
        rows > 1 and max(math.ceil(rows / bh), math.ceil(cols / bw)) > side
    ):
        if math.ceil(rows / bh) >= math.ceil(cols / bw):
            bh *= 2
        else:
            bw *= 2
    return bh, bw


def pooled(grid: torch.Tensor, bh: int, bw: int) -> torch.Tensor:
    """The max of ``grid`` (2-D, float64) over each block of ``bh`` x ``bw``, on its device; partial blocks at
    the edges take the max of what they hold."""
    if (bh, bw) == (1, 1):
        return grid
    rows, cols = grid.shape
    h, w = math.ceil(rows / bh), math.ceil(cols / bw)
    if (h * bh, w * bw) != (rows, cols):
        padded = torch.full((h * bh, w * bw), -math.inf, dtype=grid.dtype, device=grid.device)
        padded[:rows, :cols] = grid
        grid = padded
    return grid.view(h, bh, w, bw).amax(dim=(1, 3))
