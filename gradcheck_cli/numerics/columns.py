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

from typing import Any, Iterator, Optional

import torch

from .batching import Batches, column_stages, copies, quietly, same, vmapped
from .layout import Layout
from .realify import Call, as_tuple, element_ref


class Columns:
    """Numerical columns of one check's Jacobian, by calls of ``call`` on ``values`` (moved in
    place and restored), batching decided once. ``batched``: the same forward in a form
    torch.func.vmap may batch (None: none may be)."""

    def __init__(self, call: Call, values: list[Any], layout: Layout, eps: float, batched: Optional[Call]) -> None:
        self.call, self.values, self.layout, self.eps = call, values, layout, eps
        self.batched = batched  # the forward that vmap batches (None: none may be)
        self.segments = layout.segments()
        self.batched_cols: Optional[bool] = None if batched else False

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
        return column_stages(self.layout, col0, col1)

    def _column_stage(self, stage: list[tuple[int, int, int]], out: torch.Tensor) -> None:
        inputs = self.layout.inputs
        if self.batched_cols is not False:
            done = quietly(self._batched_columns, stage, out) is not None
            if done and self.batched_cols is None:
                spans = [(i, j) for i, j0, j1 in stage for j in range(j0, j1)]  # one per row of ``out``
                picks = sorted({0, len(spans) // 2, len(spans) - 1})
                single = torch.empty(len(picks), out.shape[1], dtype=out.dtype)
                for r, p in enumerate(picks):
                    i, j = spans[p]
                    self._single_columns(inputs[i], j, j + 1, single[r : r + 1])
                self.batched_cols = same(out[picks] / (2 * self.eps), single / (2 * self.eps))
            if not done:
                self.batched_cols = False
            elif self.batched_cols:
                return
        c = 0
        for i, j0, j1 in stage:
            self._single_columns(inputs[i], j0, j1, out[c : c + j1 - j0])
            c += j1 - j0

    def _single_columns(self, x: torch.Tensor, j0: int, j1: int, out: torch.Tensor) -> None:
        eps = self.eps
        real = torch.view_as_real(x) if x.is_complex() else x
        if real.device.type == "cpu" and real.is_contiguous() and real.dtype in (torch.float64, torch.float32):
            base, index = real.numpy().reshape(-1), (lambda j: j)  # a NumPy view: cheap element writes
        else:
            ref = element_ref(x)
            base, index = ref(0)[0], (lambda j: ref(j)[1])
        for c, j in enumerate(range(j0, j1)):
            at, row = index(j), out[c]
            orig = base[at].item()
            base[at] = orig - eps
            self._outputs_into(row, None)
            base[at] = orig + eps
            self._outputs_into(row, row)
            base[at] = orig

    def _outputs_into(self, row: torch.Tensor, minus: Optional[torch.Tensor]) -> None:
        """``row`` = the realified outputs of one forward, or, given ``minus``, those minus ``minus``
        (copied at once: an output may be a view of the input about to be perturbed again)."""
        outputs = as_tuple(self.call(self.values))
        for p, seg in self._segments(row):
            o = outputs[p]
            flat = (torch.view_as_real(o) if o.is_complex() else o).reshape(-1)  # no grad here: no detach
            if minus is None:
                seg.copy_(flat)
            else:
                torch.sub(flat, seg, out=seg)

    def _segments(self, row: torch.Tensor) -> list[tuple[int, torch.Tensor]]:
        """(output position, its slice of ``row``) for each compared output."""
        return [(p, row[lo:hi]) for p, lo, hi in self.segments]

    def _batched_columns(self, stage: list[tuple[int, int, int]], out: torch.Tensor) -> torch.Tensor:
        """A stage of columns (not yet divided by 2 eps) into ``out``, from one vmapped forward:
        batch row c moves its argument's element by -eps, row n + c by +eps (n columns)."""
        n, eps = len(out), self.eps
        batches: Batches = {}
        c = 0
        for i, j0, j1 in stage:
            batch = copies(batches, self.layout.inputs[i], 2 * n)
            rows, cols = torch.arange(c, c + j1 - j0), torch.arange(j0, j1)
            batch[rows, cols] -= eps
            batch[rows + n, cols] += eps
            c += j1 - j0
        flat = vmapped(self.batched, self.values, batches, self.layout.outputs)
        return torch.sub(flat[n:], flat[:n], out=out)
