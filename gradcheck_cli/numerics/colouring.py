"""Colouring the columns of a sparse Jacobian: structurally orthogonal columns (no analytical row in common,
Curtis, Powell and Reid 1974) share a colour, and each colour is one group of compressed finite differences
(see ``compressed``). Pure torch and NumPy."""

from __future__ import annotations

import numpy as np
import torch

from .rows import SparseRows

PATTERNS = 20_000  # at most this many column patterns are coloured (about 20 microseconds each)


def colour(store: SparseRows, n_rows: int) -> tuple[torch.Tensor, int] | None:
    """A group (colour) per column, no two columns of a group with an analytical entry in the same
    row, and the number of groups; None where there are more than PATTERNS column patterns (the
    colouring would cost more than it saves). Every column in one group where no row has two
    entries (an elementwise function), else first fit (see ``first_fit``)."""
    n_cols = len(store.starts) - 1
    if not len(store.rows) or int(torch.bincount(store.rows).max()) <= 1:
        return torch.zeros(n_cols, dtype=torch.long), 1
    found = first_fit(store, n_rows)
    return None if found is None else (found, int(found.max()) + 1)


def first_fit(store: SparseRows, n_rows: int) -> torch.Tensor | None:
    """Greedy colouring, columns in order; the columns of one pattern (a hash of their rows) take
    the lowest colours free in all their rows at once (a Linear layer's n x n weight has n
    patterns); None beyond PATTERNS patterns."""
    n_cols = len(store.starts) - 1
    mix = torch.randint(1, 2**61, (n_rows,), generator=torch.Generator().manual_seed(0))
    starts = store.bounds
    summed = torch.zeros(len(store.rows) + 1, dtype=torch.long)  # one temporary of the entries' size
    torch.index_select(mix, 0, store.rows, out=summed[1:]).cumsum_(0)  # wraps
    hashed = summed[starts[1:]] - summed[starts[:-1]]  # each column's sum of its rows' numbers (modulo 2^64)
    counts = starts[1:] - starts[:-1]
    _, pattern = torch.unique(hashed ^ counts, return_inverse=True)  # the count: one more check of the pattern
    patterns = pattern.numpy()  # the greedy colouring is sequential: on the host, from one copy of the structure
    if int(patterns.max()) >= PATTERNS:
        return None
    rows = store.rows.numpy()
    colours = np.zeros(n_cols, dtype=np.int64)
    used = np.zeros((n_rows, 64), dtype=bool)  # per row: the colours taken there
    for cols in sorted(member_arrays(patterns, int(patterns.max()) + 1 if n_cols else 0), key=lambda m: int(m[0])):
        j = int(cols[0])
        mine = rows[store.starts[j] : store.starts[j + 1]]
        if not len(mine):
            continue  # colour 0: an empty column conflicts with none
        free = np.flatnonzero(~used[mine].any(0))
        while len(free) < len(cols):
            free = np.concatenate([free, np.arange(used.shape[1], used.shape[1] + 64)])
            used = np.concatenate([used, np.zeros((n_rows, 64), dtype=bool)], axis=1)
        take = free[: len(cols)]
        if take[-1] - take[0] == len(take) - 1:  # consecutive colours (usual): a slice, not a cross product
            used[mine, take[0] : take[-1] + 1] = True
        else:
            used[np.ix_(mine, take)] = True
        colours[cols] = take
    return torch.from_numpy(colours)


def members(colours: torch.Tensor, n_groups: int) -> list[torch.Tensor]:
    """The columns of each group, in order."""
    return [torch.from_numpy(m) for m in member_arrays(colours.numpy(), n_groups)]


def member_arrays(colours: np.ndarray, n_groups: int) -> list[np.ndarray]:
    """The columns of each group (``colours``: a group per column), in order."""
    order = np.argsort(colours, kind="stable")  # torch's stalls on 2 busy threads
    return np.split(order, np.cumsum(np.bincount(colours, minlength=n_groups))[:-1]) if n_groups else []
