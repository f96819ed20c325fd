"""Statistics of the entry by entry comparison of the analytical and the numerical Jacobian.

Pure torch. Both Jacobians are of the realified function (see ``realify``), so one comparison
serves real and complex functions alike. An ``ArgumentComparison`` folds in one block of columns of both
sides at a time, so no more than a block is ever held.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Callable, NamedTuple, Optional, Union, overload

import numpy as np
import torch

from ..core.tolerance import limit

KEEP_BAD = 16  # mismatching columns kept whole, to re-examine (kinks, domain edges)
KEEP_BYTES = 64 * 2**20  # at most this much of them per argument (the first is always kept), unless told

NEAR_ZERO = 1e-3  # a numerical entry at most this times atol is zero up to rounding (a batched forward's: ~1e-10)
STANDS_IN = -0.5  # worst_excess of the first entry of all zeros, which any entry compared later replaces
Column = tuple[int, torch.Tensor, torch.Tensor]  # (column, analytical column, numerical column)


class KeptColumns(Sequence[Column]):
    """Mismatching columns kept whole, each held as its non-zero entries where that is smaller (a
    sparse Jacobian's column, e.g. an elementwise function's), and read back dense one at a time."""

    def __init__(self) -> None:
        self._kept: list[tuple[int, int, Optional[torch.Tensor], torch.Tensor, torch.Tensor]] = []
        self.nbytes = 0

    def add(self, col: int, a: torch.Tensor, n: torch.Tensor, limit: int) -> bool:
        """Keep column ``col`` (``a`` and ``n`` are copied) unless it would take the kept bytes
        past ``limit`` (the first column is always kept); whether it was kept."""
        nonzero = torch.logical_or(a, n)  # NaN counts as non-zero
        k = int(torch.count_nonzero(nonzero))
        sparse = 24 * k < 16 * len(a)  # an index and two values per entry, against two values
        size = 24 * k if sparse else 16 * len(a)
        if self._kept and self.nbytes + size > limit:
            return False
        at = nonzero.nonzero().view(-1) if sparse else None
        self._kept.append(
            (col, len(a), at, a[at] if at is not None else a.clone(), n[at] if at is not None else n.clone())
        )
        self.nbytes += size
        return True

    def __len__(self) -> int:
        return len(self._kept)

    @overload
    def __getitem__(self, i: int) -> Column: ...

    @overload
    def __getitem__(self, i: slice) -> Sequence[Column]: ...

    def __getitem__(self, i: Union[int, slice]) -> Union[Column, Sequence[Column]]:
        if isinstance(i, slice):
            return [self[k] for k in range(len(self))[i]]
        col, size, at, a, n = self._kept[i]
        if at is None:
            return col, a, n
        dense = torch.zeros(2, size, dtype=a.dtype)
        dense[0, at], dense[1, at] = a, n
        return col, dense[0], dense[1]


@dataclass
class ArgumentComparison:
    """One argument's running comparison: the statistics of its columns, accumulated over the blocks of the Jacobian
    (formerly ``Entry``; one code path folds them: ``_measure`` then ``_take``)."""

    real_numel: int
    atol: float
    rtol: float
    bad: torch.Tensor = field(init=False)
    max_abs: float = 0.0
    max_rel: float | None = None
    worst_excess: float = -1.0
    worst_row: int = 0
    worst_col: int = 0
    analytical: float = 0.0
    numerical: float = 0.0
    nonfinite: int = 0
    wrong: int = 0  # entries out of tolerance (or not finite)
    wrong_at_zero: int = 0  # of them, those whose numerical value is zero up to rounding (NEAR_ZERO atol)
    sum_an: float = 0.0
    sum_nn: float = 0.0
    sum_aa: float = 0.0
    # per column: max |a - n| over its entries (inf where one is not finite), and u^T J of both sides for
    # one random probe u over the outputs: read through ``err``, ``proj_a`` and ``proj_n`` (see ``defer``)
    _err: torch.Tensor = field(init=False, repr=False)
    _proj_a: torch.Tensor = field(init=False, repr=False)
    _proj_n: torch.Tensor = field(init=False, repr=False)
    _deferred: list[Callable[[ArgumentComparison], None]] = field(default_factory=list, init=False, repr=False)
    # agreed blocks whose statistics are made but not yet read (``fold_agreed``, ``flush``)
    _pending: list[_Agreed] = field(default_factory=list, init=False, repr=False)
    # per column: a mismatching column with a numerical entry beyond rounding (False elsewhere: not told)
    live: torch.Tensor = field(init=False, repr=False)
    keep_bytes: int = KEEP_BYTES  # at most this much of bad_columns (give it by name)
    # (column, analytical column, numerical column) of the first mismatching input elements
    bad_columns: KeptColumns = field(default_factory=KeptColumns, init=False)

    def __post_init__(self) -> None:
        self.bad = torch.zeros(self.real_numel, dtype=torch.bool)
        self.live = torch.zeros(self.real_numel, dtype=torch.bool)
        self._err = torch.zeros(self.real_numel, dtype=torch.float64)
        self._proj_a = torch.zeros(self.real_numel, dtype=torch.float64)
        self._proj_n = torch.zeros(self.real_numel, dtype=torch.float64)

    @property
    def err(self) -> torch.Tensor:
        self._settle()
        return self._err

    @property
    def proj_a(self) -> torch.Tensor:
        self._settle()
        return self._proj_a

    @property
    def proj_n(self) -> torch.Tensor:
        self._settle()
        return self._proj_n

    def defer(self, extras: Callable[[ArgumentComparison], None]) -> None:
        """``extras(self)`` (an ``add_extras`` call for entries folded with ``extras=False``) runs when
        ``err``, ``proj_a`` or ``proj_n`` is first read: only a failing argument's maps, its diagnosis
        and --strict read them, so a passing argument never pays for them. ``extras`` is given the
        entry rather than holding it: a cycle would keep what it holds (the store of a compressed
        check: tens of MB) alive until the garbage collector runs."""
        self._deferred.append(extras)

    def _settle(self) -> None:
        while self._deferred:
            self._deferred.pop()(self)

    def update(self, a: torch.Tensor, n: torch.Tensor, col0: int, probe: torch.Tensor) -> None:
        """Fold in analytical ``a`` and numerical ``n`` for columns col0..col0+C of the Jacobian.

        Both are stored transposed, C x M (a row per input element), so each is contiguous.
        Entries that are exactly zero on both sides agree and change no statistic, so when most
        are (a sparse Jacobian, e.g. of a Linear layer), only the others are compared.
        """
        cols = slice(col0, col0 + a.shape[0])
        self._proj_a[cols] = a @ probe
        self._proj_n[cols] = n @ probe
        if a.numel() == 0:
            return
        nonzero = torch.logical_or(a, n)  # NaN counts as non-zero

        def column(c: int) -> torch.Tensor:
            return a[c]  # copied where it is kept

        if int(torch.count_nonzero(nonzero)) * 4 < a.numel():  # (faster than a bool .sum())
            at = nonzero.nonzero(as_tuple=True)
            self._fold(a[at], n[at], at, n.shape, col0, column, lambda k: n[k])
        else:
            self._fold(a.reshape(-1), n.reshape(-1), None, n.shape, col0, column, lambda k: n[k])

    def update_sparse(
        self, c: torch.Tensor, r: torch.Tensor, av: torch.Tensor, n: torch.Tensor, col0: int, probe: torch.Tensor
    ) -> None:
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
        self.update_entries(c, r, av, nv, n.shape, col0, probe, lambda k: n[k])

    def update_entries(
        self,
        c: torch.Tensor,
        r: torch.Tensor,
        av: torch.Tensor,
        nv: torch.Tensor,
        shape: tuple[int, ...],
        col0: int,
        probe: torch.Tensor,
        n_column: Callable[[int], torch.Tensor] | None = None,
        spans: Sequence[int] | torch.Tensor = (),
        extras: bool = True,
    ) -> None:
        """``update`` with both sides given as their entries that are not zero on both: column
        (within the block of ``shape``: columns x rows), row, analytical and numerical value, by
        column then row; ``n_column``: a numerical column of the block, whole (default: ``nv``
        put at its rows); ``spans``: the entries where the sums behind the reported ratio start
        anew: where a comparison chunk by chunk starts a chunk, so that they are its very sums;
        ``extras`` False: the per-column errors and the probe's projections left to a deferred
        ``add_extras`` of the same entries (see ``defer``)."""
        n_cols, n_rows = shape
        if extras:
            self._project(c, r, av, nv, n_cols, col0, probe)

        def column(values: torch.Tensor) -> Callable[[int], torch.Tensor]:
            def dense(k: int) -> torch.Tensor:
                mine = c == k
                return torch.zeros(n_rows, dtype=torch.float64).index_put_((r[mine],), values[mine])

            return dense

        self._fold(av, nv, (c, r), shape, col0, column(av), n_column or column(nv), spans, extras)

    def fold_agreed(
        self,
        av: torch.Tensor,
        nv: torch.Tensor,
        shape: tuple[int, int],
        col0: int,
        locate: Callable[[int], tuple[int, int]],
        fallback: Callable[[ArgumentComparison], None],
        spans: Sequence[int] | torch.Tensor = (),
        spans_there: torch.Tensor | None = None,
    ) -> None:
        """Fold in entries the caller knows agree: each within atol + rtol |n| by this very comparison (a
        compressed group's, accepted by it), so none is bad and no column is kept; what ``update_entries`` with
        ``extras=False`` makes of them, without reading a value: the block's statistics are made where its
        tensors are (``_measure``, as ``_fold`` makes them) and read, with every other block folded so, in one
        read at ``flush`` (which applies them in order, by ``_take`` as ``_fold`` does). ``locate(k)``: entry k's
        column (within the block) and row, asked of the worst entry only (no index tensors are made).
        ``fallback(self)`` folds the block instead where an entry is not finite (an infinite numerical value is
        within an infinite tolerance): the caller's ``update_entries``. ``spans_there``: ``spans`` on the
        entries' device, where they are not on the CPU (no copy of them there, a wait on a GPU)."""
        n_cols, n_rows = shape
        diff = torch.sub(av, nv).abs_()
        n_abs = nv.abs()
        tol = limit(n_abs, self.atol, self.rtol)
        values = _measure(av, nv, diff, n_abs, tol, n_abs <= self.atol)
        first = (col0, n_rows, bool(diff.numel()))
        self._pending.append(_Agreed(values, _span_sums(av, nv, spans, spans_there), first, locate, fallback))

    def flush(self) -> None:
        """Fold in the blocks of ``fold_agreed`` (in order; a block with an entry not finite by its
        ``fallback``), reading their statistics at once."""
        pending, self._pending = self._pending, []
        if not pending:
            return
        values = torch.stack([p.values for p in pending]).tolist()  # the one read of every block's statistics
        located: tuple[Callable[[int], tuple[int, int]], int, int] | None = None
        sums: list[torch.Tensor] = []
        for block, read in zip(pending, values):
            if not math.isfinite(read[0]):  # an entry not finite: folded as without ``fold_agreed``
                self._add_sums(sums)
                sums = []
                before = self.worst_excess
                block.fallback(self)
                located = None if self.worst_excess != before else located
                continue
            col0, n_rows, entries = block.first
            k = self._take(read, col0, n_rows, entries)
            if k is not None:  # (a stand-in for entries all 0 comes before any worst entry: none is located then)
                located = (block.locate, k, col0)
            sums.append(block.sums)
        self._add_sums(sums)
        if located is not None:  # the worst entry's place, asked of the block that holds it only
            locate, k, col0 = located
            col, row = locate(k)
            self.worst_row, self.worst_col = row, col0 + col

    def _take(self, read: Sequence[float], col0: int, n_rows: int, entries: bool) -> int | None:
        """Fold in a block's statistics ``read`` (``_measure``'s, read) of the block from column ``col0`` of
        ``n_rows`` rows (``entries``: whether any of its entries was compared): the largest |a - n| and relative
        error, and the worst entry but for its place. Returns that entry's k in the block where it is now the
        argument's worst (its place, ``worst_row`` and ``worst_col``, left to the caller), else None."""
        top, rel_max, all_small, excess, a, n, k = read
        self.max_abs = max(self.max_abs, top)
        worst = None
        if entries:
            if excess > self.worst_excess:
                self.worst_excess, self.analytical, self.numerical = excess, a, n
                worst = int(k)
        elif self.worst_excess < STANDS_IN and n_rows:  # no entry yet, all 0 on both sides: the first stands for them
            self.worst_excess, self.worst_row, self.worst_col = STANDS_IN, 0, col0  # until an entry comes
            self.analytical = self.numerical = 0.0
        if not all_small:
            self.max_rel = max(self.max_rel or 0.0, rel_max)
        return worst

    def _add_sums(self, parts: list[torch.Tensor]) -> None:
        """Span sums (``_span_sums``) after the sums so far, in order, as ``_sum`` adds them."""
        if parts:
            so_far = parts[0].new_tensor([[self.sum_an, self.sum_nn, self.sum_aa]])
            total = torch.cat((so_far, *parts)).cumsum(0)[-1]
            self.sum_an, self.sum_nn, self.sum_aa = total.tolist()

    def add_extras(
        self,
        c: torch.Tensor,
        r: torch.Tensor,
        av: torch.Tensor,
        nv: torch.Tensor,
        n_cols: int,
        col0: int,
        probe: torch.Tensor,
    ) -> None:
        """The per-column errors and the probe's projections of entries given to ``update_entries`` with
        ``extras=False`` (the same arguments): what it would have made of them."""
        self._project(c, r, av, nv, n_cols, col0, probe)
        _, _, diff, broken, _ = _differences(av, nv)
        self._column_errors(diff, broken, (c, r), n_cols, 0, col0)

    def _project(
        self,
        c: torch.Tensor,
        r: torch.Tensor,
        av: torch.Tensor,
        nv: torch.Tensor,
        n_cols: int,
        col0: int,
        probe: torch.Tensor,
    ) -> None:
        """u^T J of both sides for columns col0..col0+n_cols, from their entries (by column)."""
        cols = slice(col0, col0 + n_cols)
        u = probe.index_select(0, r)
        lengths = torch.diff(torch.searchsorted(c, torch.arange(n_cols + 1, dtype=c.dtype)))  # entries per column
        self._proj_a[cols] = torch.segment_reduce(av * u, "sum", lengths=lengths)  # (faster than index_add_)
        self._proj_n[cols] = torch.segment_reduce(u.mul_(nv), "sum", lengths=lengths)

    def _fold(
        self,
        av: torch.Tensor,
        nv: torch.Tensor,
        at: tuple[torch.Tensor, ...] | None,
        shape: tuple[int, ...],
        col0: int,
        a_column: Callable[[int], torch.Tensor],
        n_column: Callable[[int], torch.Tensor],
        spans: Sequence[int] | torch.Tensor = (),
        extras: bool = True,
    ) -> None:
        """The statistics of entries ``av``/``nv``: all of the block (``at`` None, row-major) or
        those at (column, row) indices ``at``; the block is ``shape`` (columns x rows);
        ``a_column``, ``n_column``: an analytical, a numerical column of the block, whole; ``extras``
        False: no per-column errors (see ``update_entries``). Those of agreed entries too (``fold_agreed``)
        come from ``_measure`` and ``_take``, as here."""
        n_cols, n_rows = shape
        # a non-finite entry is a mismatch; the statistics below are over the finite ones
        av, nv, diff, broken, _ = _differences(av, nv)
        if broken is not None:
            self.nonfinite += int(broken.sum())
        if extras:
            self._column_errors(diff, broken, at, n_cols, n_rows, col0)
        n_abs = nv.abs()
        tol = limit(n_abs, self.atol, self.rtol)
        small = n_abs <= self.atol  # relative error only where the numerical value is not ~0, or the entry is wrong
        wrong = diff > tol  # not |a - n| <= atol + rtol |n| (as torch.allclose): every value is finite here
        if broken is not None:
            wrong.logical_or_(broken)
        bad = (
            wrong.view(n_cols, n_rows).any(1)
            if at is None
            else torch.zeros(n_cols, dtype=torch.bool).index_fill_(0, at[0][wrong], True)
        )
        if bool(bad.any()):
            self._mismatches(wrong, n_abs, at, bad, n_cols, n_rows, col0)
            # a wrong entry's relative error counts, infinite where its numerical value is 0 (not non-finite ones)
            small.logical_and_(~wrong if broken is None else ~(wrong & ~broken))
        self.bad[col0 : col0 + n_cols] |= bad
        for c in bad.nonzero().view(-1)[: max(0, KEEP_BAD - len(self.bad_columns))].tolist():
            if not self.bad_columns.add(col0 + c, a_column(c), n_column(c), self.keep_bytes):  # to re-examine
                break
        k = self._take(_measure(av, nv, diff, n_abs, tol, small).tolist(), col0, n_rows, bool(diff.numel()))
        if k is not None:
            col, row = divmod(k, n_rows) if at is None else (int(at[0][k]), int(at[1][k]))
            self.worst_row, self.worst_col = row, col0 + col
        self._sum(av, nv, spans)

    def _sum(self, av: torch.Tensor, nv: torch.Tensor, spans: Sequence[int] | torch.Tensor) -> None:
        """Add the sums behind the reported ratio: a n, n n and a a summed span by span (``spans``: where a
        sum starts anew, see ``update_entries``), each from 0 and in order, then the spans' sums in order
        after the sums so far. Sequential sums (segment_reduce's and cumsum's on the CPU) make a span's sum
        the same whichever spans stand beside it and whatever zeros it holds, so a block compared whole and
        the same entries compared in pieces give the same bits; one call per block, however many spans."""
        self._add_sums([_span_sums(av, nv, spans)])

    def _mismatches(
        self,
        wrong: torch.Tensor,
        n_abs: torch.Tensor,
        at: tuple[torch.Tensor, ...] | None,
        bad: torch.Tensor,
        n_cols: int,
        n_rows: int,
        col0: int,
    ) -> None:
        """Count the entries ``wrong`` of a block with mismatching columns ``bad``, and those of them whose
        numerical value (``n_abs``, absolute) is ~0; mark the mismatching columns with a numerical entry beyond
        rounding in ``live`` (a block's columns come whole, so a column not marked has none)."""
        live = n_abs > self.atol * NEAR_ZERO
        self.wrong += int(wrong.sum())
        self.wrong_at_zero += int((wrong & ~live).sum())
        per = (
            live.view(n_cols, n_rows).any(1)
            if at is None
            else torch.zeros(n_cols, dtype=torch.bool).index_fill_(0, at[0][live], True)
        )
        self.live[col0 : col0 + n_cols] |= per.logical_and_(bad)

    def _column_errors(
        self,
        diff: torch.Tensor,
        broken: torch.Tensor | None,
        at: tuple[torch.Tensor, ...] | None,
        n_cols: int,
        n_rows: int,
        col0: int,
    ) -> None:
        """Fold the entries' errors ``diff`` (non-finite ones: ``broken``) into ``err``, per column."""
        if not diff.numel():
            return
        if broken is not None:
            diff = diff.masked_fill(broken, math.inf)
        if at is None:
            per = diff.view(n_cols, n_rows).amax(1)
        else:
            per = torch.zeros(n_cols, dtype=torch.float64).scatter_reduce_(0, at[0], diff, "amax")
        cols = slice(col0, col0 + n_cols)
        torch.maximum(self._err[cols], per, out=self._err[cols])


def _measure(
    av: torch.Tensor, nv: torch.Tensor, diff: torch.Tensor, n_abs: torch.Tensor, tol: torch.Tensor, small: torch.Tensor
) -> torch.Tensor:
    """A block's statistics, made where its entries are and not read (``ArgumentComparison._take`` folds them in, read):
    of entries ``av``/``nv`` with ``diff`` = |a - n|, ``n_abs`` = |n| and ``tol`` = atol + rtol |n| (both
    overwritten), the largest |a - n|, the largest relative error |a - n| / |n| where not ``small``, whether
    all are ``small``, then the worst entry's excess |a - n| / tol, a, n and its place k (zeros where there are
    no entries): float64, one tensor."""
    zero = diff.new_zeros((), dtype=torch.float64)
    if diff.numel():
        top = diff.max()
        excess = torch.div(diff, tol, out=tol)
        k = torch.argmax(excess).view(1)
        worst = torch.cat([t.index_select(0, k).to(torch.float64) for t in (excess, av, nv)] + [k.to(torch.float64)])
    else:
        top, worst = zero, diff.new_zeros(4, dtype=torch.float64)
    rel = torch.div(diff, n_abs, out=n_abs).masked_fill_(small, 0.0)
    rel_max = rel.max() if rel.numel() else zero
    return torch.cat(
        (torch.stack((top.to(torch.float64), rel_max.to(torch.float64), small.all().to(zero.dtype))), worst)
    )


def _span_sums(
    av: torch.Tensor, nv: torch.Tensor, spans: Sequence[int] | torch.Tensor, there: torch.Tensor | None = None
) -> torch.Tensor:
    """a n, n n and a a of entries ``av``/``nv`` summed span by span (``spans``: where a sum starts anew,
    given on the host; ``there``: the same on ``av``'s device, if at hand), each from 0 and in order: a row of
    three per span. Elsewhere than on the CPU (a GPU, whose segment_reduce sums a span of rows in one thread,
    one entry after the other), in blocks (``span_by_span``): the same span gives the same bits there too,
    whichever spans stand beside it."""
    terms = torch.stack((av * nv, nv * nv, av * av), 1)
    inner = torch.as_tensor(spans, dtype=torch.int64).view(-1)
    if av.device.type != "cpu":
        return span_by_span(terms, inner.tolist(), there)
    lengths = torch.diff(inner, prepend=inner.new_zeros(1), append=inner.new_full((1,), len(av)))
    return torch.segment_reduce(terms, "sum", lengths=lengths, axis=0)


SPAN_BLOCK = 1 << 10  # rows a GPU thread sums in order, at most (``span_by_span``)


def span_by_span(terms: torch.Tensor, spans: list[int], there: torch.Tensor | None = None) -> torch.Tensor:
    """The rows of ``terms`` summed span by span (``spans``: where a sum starts anew; ``there``: the same on
    ``terms``' device, else copied there), each span in blocks of SPAN_BLOCK rows from its start, then its
    blocks' sums in order: two segment_reduce calls whatever the number of spans, no value read on the host
    (the blocks are counted from ``spans``, and made from ``there`` on the device), and no thread summing more
    than SPAN_BLOCK rows (or a span's blocks)."""
    total = int((-(-np.diff(np.asarray([0, *spans, len(terms)], dtype=np.int64)) // SPAN_BLOCK)).sum())
    if not total:  # no rows: every span's sum is 0
        return terms.new_zeros(len(spans) + 1, *terms.shape[1:])
    inner = there if there is not None else torch.as_tensor(spans, dtype=torch.int64, device=terms.device)
    inner = inner.to(torch.int64)
    ends = torch.cat((inner.new_zeros(1), inner, inner.new_full((1,), len(terms))))
    lengths = torch.diff(ends)
    blocks = torch.div(lengths + (SPAN_BLOCK - 1), SPAN_BLOCK, rounding_mode="floor")
    last = torch.cumsum(blocks, 0)  # each span's blocks end there
    block = torch.arange(total, device=terms.device)
    span = torch.searchsorted(last, block, right=True)  # each block's span
    done = (block - (last - blocks).index_select(0, span)) * SPAN_BLOCK  # the span's rows before the block
    sizes = torch.clamp_max(lengths.index_select(0, span) - done, SPAN_BLOCK)
    # unsafe: the lengths are made here (non-negative, summing to the rows), not read back to be checked
    partial_sums = torch.segment_reduce(terms, "sum", lengths=sizes, axis=0, unsafe=True)
    return torch.segment_reduce(partial_sums, "sum", lengths=blocks, axis=0, unsafe=True)


class _Agreed(NamedTuple):
    """A block of ``ArgumentComparison.fold_agreed``: its statistics, not yet read."""

    values: torch.Tensor  # largest |a - n|, largest relative error, all small, then the worst entry's excess, a, n, k
    sums: torch.Tensor  # its span sums (``_span_sums``)
    first: tuple[int, int, bool]  # its first column, its rows, whether it holds entries
    locate: Callable[[int], tuple[int, int]]  # entry k's column (within the block) and row
    fallback: Callable[[ArgumentComparison], None]  # folds the block where an entry is not finite


class Differences(NamedTuple):
    """|a - n| of entries as the statistics take them (``_differences``)."""

    av: torch.Tensor  # the analytical entries, 0 where an entry is not finite on either side
    nv: torch.Tensor  # the numerical entries, likewise
    diff: torch.Tensor  # |av - nv|
    broken: torch.Tensor | None  # where an entry is not finite on either side; None where all are
    top: float  # the largest difference


def _differences(av: torch.Tensor, nv: torch.Tensor) -> Differences:
    """|a - n| of entries ``av``/``nv``, as the statistics take them: where an entry is not finite on
    either side (``broken``; None where all are), both sides count as 0; also the largest difference."""
    diff = torch.sub(av, nv).abs_()
    top = float(diff.max()) if diff.numel() else 0.0
    if math.isfinite(top):
        return Differences(av, nv, diff, None, top)
    finite = torch.isfinite(av) & torch.isfinite(nv)
    av, nv = torch.where(finite, av, 0.0), torch.where(finite, nv, 0.0)
    diff = torch.sub(av, nv).abs_()
    return Differences(av, nv, diff, ~finite, float(diff.max()))
