"""Compressed finite differences: the numerical columns of a sparse Jacobian, a group at a time.

The analytical Jacobian's non-zero entries are known before the numerical side is made (the sparse
store, see ``rows.SparseRows``). Columns with no analytical row in common ("structurally
orthogonal", Curtis, Powell and Reid 1974) are put in one group (``colour``: greedy, first fit),
and a group is perturbed at once, in two ways:

1. every element of the group moved by exactly +-eps, as an element-by-element check moves it on
   its own. In a row where the group has an analytical entry, the difference quotient is then the
   very number that element's own column gives there (no other element of the group enters that
   row, unless the analytical pattern is wrong); in every other row it must be exactly zero.
2. every element moved by eps w_j, w_j random (uniform magnitude in [1, 2), random sign, from the
   spec's seed): compared against the weighted sum of the analytical columns, it catches what
   the unit moves of (1) could cancel (a forgotten gradient of +1 and -1 in one row, a gradient
   where the analytical pattern says zero next to a wrong one).

A group is accepted when every row of both agrees within the element-wise tolerance
(atol + rtol |n|), every row without an analytical entry is exactly zero in both, and in every row
with one, (2) over its element's weight equals (1) up to the rounding of the forwards (NOISE ulps
of the largest output, over eps): a gradient the analytical pattern leaves out beside an entry
(an element whose gradient backward forgets, smaller than the entry's rtol) moves (1) and (2)
differently, by (w_k / w_j - 1) times it, where the element-wise tolerance would catch it and the
row's, relative to the entry, would not. Its columns are then the numbers of (1), put where the
analytical entries are. The columns of every other group are made one by one, as without
compression, so every mismatch, kink and reported element comes from the element-by-element
columns. A wrong gradient passes only if the random weights of (2) cancel its error in every row
it touches: to within the tolerance in a row without an analytical entry, to within the rounding
in a row with one.

Four forwards per group instead of two per column: a Linear layer's n x n weight, n x n input and
bias take 2n + 1 groups; an elementwise function one. Pure torch.
"""
from __future__ import annotations

import bisect
import math
from collections.abc import Iterator
from functools import partial

import numpy as np
import torch

from .batching import COL_STAGE, GROUP_STAGE_BYTES, Batches, copies, same, stage_size, try_batched, vmapped
from .columns import Columns
from .differences import call_moved
from .realify import outputs_vector, real_numel, real_view, unravel
from .rows import SparseRows
from .stats import Entry

PASSES = 4  # forwards per group: unit moves -eps, +eps, weighted moves -eps, +eps
PIECE = 2**16  # entries folded at once into the statistics (their temporaries stay in cache)
PATTERNS = 20_000  # at most this many column patterns are coloured (about 20 microseconds each)
LEAF = 32  # a group not accepted of at most this many columns has them made one by one; a larger one is halved
NOISE = 64  # ulps of the largest output, over eps: how far (2) / w may differ from (1) in a row with an entry
# (the benchmark's Functions: within 1.5; a sine of 50 x, whose third derivative separates the two steps: 320)
CURVED = 4  # how far off one line the three moves' quotients may be, in ``rounding``s (see ``Groups._curved``)


def colour(store: SparseRows, n_rows: int) -> tuple[torch.Tensor, int] | None:
    """A group (colour) per column, no two columns of a group with an analytical entry in the same
    row, and the number of groups; None where there are more than PATTERNS column patterns (the
    colouring would cost more than it saves). Every column in one group where no row has two
    entries (an elementwise function), else first fit (see ``_first_fit``)."""
    n_cols = len(store.starts) - 1
    if not len(store.rows) or int(torch.bincount(store.rows).max()) <= 1:
        return torch.zeros(n_cols, dtype=torch.long), 1
    found = _first_fit(store, n_rows)
    return None if found is None else (found, int(found.max()) + 1)


