"""The analytical side: rows J^T e_r of the Jacobian, one per one-hot grad_output e_r.

Rows are built transposed (C x M: a row per real input element), so that a block of columns is
contiguous. A row is one backward call, as torch.autograd.gradcheck makes it, or, where vmap gives
the same numbers, a stage of rows (at most ROW_STAGE, and within its share of the memory budget:
see ``batching.stage_size``) is one backward over a batch of one-hot grad_outputs
(``torch.func.vmap`` over ``torch.autograd.grad``). The first batched stage is compared with single
calls on a few rows; any difference or error turns batching off for the rest of the check. Where
the Jacobian is sparse, its non-zero entries can be kept instead of the dense rows (``SparseRows``).
Pure torch.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from functools import partial
from typing import Any

import torch

from . import engine
from .batching import ROW_STAGE, STAGE_BYTES, device_cap, same, stage_size, try_batched
from .jacobian_layout import Layout
from .realify import Vjp, real_flat, real_numel, real_view

# The store's bytes per entry: while it is built (the buffers of 64-bit keys and values, the sort's
# order and the rows it makes), and while it is held by the compressed check (32-bit rows, values,
# and the numerical values at them: on a GPU, the rows on the host and the values there); its size per
# column and the rows' limits are not per entry
BUILD_BYTES = 28
HELD_BYTES = 20


def store_limit(memory_bytes: int) -> int:
    """How many non-zero entries a check may store within ``memory_bytes``: the build's peak within seven
    eighths (nothing else large is held then), the held store within three quarters (the dense rows'
    share, which a stored Jacobian does not hold; the rest holds a stage of calls and the kept columns)."""
    return min(memory_bytes * 7 // 8 // BUILD_BYTES, memory_bytes * 3 // 4 // HELD_BYTES)


class SparseRows:
    """The non-zero entries of the analytical Jacobian, by column (then row), read a span of columns at
    a time: their rows (32-bit where they fit) and values, and where each column's entries start
    (``bounds``, a tensor, and ``starts``, a list); the columns themselves are implied (``entries``).
    The structure is on the host; the values on the host, or where they were found (``sorted_there``) and
    copied to the host once where a fold there first reads them (``host_vals``)."""

    def __init__(
        self, cols: torch.Tensor, rows: torch.Tensor, vals: torch.Tensor, n_cols: int, ordered: bool = False
    ) -> None:
        if not ordered:
            order = torch.argsort(cols, stable=True)
            cols, rows, vals = cols[order], rows[order], vals[order]
        bounds = torch.searchsorted(cols, torch.arange(n_cols + 1, dtype=cols.dtype))
        self._set(narrow_rows(rows), vals, bounds)

    @classmethod
    def by_column(cls, rows: torch.Tensor, vals: torch.Tensor, bounds: torch.Tensor) -> SparseRows:
        """A store from entries already by column then row, column j's at ``bounds[j]``..``bounds[j + 1]``."""
        store = cls.__new__(cls)
        store._set(narrow_rows(rows), vals, bounds)
        return store

    def _set(self, rows: torch.Tensor, vals: torch.Tensor, bounds: torch.Tensor) -> None:
        self.rows, self.vals, self.bounds = rows, vals, bounds.long()
        self._host_vals: torch.Tensor | None = vals if vals.device.type == "cpu" else None
        self.n_cols = len(bounds) - 1
        self.starts = self.bounds.tolist()

    @property
    def cols(self) -> torch.Tensor:
        """Each entry's column (made when asked: the store does not hold them)."""
        return torch.repeat_interleave(torch.arange(self.n_cols), torch.diff(self.bounds))

    def entries(self, col0: int, col1: int) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """The non-zero entries of columns col0..col1: column - col0, row and value, by column then row, on
        the host (the values read from one host copy, ``host_vals``)."""
        lo, hi = self.starts[col0], self.starts[col1]
        counts = self.bounds[col0 + 1 : col1 + 1] - self.bounds[col0:col1]
        cols = torch.repeat_interleave(torch.arange(col1 - col0), counts, output_size=hi - lo)
        return cols, self.rows[lo:hi].long(), self.host_vals()[lo:hi]

    def host_vals(self) -> torch.Tensor:
        """The values on the host: themselves where they are there, else one copy made when first asked (a
        copy per span of columns read would be a wait per span on a GPU)."""
        if self._host_vals is None:
            self._host_vals = self.vals.to("cpu")
        return self._host_vals


CHUNK = 2**20  # entries rearranged at once while a store is sorted (their temporaries stay small)


