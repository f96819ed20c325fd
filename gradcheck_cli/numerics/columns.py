"""The numerical side: columns (f(x + eps e_j) - f(x - eps e_j)) / 2 eps of the Jacobian.

Columns are built transposed (C x M: a row per real input element), like the analytical rows.
A column is two forward calls with one real element of an argument moved in place, as
torch.autograd.gradcheck makes it, or, where vmap gives the same numbers, a stage of columns is
one forward over a batch of perturbed arguments (``torch.func.vmap`` over the target, or over a
Function's forward body when it declares no vmap support). The first batched stage is compared
with single calls on a few columns; any difference or error turns batching off for the rest of the
check. Pure torch.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import torch

from .batching import Batches, column_stages, copies, same, try_batched, vmapped
from .differences import difference_into, elements
from .jacobian_layout import Layout
from .realify import Call


class Columns:
    """Numerical columns of one check's Jacobian, by calls of ``call`` on ``values`` (moved in
    place and restored), batching decided once. ``batched``: the same forward in a form
    torch.func.vmap may batch (None: none may be)."""

    def __init__(
        self, call: Call, values: list[Any], layout: Layout, eps: float, batched: Call | None, memory_bytes: int
    ) -> None:
        self.call, self.values, self.layout, self.eps = call, values, layout, eps
        self.memory_bytes = memory_bytes  # a stage of columns holds at most its share (see ``batching``)
        self.batched = batched  # the forward that vmap batches (None: none may be)
        self.segments = layout.segments()
        self.batched_cols: bool | None = None if batched else False

    def columns(self, col0: int, col1: int) -> torch.Tensor:
        """Central differences for columns col0..col1, transposed (C x M) like ``rows``. The checked
        tensors in ``values`` are perturbed in place, one real element at a time, and restored."""
        cols = torch.empty(col1 - col0, self.layout.n_rows, dtype=torch.float64)
        c = 0
        with torch.no_grad():
            for stage in self._column_stages(col0, col1):
                n = sum(j1 - j0 for _, j0, j1 in stage)
                self._column_stage(stage, cols[c : c + n])
                c += n
        return cols.div_(2 * self.eps)

    def _column_stages(self, col0: int, col1: int) -> Iterator[list[tuple[int, int, int]]]:
        """Columns col0..col1 in stages (see ``batching.column_stages``)."""
        return column_stages(self.layout, col0, col1, self.memory_bytes)

    def _column_stage(self, stage: list[tuple[int, int, int]], out: torch.Tensor) -> None:
        """A stage of columns into ``out`` (not yet divided by 2 eps): batched, or two calls each."""
        tried = try_batched(
            self.batched_cols, lambda: self._batched_columns(stage, out), lambda cols: self._columns_agree(stage, cols)
        )
        batched, self.batched_cols = tried
        if batched is not None:
            return
        c = 0
        for i, j0, j1 in stage:
            self._single_columns(self.layout.inputs[i], j0, j1, out[c : c + j1 - j0])
            c += j1 - j0

    def _columns_agree(self, stage: list[tuple[int, int, int]], batched: torch.Tensor) -> bool:
        """A batched stage's columns are the single calls' columns: compared on its first, middle and last column."""
        spans = [(i, j) for i, j0, j1 in stage for j in range(j0, j1)]  # one per row of ``batched``
        picks = sorted({0, len(spans) // 2, len(spans) - 1})
        single = torch.empty(len(picks), batched.shape[1], dtype=batched.dtype)
        for r, p in enumerate(picks):
            i, j = spans[p]
            self._single_columns(self.layout.inputs[i], j, j + 1, single[r : r + 1])
        return same(batched[picks] / (2 * self.eps), single / (2 * self.eps))

    def _single_columns(self, x: torch.Tensor, j0: int, j1: int, out: torch.Tensor) -> None:
        """Columns j0..j1 of argument ``x`` into ``out`` (not yet divided by 2 eps), two calls each."""
        element = elements(x)
        for c, j in enumerate(range(j0, j1)):
            difference_into(out[c], self.call, self.values, element(j), self.eps, self.segments)

    def _batched_columns(self, stage: list[tuple[int, int, int]], out: torch.Tensor) -> torch.Tensor:
        """A stage of columns (not yet divided by 2 eps) into ``out``, from one vmapped forward:
        batch row c moves its argument's element by -eps, row n + c by +eps (n columns)."""
        assert self.batched is not None  # batched_cols is False without it
        n, eps = len(out), self.eps
        batches: Batches = {}
        c = 0
        for i, j0, j1 in stage:
            batch = copies(batches, self.layout.inputs[i], 2 * n)
            rows, cols = torch.arange(c, c + j1 - j0), torch.arange(j0, j1)
            batch[rows, cols] -= eps
            batch[rows + n, cols] += eps
            c += j1 - j0
        flat = vmapped(self.batched, self.values, batches, self.layout.outputs).to(out.device)  # columns: CPU
        return torch.sub(flat[n:], flat[:n], out=out)