def _first_fit(store: SparseRows, n_rows: int) -> torch.Tensor | None:
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
    if int(pattern.max()) >= PATTERNS:
        return None
    rows = store.rows.numpy()
    colours = np.zeros(n_cols, dtype=np.int64)
    used = np.zeros((n_rows, 64), dtype=bool)  # per row: the colours taken there
    for cols in sorted(_members(pattern, int(pattern.max()) + 1 if n_cols else 0), key=lambda m: int(m[0])):
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
        colours[cols.numpy()] = take
    return torch.from_numpy(colours)


def _rounding(outputs: list[torch.Tensor], inputs: list[torch.Tensor], eps: float) -> float:
    """How far the two moves' quotients of an element may differ by rounding alone: NOISE ulps (of the
    arguments' dtype) of the largest output, over eps (inf where an output is not finite: no limit)."""
    largest = max((float(real_view(o.detach()).abs().max()) for o in outputs if o.numel()), default=0.0)
    ulp = max((torch.finfo(x.dtype).eps for x in inputs), default=torch.finfo(torch.float64).eps)
    return NOISE * ulp * largest / eps if math.isfinite(largest) else math.inf


def weights(n: int, gen: torch.Generator) -> torch.Tensor:
    """The second moves' weights, one per column: magnitude uniform in [1, 2), random sign."""
    sign = torch.randint(0, 2, (n,), generator=gen, dtype=torch.float64).mul_(2).sub_(1)
    return torch.rand(n, dtype=torch.float64, generator=gen).add_(1).mul_(sign)


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