def from_keys(keys: torch.Tensor, vals: torch.Tensor, n_rows: int, n_cols: int) -> SparseRows:
    """A store from entries given as 64-bit keys column * n_rows + row (each once, in any order; the
    buffer is overwritten) and their values, within BUILD_BYTES an entry: each key and its place are
    packed into one integer where they fit and sorted in place (else a sort's order is made), and the
    rows and values are rearranged a chunk at a time."""
    count = len(keys)
    bits = max(1, (count - 1).bit_length())
    if count and (n_cols * n_rows - 1).bit_length() + bits <= 63:
        packed = keys.mul_(1 << bits)  # key, then the entry's place in the low bits
        for a in range(0, count, CHUNK):
            packed[a : a + CHUNK].add_(torch.arange(a, min(count, a + CHUNK)))
        packed.numpy().sort()  # in place, keys unique
        place = lambda a, b: packed[a:b] & ((1 << bits) - 1)  # noqa: E731
        key = lambda a, b: packed[a:b] >> bits  # noqa: E731
    else:
        order = torch.from_numpy(keys.numpy().argsort())
        place = lambda a, b: order[a:b]  # noqa: E731
        key = lambda a, b: keys.index_select(0, order[a:b])  # noqa: E731
    rows = torch.empty(count, dtype=torch.int32 if n_rows <= 2**31 else torch.long)
    sorted_vals = torch.empty(count, dtype=vals.dtype)
    counts = torch.zeros(n_cols, dtype=torch.long)
    for a in range(0, count, CHUNK):
        b = min(count, a + CHUNK)
        k = key(a, b)
        col = torch.div(k, n_rows, rounding_mode="floor")
        rows[a:b] = k - col * n_rows
        counts.index_add_(0, col, torch.ones_like(col))  # (a bincount whose size needs no value read)
        torch.index_select(vals, 0, place(a, b), out=sorted_vals[a:b])
    bounds = torch.cat([torch.zeros(1, dtype=torch.long), torch.cumsum(counts, 0)])
    return SparseRows.by_column(rows, sorted_vals, bounds)


SORT_BYTES = 24  # on a GPU, while the store is sorted there: the sorted keys, the sort's order, the values in it


def sorted_there(keys: torch.Tensor, vals: torch.Tensor, n_rows: int, n_cols: int) -> SparseRows:
    """``from_keys`` where the entries are (a GPU): sorted and split into rows and columns there, by
    torch's sort; the structure (rows, column bounds) copied to the host, the values left there (the
    compressed check gathers and folds them there); the same store as ``from_keys`` (keys are unique, so
    any sort gives one order). Needs SORT_BYTES an entry there beside the keys and values."""
    ordered, order = torch.sort(keys)
    sorted_vals = vals.index_select(0, order)
    del order
    col = torch.div(ordered, n_rows, rounding_mode="floor")
    rows = ordered.sub_(col * n_rows).to(torch.int32 if n_rows <= 2**31 else torch.long)
    counts = torch.zeros(n_cols, dtype=torch.long, device=keys.device).index_add_(0, col, torch.ones_like(col))
    bounds = torch.cat([torch.zeros(1, dtype=torch.long, device=keys.device), torch.cumsum(counts, 0)])
    return SparseRows.by_column(rows.cpu(), sorted_vals, bounds.cpu())


def narrow_rows(rows: torch.Tensor) -> torch.Tensor:
    """Row numbers as 32-bit integers where they fit (4 bytes an entry instead of 8)."""
    if rows.dtype == torch.int32 or (len(rows) and int(rows.max()) >= 2**31):
        return rows
    return rows.to(torch.int32)


