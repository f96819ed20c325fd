"""Finite differences and the entry-by-entry Jacobian comparison, in bounded memory.

Pure torch, no I/O. Complex tensors are handled as pairs of reals ("realified"): a complex
input contributes two columns per element (real and imaginary part), a complex output two
rows. With PyTorch's convention (the gradient of a real loss L w.r.t. z = a + ib is
dL/da + i dL/db) the vector-Jacobian product of the realified function is exactly the
realified gradient, so one comparison serves real and complex functions alike.
"""
from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any, Callable, Optional, Sequence

import torch

from .jacobians import Jacobians, Layout, make_layout
from .realify import Call, Vjp, real_numel, vjp


KEEP_BAD = 16  # mismatching columns kept whole, to re-examine (kinks, domain edges)


def probe_generator(seed: int, stream: int) -> torch.Generator:
    """A generator for probes, seeded from the spec's seed but independent of the inputs' stream."""
    return torch.Generator().manual_seed((seed * 1_000_003 + 7919 * (stream + 1)) % 2**63)


def signed_uniform(shape: Sequence[int], gen: torch.Generator) -> torch.Tensor:
    """Float64 random probe values, uniform on (-1, 1) in 2^16 steps symmetric about 0. Made from
    the generator's raw bits, which torch draws about 4x faster than normals: a probe needs
    independent, symmetric values that are almost never equal, not a Gaussian (torch's fast mode
    draws uniform ones too)."""
    n = math.prod(shape)
    bits = torch.empty((n + 3) // 4, dtype=torch.int64).random_(-(2**63), None, generator=gen)
    return bits.view(torch.int16)[:n].to(torch.float64).add_(0.5).div_(2**15).view(tuple(shape))


@dataclass
class Entry:
    """Statistics of one argument's columns, accumulated over the blocks of the Jacobian."""

    real_numel: int
    atol: float
    rtol: float
    bad: torch.Tensor = field(init=False)
    max_abs: float = 0.0
    max_rel: Optional[float] = None
    worst_excess: float = -1.0
    worst_row: int = 0
    worst_col: int = 0
    analytical: float = 0.0
    numerical: float = 0.0
    nonfinite: int = 0
    sum_an: float = 0.0
    sum_nn: float = 0.0
    sum_aa: float = 0.0
    proj_a: torch.Tensor = field(init=False)  # u^T J for one random probe u over the outputs
    proj_n: torch.Tensor = field(init=False)
    # (column, analytical column, numerical column) of the first mismatching input elements
    bad_columns: list[tuple[int, torch.Tensor, torch.Tensor]] = field(default_factory=list)

    def __post_init__(self) -> None:
        self.bad = torch.zeros(self.real_numel, dtype=torch.bool)
        self.proj_a = torch.zeros(self.real_numel, dtype=torch.float64)
        self.proj_n = torch.zeros(self.real_numel, dtype=torch.float64)

    def update(self, a: torch.Tensor, n: torch.Tensor, col0: int, probe: torch.Tensor) -> None:
        """Fold in analytical ``a`` and numerical ``n`` for columns col0..col0+C of the Jacobian.

        Both are stored transposed, C x M (a row per input element), so each is contiguous.
        Entries that are exactly zero on both sides agree and change no statistic, so when most
        are (a sparse Jacobian, e.g. of a Linear layer), only the others are compared.
        """
        cols = slice(col0, col0 + a.shape[0])
        self.proj_a[cols] = a @ probe
        self.proj_n[cols] = n @ probe
        if a.numel() == 0:
            return
        nonzero = torch.logical_or(a, n)  # NaN counts as non-zero
        column = lambda c: a[c].clone()  # noqa: E731
        if int(torch.count_nonzero(nonzero)) * 4 < a.numel():  # (a bool .sum() is 20x slower)
            at = nonzero.nonzero(as_tuple=True)
            self._fold(a[at], n[at], at, n, col0, column)
        else:
            self._fold(a.reshape(-1), n.reshape(-1), None, n, col0, column)

    def update_sparse(self, c: torch.Tensor, r: torch.Tensor, av: torch.Tensor, n: torch.Tensor, col0: int,
                      probe: torch.Tensor) -> None:
        """``update`` with the analytical columns given as their non-zero entries: column (within
        ``n``), row and value, by column then row. The numerical columns ``n`` are read there and
        only counted elsewhere (where they are non-zero too, those entries are looked up), so no
        dense analytical block is made and the entries zero on both sides are never compared."""
        nv = n[c, r]
        if int(torch.count_nonzero(n)) > int(torch.count_nonzero(nv)):  # NaN counts as non-zero
            off = n != 0
            off[c, r] = False
            oc, orow = off.nonzero(as_tuple=True)
            c, r = torch.cat([c, oc]), torch.cat([r, orow])
            order = torch.argsort(c * n.shape[1] + r)  # by column then row, as ``update``: ties go to the first
            c, r = c[order], r[order]
            av, nv = torch.cat([av, av.new_zeros(len(oc))])[order], torch.cat([nv, n[oc, orow]])[order]
        cols = slice(col0, col0 + len(n))
        self.proj_a[cols] = torch.zeros(len(n), dtype=torch.float64).index_add_(0, c, av * probe[r])
        self.proj_n[cols] = torch.zeros(len(n), dtype=torch.float64).index_add_(0, c, nv * probe[r])

        def column(k: int) -> torch.Tensor:
            mine = c == k
            return torch.zeros(n.shape[1], dtype=torch.float64).index_put_((r[mine],), av[mine])

        self._fold(av, nv, (c, r), n, col0, column)

    def _fold(self, av: torch.Tensor, nv: torch.Tensor, at: Optional[tuple[torch.Tensor, torch.Tensor]],
              n: torch.Tensor, col0: int, a_column: Callable[[int], torch.Tensor]) -> None:
        """The statistics of entries ``av``/``nv``: all of the block (``at`` None, row-major) or
        those at (column, row) indices ``at``; ``a_column``: an analytical column of the block, whole."""
        n_cols, n_rows = n.shape

        def where(k: int) -> tuple[int, int]:
            return divmod(k, n_rows) if at is None else (int(at[0][k]), int(at[1][k]))

        diff = torch.sub(av, nv).abs_()
        top = float(diff.max()) if diff.numel() else 0.0
        broken = torch.zeros_like(diff, dtype=torch.bool)
        if not math.isfinite(top):
            # a non-finite entry is a mismatch; the statistics below are over the finite ones
            finite = torch.isfinite(av) & torch.isfinite(nv)
            self.nonfinite += int((~finite).sum())
            broken = ~finite
            av, nv = torch.where(finite, av, 0.0), torch.where(finite, nv, 0.0)
            diff = torch.sub(av, nv).abs_()
            top = float(diff.max())
        self.max_abs = max(self.max_abs, top)
        n_abs = nv.abs()
        tol = n_abs.mul(self.rtol).add_(self.atol)
        wrong = (diff <= tol).logical_not_().logical_or_(broken)  # |a - n| <= atol + rtol |n|, as torch.allclose
        bad = (wrong.view(n_cols, n_rows).any(1) if at is None else
               torch.zeros(n_cols, dtype=torch.bool).index_fill_(0, at[0][wrong], True))
        self.bad[col0 : col0 + n_cols] |= bad
        for c in bad.nonzero().view(-1)[: max(0, KEEP_BAD - len(self.bad_columns))].tolist():
            self.bad_columns.append((col0 + c, a_column(c), n[c].clone()))  # kept whole, to re-examine
        excess = torch.div(diff, tol, out=tol)
        if diff.numel():
            k = int(torch.argmax(excess))
            if float(excess[k]) > self.worst_excess:
                col, row = where(k)
                self.worst_excess, self.worst_row, self.worst_col = float(excess[k]), row, col0 + col
                self.analytical, self.numerical = float(av[k]), float(nv[k])
        elif self.worst_excess < 0:  # every entry is 0 on both sides: the first one stands for them
            self.worst_excess, self.worst_row, self.worst_col = 0.0, 0, col0
            self.analytical = self.numerical = 0.0
        small = n_abs <= self.atol  # relative error only where the numerical value is not ~0
        rel = torch.div(diff, n_abs, out=n_abs).masked_fill_(small, 0.0)
        if not bool(small.all()):
            self.max_rel = max(self.max_rel or 0.0, float(rel.max()))
        self.sum_an += float(av @ nv)
        self.sum_nn += float(nv @ nv)
        self.sum_aa += float(av @ av)


def compare(
    call: Call,
    outputs: tuple,
    positions: list[int],
    grad_inputs: list[torch.Tensor],
    plain_values: list[Any],
    plain_inputs: list[torch.Tensor],
    *,
    eps: float,
    atol: float,
    rtol: float,
    memory_bytes: int,
    grad: Vjp = vjp,
    seed: int = 0,
    batched: Optional[Call] = None,
) -> tuple[Layout, list[Entry]]:
    """Compare analytical and numerical Jacobians entry by entry, block of columns by block.

    ``outputs`` come from one forward with grad enabled on the leaves ``grad_inputs``;
    ``positions`` name the outputs compared. ``plain_inputs`` are detached copies (inside
    ``plain_values``, the arguments ``call`` takes) that get perturbed. At most about
    ``memory_bytes`` of Jacobian entries are held at once, so memory stays
    O(memory_bytes + inputs + outputs) instead of O(inputs x outputs): the non-zero entries of the
    analytical rows are kept if they are few (see below), else dense rows are held, recomputed for
    each block of columns when they do not all fit. ``call`` and ``grad`` are the
    forward and the vector-Jacobian product (the caller may wrap them to label user errors).
    Each entry also keeps u^T J (analytical and numerical) for one random probe u drawn from
    ``seed``, so that patterns across a whole gradient (e.g. a transpose) can be named.
    ``batched``, the same forward as ``call`` in a form torch.func.vmap may batch, lets the finite
    differences be batched; see ``jacobians``.
    """
    layout = make_layout(plain_inputs, outputs, positions)
    jac = Jacobians(call, grad, [outputs[p] for p in positions], grad_inputs, plain_values, layout, eps,
                    batched, memory_bytes)
    probe = signed_uniform((layout.n_rows,), probe_generator(seed, 0))
    entries = [Entry(real_numel(t), atol, rtol) for t in plain_inputs]
    per_col = 8 * max(1, layout.n_rows)
    block = max(1, memory_bytes * 7 // 8 // per_col)  # analytical rows held at once
    chunk = max(1, min(block, memory_bytes // 8 // 8 // per_col))  # numerical columns and temporaries
    # The non-zero entries, from one pass of backward calls, are kept instead of the dense rows
    # when they fit in a quarter of the memory and, if the dense rows fit too, are at most an
    # eighth of the entries: each chunk of numerical columns is then compared at those entries
    # (and wherever it is non-zero itself), never scanning the entries zero on both sides. Else
    # the dense rows are computed per block.
    fits = block >= layout.n_cols
    limit = memory_bytes // 4 // 24
    store = jac.sparse_rows(min(limit, layout.n_rows * layout.n_cols // 8) if fits else limit, early=fits)
    if store is not None:
        block = max(1, layout.n_cols)  # no rows held: one pass over the chunks
    for col0 in range(0, layout.n_cols, block):
        col1 = min(layout.n_cols, col0 + block)
        a_block = jac.rows(col0, col1) if store is None else None
        for c0 in range(col0, col1, chunk):
            c1 = min(col1, c0 + chunk)
            n_chunk = jac.columns(c0, c1)
            for i, entry in enumerate(entries):
                lo, hi = max(c0, layout.col_starts[i]), min(c1, layout.col_starts[i + 1])
                if lo < hi:
                    n, start = n_chunk[lo - c0 : hi - c0], lo - layout.col_starts[i]
                    if a_block is not None:
                        entry.update(a_block[lo - col0 : hi - col0], n, start, probe)
                    else:
                        entry.update_sparse(*store.entries(lo, hi), n, start, probe)
        del a_block  # free it before the next block is allocated: one block at a time
    return layout, entries
