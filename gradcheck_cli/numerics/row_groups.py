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

import numpy as np
import torch

from .batching import ROW_GROUP_STAGE_BYTES, ROW_STAGE, device_cap, stage_size
from .realify import real_numel, real_view, unravel
from .rows import SORT_BYTES, Rows, SparseRows, from_keys, sorted_there
from .transfer import sent

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
        # the products are decoded where backward gives them: the weights, the rows' groups and the entries found
        self.device = rows.grad_inputs[0].device if rows.grad_inputs else torch.device("cpu")
        self.w_there = torch.as_tensor(self.w, device=self.device)
        self.group = torch.full((n,), -1, dtype=torch.long, device=self.device)  # per row: its group in the stage
        # the entries found, as (column x rows + row, value), in buffers grown by doubling (one mapping each,
        # handed back whole: a list of small pieces fragments the heap), sized from an upper bound on the entries
        # found (``bound``), their last place a sink where the entries not kept are written
        self.keys = torch.empty(1, dtype=torch.long, device=self.device)
        self.vals = torch.empty(1, dtype=torch.float64, device=self.device)
        self.count = 0  # entries found, as the host last read it (``_read``): exact outside ``_groups``
        self.found = torch.zeros((), dtype=torch.long, device=self.device)  # entries found, where they are
        self.bound = 0  # at least ``found``: the host's bound, read (``_read``) only where it passes ``limit``
        self.too_many = False  # ``store`` gave up on finding more than ``limit`` entries (each entry once)
        self.parts = torch.tensor(parts[1:-1], dtype=torch.long) if parts is not None else None
        self.per_part = torch.zeros(len(parts) - 1 if parts is not None else 1, dtype=torch.long)  # as last read
        self.part_found = torch.zeros(len(self.per_part), dtype=torch.long, device=self.device)  # where they are
        self.counted = False  # the pass went through, past ``limit`` entries, every argument within it
        row_bytes = sum(o.numel() * o.element_size() for o in rows.live) + 8 * self.layout.n_cols * 2
        cap = device_cap(ROW_GROUP_STAGE_BYTES, self.device)
        stage = stage_size(ROW_STAGE, row_bytes, rows.memory_bytes, cap)
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
        n_rows, n_cols = self.layout.n_rows, self.layout.n_cols
        if self.device.type == "cuda" and SORT_BYTES * self.count <= torch.cuda.mem_get_info(self.device)[0] // 2:
            keys, vals = self.keys[: self.count], self.vals[: self.count]  # sorted where they are (a GPU sorts fast)
            self.keys = self.vals = torch.empty(0)
            return sorted_there(keys, vals, n_rows, n_cols)  # the structure to the host, the values left there
        keys, vals = self.keys[: self.count].cpu(), self.vals[: self.count].cpu()  # the store is on the host
        self.keys = self.vals = torch.empty(0)  # one copy of the entries at a time
        return from_keys(keys, vals, n_rows, n_cols)

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
        stages: list[tuple[list[torch.Tensor], torch.Tensor | None]] = []  # per stage: whether each group overlaps
        for g0 in range(0, len(groups), self.stage):
            stage = groups[g0 : g0 + self.stage]
            counting = self.parts is not None and self.count > self.limit
            try:
                got = self.rows.products(self._grad_outputs(out, k, stage, 1 if counting else CALLS))
            except Exception:  # noqa: BLE001 - a backward that fails on grouped grad_outputs: one-hot rows,
                stages.append((stage, None))  # where a backward that fails there too fails the check as before
                continue
            self.calls += len(got)
            if counting:
                self._count(got.ne(0))  # NaN counts as non-zero
            else:
                stages.append((stage, self._decode(got, [k + members for members in stage])))
                self.bound += len(stage) * got.shape[1]  # a named group has one entry a column at most
                if self.bound > self.limit:  # then more may have been found than ``limit``: read
                    self._read()
            if self._hopeless():
                break
        # the entries found and which groups overlap, read once for every stage
        flags = [f.to(torch.long) for _, f in stages if f is not None]
        read = torch.cat([*flags, self.part_found, self.found.view(1)]).tolist()
        self.count = self.bound = read[-1]
        self.per_part = torch.tensor(read[-1 - len(self.per_part) : -1], dtype=torch.long)
        overlapping, at = [], 0
        for stage, f in stages:
            if f is None:
                overlapping += stage
                continue
            overlapping += [members for members, b in zip(stage, read[at : at + len(stage)]) if b]
            at += len(stage)
        return overlapping

    def _read(self) -> None:
        """The entries found, read: ``count`` exact, and ``bound`` too, and ``per_part``."""
        read = torch.cat([self.part_found, self.found.view(1)]).tolist()
        self.count = self.bound = read[-1]
        self.per_part = torch.tensor(read[:-1], dtype=torch.long)

    def _grad_outputs(
        self, out: torch.Tensor, k: int, stage: list[torch.Tensor], calls: int = CALLS
    ) -> list[torch.Tensor]:
        """Per group of ``stage``: grad_outputs 1, w and w' at its elements of ``out`` (0 elsewhere, and
        in the other outputs); the first ``calls`` of them."""
        grads, flat = self._blank(out, calls * len(stage))
        members = torch.cat(stage)
        sizes = torch.tensor([len(m) for m in stage])
        # the unit calls first, then the w, the w'
        unit = torch.repeat_interleave(torch.arange(len(stage)), sizes, output_size=len(members))
        at, there = sent(unit, flat.device), sent(members, flat.device)
        flat[at, there] = 1
        for i in range(1, calls):
            flat[at + i * len(stage), there] = sent(self.w[i - 1, k + members], flat.device).to(flat.dtype)
        return grads

    def _count(self, reached: torch.Tensor) -> None:
        """A stage's unit calls' columns reached (groups x columns) into ``count`` and ``per_part``."""
        assert self.parts is not None
        starts = [0, *self.parts.tolist(), reached.shape[1]]
        found = torch.stack([reached[:, a:b].sum() for a, b in zip(starts, starts[1:])]).cpu()
        self.per_part += found
        self.count = self.bound = self.count + int(found.sum())
        self.found.fill_(self.count)
        self.part_found.copy_(self.per_part)

    def _decode(self, got: torch.Tensor, rows: list[torch.Tensor]) -> torch.Tensor:
        """The entries of a stage of groups (``rows``: each group's rows; ``got``: their three products
        each) into the buffers, where the products are, without reading them; returns, per group, whether
        its ratios name no single row of the group for some column (its entries are then not kept)."""
        n_cols, n, g = got.shape[1], self.layout.n_rows, len(rows)
        products = got.contiguous().view(CALLS, g, n_cols)  # the unit products, the w products, the w' products
        value, first, second = products[0], products[1], products[2]
        moved = (value != 0) | (first != 0) | (second != 0)  # NaN counts as non-zero
        members = sent(torch.cat(rows), self.device)
        sizes = np.array([len(r) for r in rows])
        self.group[members] = sent(np.repeat(np.arange(g), sizes), self.device)
        ratio = first.div(value)
        row = ratio.sub(1).mul_(n).nan_to_num_(0.0, 0.0, 0.0).clamp_(0, n - 1).long()  # floor: not negative
        w, w2 = self.w_there[0][row], self.w_there[1][row]
        mine = self.group[row] == torch.arange(g, device=self.device).unsqueeze(1)
        named = (ratio.sub_(w).abs_() <= w.mul_(EXACT)) & mine
        named &= second.div(value).sub_(w2).abs_() <= w2.mul_(EXACT)
        del ratio, w, w2, mine
        self.group[members] = -1
        bad = (moved & ~named).any(1)
        keep = (moved & ~bad.unsqueeze(1)).view(-1)
        keys = (torch.arange(n_cols, device=self.device) * n + row).view(-1)  # column x rows + row
        self._put(keep, keys, value.reshape(-1))
        if self.parts is not None:  # each argument's entries
            part = sent(torch.bucketize(torch.arange(n_cols), self.parts, right=True), self.device)
            self.part_found.index_add_(0, part, keep.view(g, n_cols).sum(0))
        return bad

    def _put(self, keep: torch.Tensor, keys: torch.Tensor, vals: torch.Tensor) -> None:
        """The entries ``keep`` of ``keys`` and ``vals`` into the buffers after those found, where they are: each
        to its place (the entries kept before it, counted there), one past the buffers' end to their sink."""
        need = self.bound + len(keep)  # every entry kept fits (a stage that passes ``limit`` is kept whole)
        if need >= len(self.keys):  # doubling, within ``limit`` and a stage
            self._grow(max(need, min(2 * len(self.keys), self.limit + len(keep))))
        sink = len(self.keys) - 1
        place = torch.cumsum(keep, 0).add_(self.found - 1)
        self.keys[torch.where(keep, place, sink)] = keys
        self.vals[torch.where(keep, place, sink)] = vals
        self.found += keep.sum()

    def _hopeless(self) -> bool:
        """More entries found than the store holds: of all the arguments, or with ``parts`` of one of them."""
        if self.bound <= self.limit:  # none read: no argument has more than all of them
            return False
        return bool(self.per_part.max() > self.limit) if self.parts is not None else self.count > self.limit

    def _keep(self, cols: torch.Tensor, rows: torch.Tensor, vals: torch.Tensor) -> None:
        """Entries into the buffers (with ``parts``, past ``limit`` only counted); ``count`` is exact here."""
        end = self.count + len(cols)
        if self.parts is not None:
            parts = torch.bucketize(cols, self.parts.to(cols.device), right=True)
            self.per_part += torch.bincount(parts, minlength=len(self.per_part)).cpu()
            self.part_found.copy_(self.per_part)
            if end > self.limit:
                self.count = self.bound = end
                self.found.fill_(end)
                return
        if end >= len(self.keys):
            self._grow(max(end, 2 * len(self.keys), 2**16))
        self.keys[self.count : end] = cols * self.layout.n_rows + rows
        self.vals[self.count : end] = vals
        self.count = self.bound = end
        self.found.fill_(end)

    def _grow(self, size: int) -> None:
        """Buffers of ``size`` entries at least, and the sink after them (what they held kept, sink and all)."""
        if size < len(self.keys):
            return
        keys = torch.empty(size + 1, dtype=torch.long, device=self.device)
        vals = torch.empty(size + 1, dtype=torch.float64, device=self.device)
        keys[: len(self.keys)], vals[: len(self.vals)] = self.keys, self.vals
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
            self._keep(c, k + torch.as_tensor(part, device=r.device)[r], got[r, c])
            if self._hopeless():
                self.too_many = True
                return False
        return True