class Rows:
    """Analytical rows of one check's Jacobian, by backward calls through ``grad``, batching decided once."""

    def __init__(
        self, grad: Vjp, outputs: list[torch.Tensor], grad_inputs: list[torch.Tensor], layout: Layout, memory_bytes: int
    ) -> None:
        self.grad, self.outputs, self.grad_inputs, self.layout = grad, outputs, grad_inputs, layout
        self.memory_bytes = memory_bytes
        self.live = [o for o in outputs if o.requires_grad]
        # a row of a stage: its one-hot grad_outputs, and the gradients as backward gives them and in float64
        row_bytes = sum(o.numel() * o.element_size() for o in self.live) + sum(
            x.numel() * x.element_size() + 8 * real_numel(x) for x in grad_inputs
        )
        device = grad_inputs[0].device if grad_inputs else torch.device("cpu")
        self.stage = stage_size(ROW_STAGE, row_bytes, memory_bytes, device_cap(STAGE_BYTES, device))  # rows per call
        self.wanted = list(range(len(grad_inputs)))  # the arguments whose gradients the rows need
        self.batched_rows: bool | None = None if self.live else False  # None: not tried yet
        self.one_hot: list[torch.Tensor] | None = None  # batched grad_outputs, reused from stage to stage
        self.batched_products: bool | None = self.batched_rows  # the same for any batch of grad_outputs

    def rows(self, col0: int, col1: int) -> torch.Tensor:
        """Analytical columns col0..col1 of the Jacobian, transposed (C x M). Outputs that do not
        require grad have zero rows (the function claims no gradient there). Only the arguments
        whose columns these are get gradients computed (backward may skip the others)."""
        every = all(o.requires_grad for o in self.outputs)  # then every row is written below
        rows = (torch.empty if every else torch.zeros)(col1 - col0, self.layout.n_rows, dtype=torch.float64)
        starts = self.layout.col_starts
        self.wanted = [i for i in range(len(self.grad_inputs)) if starts[i] < col1 and starts[i + 1] > col0]
        for k, out, j0, j1 in self._stages():
            for i, grad in zip(self.wanted, self._row_stage(out, j0, j1)):  # written where they belong: no cat
                lo, hi = max(col0, starts[i]), min(col1, starts[i + 1])
                rows[lo - col0 : hi - col0, k + j0 : k + j1] = grad[:, lo - starts[i] : hi - starts[i]].t()
        return rows

    def sparse_rows(self, limit: int, early: bool = False) -> SparseRows | None:
        """The whole analytical Jacobian from one pass of backward calls, its non-zero entries only;
        None when there are more than ``limit`` of them, or, if ``early``, as soon as the rows so far
        hold more than twice their share of ``limit`` (less backward work thrown away)."""
        self.wanted = list(range(len(self.grad_inputs)))
        # filled in place: small pieces kept between the stages' large temporaries would fragment
        # the heap; pages not written are never touched
        keys, vals, count = torch.empty(limit, dtype=torch.long), torch.empty(limit, dtype=torch.float64), 0
        n_rows = self.layout.n_rows
        for k, out, j0, j1 in self._stages():
            for start, grad in zip(self.layout.col_starts, self._row_stage(out, j0, j1)):
                r, c = grad.nonzero(as_tuple=True)  # NaN counts as non-zero
                if count + len(r) > (min(limit, 2 * limit * (k + j1) // n_rows) if early else limit):
                    return None
                torch.add(c, start, out=keys[count : count + len(r)]).mul_(n_rows).add_(r).add_(k + j0)
                vals[count : count + len(r)] = grad[r, c]
                count += len(r)
        self.one_hot = None  # its memory is not needed past the rows
        return from_keys(keys[:count], vals[:count], n_rows, self.layout.n_cols)

    def products(self, grad_outs: list[torch.Tensor]) -> torch.Tensor:
        """J^T g for a batch of grad_outputs g (one tensor per output that requires grad, the batch
        first): every argument's gradient, real and float64, a row per g (batch x columns), on the arguments'
        device."""
        self.wanted = list(range(len(self.grad_inputs)))
        # on copies: a backward that writes its grad_output (a contract failure) leaves ``grad_outs`` as they
        # are for the single calls that verify the batch or stand in for it
        got, self.batched_products = try_batched(
            self.batched_products,
            lambda: self._vmapped([g.clone() for g in grad_outs], host=False),
            partial(self._products_agree, grad_outs),
        )
        if got is None:
            got = self._single_products(grad_outs, range(len(grad_outs[0])))
        return torch.cat(got, dim=1)

    def _products_agree(self, grad_outs: list[torch.Tensor], batched: list[torch.Tensor]) -> bool:
        """A batch's products are the single calls' products: compared on its first, middle and last."""
        picks = sorted({0, len(grad_outs[0]) // 2, len(grad_outs[0]) - 1})
        return all(same(g[picks], s) for g, s in zip(batched, self._single_products(grad_outs, picks)))

    def _single_products(self, grad_outs: list[torch.Tensor], picks: Sequence[int]) -> list[torch.Tensor]:
        rows = [
            [
                g.clone()
                for g in self._flat_grads(
                    self.grad(self.live, self._wanted_inputs(), [g[b].clone() for g in grad_outs]), 1, host=False
                )
            ]
            for b in picks
        ]
        return [torch.cat(parts) for parts in zip(*rows)]

    def _vmapped(self, grad_outs: list[torch.Tensor], host: bool = True) -> list[torch.Tensor]:
        """The gradients for a batch of grad_outputs from one vmapped backward (``host``: see ``_flat_grads``)."""
        inputs = self._wanted_inputs()

        def vjp(*grad_out: torch.Tensor) -> tuple[Any, ...]:  # through autograd's engine, as a single row is
            return engine.grad(self.live, inputs, grad_out, retain_graph=True, materialize_grads=True)

        # faster than is_grads_batched (an older vmap) on a Linear layer's backward
        return self._flat_grads(torch.func.vmap(vjp)(*grad_outs), len(grad_outs[0]), host)

    def _stages(self) -> Iterator[tuple[int, torch.Tensor, int, int]]:
        """(first row of the output, output, first and last row of the stage within it)."""
        k = 0
        for out in self.outputs:
            size = real_numel(out)
            for j0 in range(0, size if out.requires_grad else 0, self.stage):
                yield k, out, j0, min(size, j0 + self.stage)
            k += size

    def _row_stage(self, out: torch.Tensor, j0: int, j1: int) -> list[torch.Tensor]:
        """Rows j0..j1 of output ``out``: for each wanted argument, its real gradients (rows x numel)."""
        tried = try_batched(
            self.batched_rows, lambda: self._batched_rows(out, j0, j1), lambda rows: self._rows_agree(rows, out, j0, j1)
        )
        batched, self.batched_rows = tried
        return batched if batched is not None else self._single_rows(out, j0, j1)

    def _rows_agree(self, batched: list[torch.Tensor], out: torch.Tensor, j0: int, j1: int) -> bool:
        """A batched stage's rows are the single calls' rows: compared on its first, middle and last row."""
        picks = sorted({0, (j1 - j0) // 2, j1 - j0 - 1})
        single = [self._single_rows(out, j0 + p, j0 + p + 1) for p in picks]
        return all(same(g[picks], torch.cat(s)) for g, s in zip(batched, zip(*single)))

    def _flat_grads(self, grads: tuple[Any, ...], batch: int, host: bool = True) -> list[torch.Tensor]:
        """The gradients as float64 rows (batch x real numel) on the CPU, where the dense Jacobians are held,
        or, not ``host``, where backward gives them (``products``: the grouped rows are decoded there)."""
        flat: list[torch.Tensor] = []
        for g, x in zip(grads, self._wanted_inputs()):
            if g is None:
                flat.append(torch.zeros(batch, real_numel(x), dtype=torch.float64, device="cpu" if host else x.device))
            else:
                real = real_view(g.detach()).reshape(batch, -1)
                flat.append(real.to("cpu", torch.float64) if host else real.to(torch.float64))
        return flat

    def _wanted_inputs(self) -> list[torch.Tensor]:
        return [self.grad_inputs[i] for i in self.wanted]

    def _single_rows(self, out: torch.Tensor, j0: int, j1: int) -> list[torch.Tensor]:
        grad_outs = [torch.zeros_like(o, memory_format=torch.contiguous_format) for o in self.live]
        one = grad_outs[next(i for i, o in enumerate(self.live) if o is out)]
        flat = real_flat(one)
        rows = []
        for j in range(j0, j1):
            for g in grad_outs:  # in full: a backward that writes grad_output (a contract failure) may have
                g.zero_()
            flat[j] = 1
            grads = self._flat_grads(self.grad(self.live, self._wanted_inputs(), grad_outs), 1)
            rows.append([g.clone() for g in grads])  # a gradient may be grad_output itself, zeroed next
        return [torch.cat(parts) for parts in zip(*rows)]

    def _batched_rows(self, out: torch.Tensor, j0: int, j1: int) -> list[torch.Tensor]:
        n = j1 - j0
        if self.one_hot is None:  # one buffer: fresh zeros per stage cost page faults
            self.one_hot = [torch.empty((self.stage,) + o.shape, dtype=o.dtype, device=o.device) for o in self.live]
        # zeroed in full, as a backward that writes grad_output (a contract failure) may have written
        # anywhere; the last stage's gradients, which may be views of it, are read by now
        grad_outs = [z[:n].zero_() for z in self.one_hot]
        one = grad_outs[next(i for i, o in enumerate(self.live) if o is out)]
        flat = (torch.view_as_real(one) if one.is_complex() else one).view(n, -1)
        flat[torch.arange(n), torch.arange(j0, j1)] = 1
        return self._vmapped(grad_outs)
