"""The analytical side compressed: the non-zero entries of the Jacobian from a few backward calls
with grouped grad_outputs, where a one-hot grad_output per output element would take one each.

A group of output elements whose analytical rows share no column ("structurally orthogonal") can
share one backward call: with grad_output 1 at every element of the group, each column receives
the entry of the one row that has it, the very number that row's own one-hot call gives there.
Which row that is needs no pattern known in advance: two more calls, with grad_output w_r and
w'_r at each element r, give in each column w_r and w'_r times that entry, and the ratios to the
first call name r. w_r = 1 + (r + 1/2 + j_r) / M (M rows, j_r random in [-1/4, 1/4)) is read back
as r = floor((ratio - 1) M) and then confirmed to 1e-12; w'_r is random, uniform in [1, 2). A
column that two rows of the group reach has ratios that are mixtures, which name no row of the
group (unless both mixtures fall within 1e-12 of one row's pair of random weights), and the whole
group is then taken one-hot, row by row.

The groups are guessed from the output's shape: first all its elements at once (an elementwise
function, a sum over rows), else its wrapped diagonals, the elements whose indices add up to
the same s modulo the longest dimension (a Linear layer's y[i, k] depends on x[i, :], W[k, :] and
b[k]: a diagonal has one i and one k each). The guess never changes an entry, only how many calls
are made: when most diagonals are taken one-hot, or the output's gradients are not float64 (the
ratios would not be exact enough to name rows), the caller makes the one-hot pass instead
(``rows.Rows.sparse_rows``). Pure torch.
"""

from __future__ import annotations

import torch

from .batching import ROW_GROUP_STAGE_BYTES, ROW_STAGE, stage_size
from .realify import real_numel, real_view, unravel
from .rows import Rows, SparseRows, from_keys

EXACT = 1e-12  # relative: a single row's ratios are its weights to within a few roundings
CALLS = 3  # backward calls per group: unit, weights w, weights w'


