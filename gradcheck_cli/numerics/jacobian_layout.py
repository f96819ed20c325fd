"""Where each checked argument's columns and each compared output's rows lie in the Jacobian.

The Jacobian is of the realified function (see ``realify``): a column per real element of the
checked arguments, a row per real element of the compared outputs. Pure torch.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch

from .realify import real_numel


@dataclass
class Layout:
    """Where each checked argument's columns and each differentiable output's rows lie."""

    inputs: list[torch.Tensor]  # the tensors whose gradients are checked, one per column block
    outputs: list[int]  # positions of the differentiable outputs
    col_starts: list[int]
    row_sizes: list[int]

    @property
    def n_cols(self) -> int:
        """Columns in all: real elements of the checked arguments."""
        return self.col_starts[-1]

    @property
    def n_rows(self) -> int:
        """Rows in all: real elements of the compared outputs."""
        return sum(self.row_sizes)

    def row_location(self, row: int) -> tuple[int, int, int]:
        """(output number among differentiable outputs, real index within it, output position)."""
        for i, size in enumerate(self.row_sizes):
            if row < size:
                return i, row, self.outputs[i]
            row -= size
        raise IndexError(row)

    def segments(self) -> list[tuple[int, int, int]]:
        """(output position, first row, end row) of each compared output."""
        ends = [sum(self.row_sizes[: k + 1]) for k in range(len(self.outputs))]
        return [(p, end - size, end) for p, size, end in zip(self.outputs, self.row_sizes, ends)]


def make_layout(inputs: list[torch.Tensor], outputs: tuple[Any, ...], positions: list[int]) -> Layout:
    """The layout of the Jacobian of ``outputs`` at ``positions`` with respect to ``inputs``."""
    starts = [0]
    for t in inputs:
        starts.append(starts[-1] + real_numel(t))
    return Layout(inputs, positions, starts, [real_numel(outputs[p]) for p in positions])