class Groups:
    """The groups of one check's numerical columns, each evaluated (four forwards) and accepted or not;
    ``fold`` gives an ``Entry`` the numerical columns of a span, from the groups or made one by one."""

    def __init__(self, columns: Columns, store: SparseRows, atol: float, rtol: float, gen: torch.Generator,
                 outputs: list[torch.Tensor]) -> None:
        self.columns, self.store, self.layout = columns, store, columns.layout
        self.atol, self.rtol = atol, rtol
        self.rounding = _rounding(outputs, self.layout.inputs, columns.eps)
        found = colour(store, self.layout.n_rows)
        self.coloured = found is not None  # else too many column patterns to colour: not worthwhile
        self.colours, self.n_groups = found if found is not None else (torch.zeros(0, dtype=torch.long), 0)
        n = self.layout.n_cols
        self.weights = weights(n, gen)
        self.weights2 = weights(n, gen)  # a third move's, for the groups the other two leave in doubt
        self.batched: bool | None = None if columns.batched else False
        self.members: list[torch.Tensor] = []  # the columns of each group, once evaluated
        self.ok = torch.zeros(0, dtype=torch.bool)  # per group evaluated (``members``), whether it was accepted
        self.numerical = torch.zeros(0, dtype=torch.float64)  # per analytical entry, once evaluated

    @property
    def accepted(self) -> torch.Tensor:
        """Per column, whether its latest group (after ``evaluate``, and ``narrow``) was accepted."""
        return self.ok[self.colours]

    def worthwhile(self) -> bool:
        """Fewer forwards than two per column, and the groups' rows (five float64 values per group and row
        at most) fit in half the memory budget (the share that dense analytical rows would hold)."""
        fits = 5 * 8 * self.n_groups * self.layout.n_rows <= self.columns.memory_bytes // 2
        return self.coloured and fits and PASSES * self.n_groups < 2 * self.layout.n_cols

    def evaluate(self) -> None:
        """Every group's four forwards and its verdict: ``accepted`` per column, and ``numerical`` per
        analytical entry the unit moves' quotient there (the numerical Jacobian's entries where a group
        is accepted: its other entries are exactly zero)."""
        self.members = _members(self.colours, self.n_groups)
        self.numerical = torch.empty(len(self.store.vals), dtype=torch.float64)
        self._evaluate(0)

    def narrow(self) -> None:
        """Halve each group that was not accepted and has more than LEAF columns, evaluate the halves
        as groups (the same four forwards and the same rule: a subset of a group is a group), and
        again for the halves not accepted: a wrong gradient in a few elements of a large group leaves
        only those elements' columns to be made one by one, not the whole group's (an elementwise
        function's one group of 50,000 columns: about 150 forwards instead of 100,000). Where most
        elements are wrong, about a sixth more forwards than the columns one by one."""
        first = 0
        while True:
            failed = [k for k in range(first, len(self.members)) if not self.ok[k] and len(self.members[k]) > LEAF]
            if not failed:
                return
            first = len(self.members)
            for k in failed:
                cols = self.members[k]
                for half in (cols[: len(cols) // 2], cols[len(cols) // 2 :]):
                    self.colours[half] = len(self.members)
                    self.members.append(half)
            self._evaluate(first)

    def _evaluate(self, first: int) -> None:
        """Groups ``first``.. of ``members``, a stage of groups at a time: their verdicts into ``ok``."""
        g, m = len(self.members), self.layout.n_rows
        ok = torch.empty(g - first, dtype=torch.bool)
        row_bytes = 16 * (sum(real_numel(x) for x in self.layout.inputs) + 2 * m)
        step = max(1, stage_size(COL_STAGE, row_bytes, self.columns.memory_bytes, GROUP_STAGE_BYTES) // 2)  # groups
        with torch.no_grad():
            for k0 in range(first, g, step):
                k1 = min(g, k0 + step)
                ok[k0 - first : k1 - first] = self._accepted(k0, k1, *self._stage(k0, k1, [None, self.weights]))
        self.ok = torch.cat([self.ok[:first], ok])

    def _accepted(self, k0: int, k1: int, unit: torch.Tensor, weighted: torch.Tensor) -> torch.Tensor:
        """Whether each of groups k0..k1 agrees with its analytical entries in both moves (``unit``,
        ``weighted``: groups x rows), each entry within atol + rtol |n| (as ``stats.Entry``
        compares) and the moves within ``rounding`` of each other there (see ``_curved`` for those
        that are not), and every other row exactly zero (NaN agrees with nothing); their entries'
        unit quotients into ``numerical``."""
        cols = torch.cat(self.members[k0:k1])
        at, counts, repeats = self._entries_of(cols)
        mine = self.colours[cols] - k0
        group = torch.repeat_interleave(mine, repeats)
        place = group * unit.shape[1] + self.store.rows.index_select(0, at)  # in a group x rows array
        want = self.store.vals.index_select(0, at)
        got, got_weighted = (q.reshape(-1).index_select(0, place) for q in (unit, weighted))
        self.numerical.index_copy_(0, at, got)
        w = torch.repeat_interleave(self.weights[cols], repeats)
        scaled = got_weighted / w
        bad = _groups(~self._within(want, got).logical_and_(self._within(want, scaled)), group, k1 - k0)
        sizes = torch.zeros(k1 - k0, dtype=torch.long).index_add_(0, mine, counts)  # each (group, row): one entry
        rows_left = bool((sizes < unit.shape[1]).any())  # at most, so rows without one exist: they must be zero
        if rows_left:
            bad |= _elsewhere(((unit, got), (weighted, got_weighted)), group, k1 - k0)
        gap = torch.sub(scaled, got)  # (2) / w - (1) at each entry
        apart = _groups(~(gap.abs() <= self.rounding), group, k1 - k0) & ~bad
        if bool(apart.any()):  # a gradient left out beside an entry, or a curvature, moves them apart
            third = self._stage(k0, k1, [self.weights2])[0]
            w2 = torch.repeat_interleave(self.weights2[cols], repeats)
            bad |= apart & ~self._curved(third, place, want, got, gap, w, w2, group, rows_left, k1 - k0)
        return ~bad

    def _curved(self, third: torch.Tensor, place: torch.Tensor, want: torch.Tensor, got: torch.Tensor,
                gap: torch.Tensor, w: torch.Tensor, w2: torch.Tensor, group: torch.Tensor,
                rows_left: bool, n: int) -> torch.Tensor:
        """Per group of a stage whose two moves are apart at an entry by more than rounding, whether only
        the finite differences' third-order term puts them apart (``gap``: (2) / w - (1) at each entry): a
        third move (``third``, weights ``w2`` at the entries) within the tolerance and exactly zero
        elsewhere, like the others, and the three quotients at each entry on one line in the square of
        the step (that term is the third derivative times eps^2 w^2 / 6; a gradient h left out beside the
        entry adds (w_k / w_j - 1) h and (w2_k / w2_j - 1) h instead, off that line). A sine of 50 x or
        a log near 0 stays compressed."""
        got_third = third.reshape(-1).index_select(0, place)
        scaled2 = got_third / w2
        a, b = w * w - 1, w2 * w2 - 1  # each step's square, less the unit move's
        off_line = torch.mul(gap, b).sub_(torch.sub(scaled2, got).mul_(a)).abs_()
        bad = _groups(~self._within(want, scaled2).logical_and_(off_line <= CURVED * self.rounding), group, n)
        if rows_left:
            bad |= _elsewhere(((third, got_third),), group, n)
        return ~bad

    def _entries_of(self, cols: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, int | torch.Tensor]:
        """The places in the store of the entries of columns ``cols``, column by column, each column's
        number of entries, and those counts as ``repeat_interleave`` takes them fastest (one number
        where every column has as many entries, as a Linear layer's: 4x faster)."""
        starts = self.store.bounds[cols]
        counts = self.store.bounds[cols + 1] - starts
        least, most = (int(v) for v in torch.aminmax(counts)) if len(counts) else (0, 0)
        if least == most:
            return (starts.unsqueeze(1) + torch.arange(most)).view(-1), counts, most
        offset = torch.repeat_interleave(starts - (torch.cumsum(counts, 0) - counts), counts)
        return torch.arange(int(counts.sum())) + offset, counts, counts

    def fold(self, entry: Entry, lo: int, hi: int, probe: torch.Tensor, chunk: int) -> None:
        """Columns lo..hi (one argument's) into ``entry``: the spans of accepted groups' columns as
        their entries alone, each chunk (of ``chunk`` columns, as without compression) where a
        group was not accepted with its columns made one by one."""
        bad = (~self.accepted[lo:hi]).nonzero().view(-1).add_(lo).floor_divide_(chunk).unique().tolist()
        c0 = lo
        for k in [*bad, None]:
            end = hi if k is None else max(lo, k * chunk)
            for p, q in self._pieces(c0, end, chunk):  # accepted, as their entries alone: all agree
                first, last = self.store.starts[p], self.store.starts[q]
                spans = [self.store.starts[j] - first for j in range((p // chunk + 1) * chunk, q, chunk)]
                n = self.numerical[first:last]
                if not entry.update_agreed(self.store.vals[first:last], n, (q - p, self.layout.n_rows), p - lo,
                                           partial(self._place, p), spans=spans):
                    c, r, v = self.store.entries(p, q)
                    entry.update_entries(c, r, v, n, (q - p, self.layout.n_rows), p - lo, probe, spans=spans,
                                         extras=False)
                entry.defer(partial(self._extras, p, q, n, p - lo, probe))
            if k is not None:
                c0 = min(hi, (k + 1) * chunk)
                self._fold_made(entry, max(lo, k * chunk), c0, lo, probe)

    def _place(self, p: int, k: int) -> tuple[int, int]:
        """Entry k of the columns from p on: its column (less p) and its row."""
        at = self.store.starts[p] + k
        return bisect.bisect_right(self.store.starts, at) - 1 - p, int(self.store.rows[at])

    def _extras(self, p: int, q: int, n: torch.Tensor, col0: int, probe: torch.Tensor, entry: Entry) -> None:
        """The per-column errors and the probe's projections of columns p..q, folded without them (the
        columns and rows read from the store again rather than kept: 16 bytes an entry)."""
        c, r, v = self.store.entries(p, q)
        entry.add_extras(c, r, v, n, q - p, col0, probe)

    def _pieces(self, c0: int, end: int, chunk: int) -> Iterator[tuple[int, int]]:
        """Columns c0..end in pieces of whole chunks holding about PIECE entries at most (one chunk at least):
        the statistics' temporaries are a dozen copies of a piece."""
        starts = self.store.starts
        while c0 < end:
            most = bisect.bisect_right(starts, starts[c0] + PIECE, c0, end + 1) - 1  # columns c0..most fit
            q = min(end, max((most // chunk) * chunk, (c0 // chunk + 1) * chunk))
            yield c0, q
            c0 = q

    def _fold_made(self, entry: Entry, lo: int, hi: int, first: int, probe: torch.Tensor) -> None:
        """Columns lo..hi into ``entry`` (the argument's columns start at ``first``), those of the groups
        not accepted made one by one."""
        c, r, v = self.store.entries(lo, hi)
        ok = self.accepted[lo:hi]
        n = torch.zeros(hi - lo, self.layout.n_rows, dtype=torch.float64)
        mine = ok[c]
        n[c[mine], r[mine]] = self.numerical[self.store.starts[lo] : self.store.starts[hi]][mine]
        for j0, j1 in _runs((~ok).nonzero().view(-1).tolist()):
            n[j0:j1] = self.columns.columns(lo + j0, lo + j1)
        entry.update_sparse(c, r, v, n, lo - first, probe)

    def _within(self, want: torch.Tensor, got: torch.Tensor) -> torch.Tensor:
        """|want - got| <= atol + rtol |got|, as ``stats.Entry`` compares; NaN is within nothing."""
        return torch.sub(want, got).abs_() <= got.abs().mul_(self.rtol).add_(self.atol)

    def _stage(self, k0: int, k1: int, moves: list[torch.Tensor | None]) -> torch.Tensor:
        """Groups k0..k1's quotients (moves x groups x rows) for each of ``moves`` (None: every element by
        eps; else by eps times its weight there): batched, or two single calls per group and move."""
        got, self.batched = try_batched(self.batched, partial(self._batched, k0, k1, moves),
                                        partial(self._groups_agree, k0, moves))
        if got is not None:
            return got
        return torch.stack([torch.stack([self._single(k, weights) for k in range(k0, k1)]) for weights in moves])

    def _groups_agree(self, k0: int, moves: list[torch.Tensor | None], got: torch.Tensor) -> bool:
        """A batched stage's quotients are single calls' quotients: compared on its first group."""
        single = torch.stack([self._single(k0, weights) for weights in moves])
        return same(got[:, 0], single)

    def _parts(self, k: int, weights: torch.Tensor | None) -> list[tuple[torch.Tensor, torch.Tensor, torch.Tensor]]:
        """(argument, real indices, weights: ones for None) of group ``k``'s elements, argument by argument."""
        cols = self.members[k]
        starts = self.layout.col_starts
        parts = []
        for i, x in enumerate(self.layout.inputs):
            mine = cols[(cols >= starts[i]) & (cols < starts[i + 1])]
            if len(mine):
                w = weights[mine] if weights is not None else torch.ones(len(mine), dtype=torch.float64)
                parts.append((x, mine - starts[i], w))
        return parts

    def _single(self, k: int, weights: torch.Tensor | None) -> torch.Tensor:
        """Group ``k``'s difference quotient from two single calls; NaN where a call raises (the weighted
        move goes up to 2 eps: past a domain edge that a column's own move of eps does not reach), so
        that the group is not accepted and its columns are made one by one, where a forward that
        fails there too fails the check as without compression."""
        move = GroupMove(self._parts(k, weights))
        read = lambda outs: outputs_vector(outs, self.layout.outputs).cpu()  # noqa: E731
        try:
            minus = call_moved(self.columns.call, self.columns.values, move.to(-self.columns.eps), read)
            plus = call_moved(self.columns.call, self.columns.values, move.to(self.columns.eps), read)
        except Exception:  # noqa: BLE001 - any failure of a group's call: its columns one by one
            return torch.full((self.layout.n_rows,), math.nan, dtype=torch.float64)
        return (plus - minus) / (2 * self.columns.eps)

    def _batched(self, k0: int, k1: int, moves: list[torch.Tensor | None]) -> torch.Tensor:
        """Groups k0..k1's quotients (moves x groups x rows) from one vmapped forward: batch row
        2 M (k - k0) + 2 m + plus moves group k by move m (M moves)."""
        per = 2 * len(moves)
        n, eps = per * (k1 - k0), self.columns.eps
        batches: Batches = {}
        cols = torch.cat(self.members[k0:k1])
        base = per * (self.colours[cols] - k0)
        starts = self.layout.col_starts
        for i, x in enumerate(self.layout.inputs):
            mine = (cols >= starts[i]) & (cols < starts[i + 1])
            if bool(mine.any()):
                index, row = cols[mine] - starts[i], base[mine]
                batch = copies(batches, x, n)
                x0 = batch[0, index].to(torch.float64)  # every batch row is a copy of the argument
                for m, weights in enumerate(moves):
                    step = eps if weights is None else eps * weights[cols[mine]]
                    batch[row + 2 * m, index] = (x0 - step).to(batch.dtype)
                    batch[row + 2 * m + 1, index] = (x0 + step).to(batch.dtype)
        assert self.columns.batched is not None  # self.batched is False without it
        flat = vmapped(self.columns.batched, self.columns.values, batches, self.layout.outputs).to("cpu", torch.float64)
        quotients = torch.empty(len(moves), k1 - k0, flat.shape[1], dtype=torch.float64)
        for m in range(len(moves)):
            torch.sub(flat[2 * m + 1 :: per], flat[2 * m :: per], out=quotients[m]).div_(2 * eps)
        return quotients


def _groups(failed: torch.Tensor, group: torch.Tensor, n: int) -> torch.Tensor:
    """Per group of a stage (``n`` of them), whether an entry of it (entries' groups: ``group``) ``failed``."""
    bad = torch.zeros(n, dtype=torch.bool)
    if bool(failed.any()):
        bad.index_fill_(0, group[failed], True)
    return bad


def _elsewhere(moves: tuple[tuple[torch.Tensor, torch.Tensor], ...], group: torch.Tensor, n: int) -> torch.Tensor:
    """Per group of a stage, whether a move (groups x rows, and its values at the entries) is not exactly zero
    in a row where the group has no analytical entry."""
    bad = torch.zeros(n, dtype=torch.bool)
    for moved, at_entries in moves:
        elsewhere = (moved != 0).sum(1) - torch.bincount(group[at_entries != 0], minlength=n)
        bad |= elsewhere != 0
    return bad


def _runs(cols: list[int]) -> list[tuple[int, int]]:
    """Sorted column numbers as runs (first, end) of consecutive ones."""
    runs: list[tuple[int, int]] = []
    for j in cols:
        if runs and runs[-1][1] == j:
            runs[-1] = (runs[-1][0], j + 1)
        else:
            runs.append((j, j + 1))
    return runs


def _members(colours: torch.Tensor, n_groups: int) -> list[torch.Tensor]:
    """The columns of each group, in order."""
    order = torch.from_numpy(np.argsort(colours.numpy(), kind="stable"))  # torch's stalls on 2 busy threads
    counts = torch.bincount(colours, minlength=n_groups).tolist()
    return list(torch.split(order, counts))