class RowGroups:
    """The analytical Jacobian's non-zero entries from grouped backward calls (see the module)."""

    def __init__(
        self,
        rows: Rows,
        gen: torch.Generator,
        limit: int,
        at_once: bool = False,
        tried: bool = False,
        parts: list[int] | None = None,
    ) -> None:
        """``at_once``: only the guess of every element of an output in one group (``store`` is None
        where it fails for an output); ``tried``: that guess failed before, start with the diagonals.
        ``parts``: where each argument's columns start (and the end): past ``limit`` entries, the pass
        goes on counting each argument's entries without keeping them (at least, see ``_groups``), until one
        argument alone has more (``too_many``); where none has, ``counted`` is set and ``per_part`` holds each
        one's count (a block planned from them that does not fit after all finds that out on its own)."""
        self.rows, self.layout, self.limit = rows, rows.layout, limit
        self.at_once, self.tried = at_once, tried
        self.calls = 0  # backward calls made
        n = self.layout.n_rows
        self.w = torch.rand(2, n, dtype=torch.float64, generator=gen).add_(1)
        self.w[0].sub_(1.5).div_(2).add_(torch.arange(n, dtype=torch.float64)).add_(0.5).div_(n).add_(1)  # w_r
        self.group = torch.full((n,), -1, dtype=torch.long)  # per row: its group's place in the stage decoded
        # the entries found, as (column x rows + row, value), in buffers grown by doubling (one mapping each,
        # handed back whole: a list of small pieces fragments the heap)
        self.keys, self.vals = torch.empty(0, dtype=torch.long), torch.empty(0, dtype=torch.float64)
        self.count = 0
        self.too_many = False  # ``store`` gave up on finding more than ``limit`` entries (each entry once)
        self.parts = torch.tensor(parts[1:-1], dtype=torch.long) if parts is not None else None
        self.per_part = torch.zeros(len(parts) - 1 if parts is not None else 1, dtype=torch.long)
        self.counted = False  # the pass went through, past ``limit`` entries, every argument within it
        row_bytes = sum(o.numel() * o.element_size() for o in rows.live) + 8 * self.layout.n_cols * 2
        stage = stage_size(ROW_STAGE, row_bytes, rows.memory_bytes, ROW_GROUP_STAGE_BYTES)
        self.stage = max(1, stage // CALLS)  # groups

    @staticmethod
    def applies(rows: Rows) -> bool:
        """Whether grouping can be exact: float64 (or complex128) gradients and outputs."""
        exact = (torch.float64, torch.complex128)
        return bool(rows.live) and all(t.dtype in exact for t in [*rows.live, *rows.grad_inputs])

    def store(self) -> SparseRows | None:
        """The non-zero entries, or None when grouping does not pay (most groups overlap) or there
        are more than ``limit`` of them."""
        k = 0
        for out in self.rows.outputs:
            if out.requires_grad and not self._output(out, k):
                return None
            k += real_numel(out)
        if self.parts is not None and self.count > self.limit:  # counted, not kept: each argument fits alone
            self.counted = True
            return None
        keys, vals = self.keys[: self.count], self.vals[: self.count]
        self.keys = self.vals = torch.empty(0)  # one copy of the entries at a time
        return from_keys(keys, vals, self.layout.n_rows, self.layout.n_cols)

    def _output(self, out: torch.Tensor, k: int) -> bool:
        """The entries of output ``out`` (its rows start at row ``k``) into the buffers; False to give up."""
        shape = real_view(out).shape
        m = real_numel(out)
        if m == 1:
            return self._one_hot(out, k, torch.arange(1))
        if not self.tried and not self._groups(out, k, [torch.arange(m)]):
            return True
        if self.at_once:
            return False
        longest = max(shape, default=1)
        if longest * 4 > m:  # diagonals of a few elements each: as many calls as one-hot rows
            return self._one_hot(out, k, torch.arange(m))
        index = torch.stack(unravel(torch.arange(m), shape))
        diagonal = index.sum(0) % longest
        order = torch.argsort(diagonal, stable=True)
        groups = list(torch.split(order, torch.bincount(diagonal, minlength=longest).tolist()))
        self._grow(self.count + min(self.limit, len(groups) * self.layout.n_cols))  # at most one entry a column
        overlapping = self._groups(out, k, groups)
        self.too_many = self._hopeless()
        if len(overlapping) * 2 > len(groups) or self.too_many:
            return False
        return all(self._one_hot(out, k, members) for members in overlapping)

    def _groups(self, out: torch.Tensor, k: int, groups: list[torch.Tensor]) -> list[torch.Tensor]:
        """The entries of ``groups`` (real indices into ``out``) into the buffers; returns the groups
        that overlap (they add nothing). Stops once more than ``limit`` entries are found (of one argument,
        with ``parts``): the store cannot hold them, whatever the other groups hold (``too_many``). Past
        ``limit`` with ``parts``, a group takes its unit call alone and counts the columns it reaches, each
        of which holds at least one of its entries: a lower bound on each argument's entries."""
        overlapping = []
        for g0 in range(0, len(groups), self.stage):
            stage = groups[g0 : g0 + self.stage]
            counting = self.parts is not None and self.count > self.limit
            try:
                got = self.rows.products(self._grad_outputs(out, k, stage, 1 if counting else CALLS))
            except Exception:  # noqa: BLE001 - a backward that fails on grouped grad_outputs: one-hot rows,
                overlapping += stage  # where a backward that fails there too fails the check as before
                continue
            self.calls += len(got)
            if counting:
                self._count(got.ne(0))  # NaN counts as non-zero
            else:
                overlapping += self._decode(got, [k + members for members in stage], stage)
            if self._hopeless():
                break
        return overlapping

    def _grad_outputs(
        self, out: torch.Tensor, k: int, stage: list[torch.Tensor], calls: int = CALLS
    ) -> list[torch.Tensor]:
        """Per group of ``stage``: grad_outputs 1, w and w' at its elements of ``out`` (0 elsewhere, and
        in the other outputs); the first ``calls`` of them."""
        grads, flat = self._blank(out, calls * len(stage))
        members = torch.cat(stage)
        sizes = torch.tensor([len(m) for m in stage])
        unit = torch.repeat_interleave(torch.arange(len(stage)), sizes)  # the unit calls first, then the w, the w'
        flat[unit, members] = 1
        for i in range(1, calls):
            flat[unit + i * len(stage), members] = self.w[i - 1, k + members].to(flat)
        return grads

    def _count(self, reached: torch.Tensor) -> None:
        """A stage's unit calls' columns reached (groups x columns) into ``count`` and ``per_part``."""
        assert self.parts is not None
        starts = [0, *self.parts.tolist(), reached.shape[1]]
        found = torch.stack([reached[:, a:b].sum() for a, b in zip(starts, starts[1:])])
        self.per_part += found
        self.count += int(found.sum())

    def _decode(self, got: torch.Tensor, rows: list[torch.Tensor], stage: list[torch.Tensor]) -> list[torch.Tensor]:
        """The entries of a stage of groups (``rows``: each group's rows; ``got``: their three products
        each) into the buffers; returns the groups of ``stage`` whose ratios name no single row of
        the group for some column."""
        n_cols, n = got.shape[1], self.layout.n_rows
        got = got.contiguous()
        products = got.view(CALLS, len(rows), n_cols)  # the unit products, the w products, the w' products
        if int(torch.count_nonzero(got)) == got.numel():  # every group reaches every column (a Linear layer's
            g = torch.arange(len(rows)).repeat_interleave(n_cols)  # diagonals): no search
            cols = torch.arange(n_cols).repeat(len(rows))
            value, first, second = (products[i].view(-1) for i in range(CALLS))
        else:
            moved = (products[0] != 0) | (products[1] != 0) | (products[2] != 0)  # NaN counts as non-zero
            g, cols = moved.nonzero(as_tuple=True)
            at = g * n_cols + cols  # the group's unit product in ``got``
            flat = got.view(-1)
            value, first, second = (flat.index_select(0, at + i * len(rows) * n_cols) for i in range(CALLS))
            del at, moved
        for i, members in enumerate(rows):
            self.group[members] = i
        ratio = first.div_(value)
        row = ratio.sub(1).mul_(n).nan_to_num_(0.0, 0.0, 0.0).clamp_(0, n - 1).long()  # floor: not negative
        w, w2 = self.w[0].index_select(0, row), self.w[1].index_select(0, row)
        named = (ratio.sub_(w).abs_() <= w.mul_(EXACT)) & (self.group.index_select(0, row) == g)
        named &= second.div_(value).sub_(w2).abs_() <= w2.mul_(EXACT)
        del ratio, w, w2
        for members in rows:
            self.group[members] = -1
        if bool(named.all()):
            self._keep(cols, row, value)
            return []
        bad = torch.zeros(len(rows), dtype=torch.bool).index_fill_(0, g[~named], True)
        good = ~bad[g]
        self._keep(cols[good], row[good], value[good])
        return [members for members, b in zip(stage, bad.tolist()) if b]

    def _hopeless(self) -> bool:
        """More entries found than the store holds: of all the arguments, or with ``parts`` of one of them."""
        return bool(self.per_part.max() > self.limit) if self.parts is not None else self.count > self.limit

    def _keep(self, cols: torch.Tensor, rows: torch.Tensor, vals: torch.Tensor) -> None:
        """Entries into the buffers (with ``parts``, past ``limit`` only counted)."""
        end = self.count + len(cols)
        if self.parts is not None:
            self.per_part += torch.bincount(torch.bucketize(cols, self.parts, right=True), minlength=len(self.per_part))
            if end > self.limit:
                self.count = end
                return
        if end > len(self.keys):
            self._grow(max(end, 2 * len(self.keys), 2**16))
        self.keys[self.count : end] = cols * self.layout.n_rows + rows
        self.vals[self.count : end] = vals
        self.count = end

    def _grow(self, size: int) -> None:
        if size <= len(self.keys):
            return
        keys, vals = torch.empty(size, dtype=torch.long), torch.empty(size, dtype=torch.float64)
        keys[: self.count], vals[: self.count] = self.keys[: self.count], self.vals[: self.count]
        self.keys, self.vals = keys, vals

    def _blank(self, out: torch.Tensor, batch: int) -> tuple[list[torch.Tensor], torch.Tensor]:
        """A batch of zero grad_outputs for every output that requires grad, and the one of ``out`` as
        flat real rows (batch x real numel), to write into."""
        grads = [torch.zeros((batch,) + o.shape, dtype=o.dtype, device=o.device) for o in self.rows.live]
        mine = grads[next(i for i, o in enumerate(self.rows.live) if o is out)]
        return grads, (torch.view_as_real(mine) if mine.is_complex() else mine).view(batch, -1)

    def _one_hot(self, out: torch.Tensor, k: int, members: torch.Tensor) -> bool:
        """The rows ``members`` of ``out`` one by one (batched as ``products`` may); False past ``limit``."""
        for r0 in range(0, len(members), CALLS * self.stage):
            part = members[r0 : r0 + CALLS * self.stage]
            grads, flat = self._blank(out, len(part))
            flat[torch.arange(len(part)), part] = 1
            got = self.rows.products(grads)
            self.calls += len(got)
            r, c = got.nonzero(as_tuple=True)  # NaN counts as non-zero
            self._keep(c, k + part[r], got[r, c])
            if self._hopeless():
                self.too_many = True
                return False
        return True
