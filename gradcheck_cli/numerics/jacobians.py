"""The two Jacobians, a block of columns at a time: analytical rows from backward, numerical
columns from central differences.

Both are built transposed (C x M: a row per real input element), so that a block of columns
is contiguous. Each side is computed by one call per row or column, as torch.autograd.gradcheck
does, or, where vmap gives the same numbers, by one batched call per stage of rows or columns:
backward over a batch of one-hot grad_outputs (``torch.func.vmap`` over ``torch.autograd.grad``),
and forward over a batch of perturbed inputs (``torch.func.vmap`` over the target, or over a
Function's forward body when it declares no vmap support). The first batched stage is compared
with single calls on a few rows or columns; any difference or error turns batching off for the
rest of the check, so batching changes the speed, never the verdict.
Pure torch, no I/O.
"""
from __future__ import annotations

import warnings
from dataclasses import dataclass
from typing import Any, Iterator, Optional

import torch

from .realify import Call, Vjp, as_tuple, element_ref, outputs_vector, real_flat, real_numel

ROW_STAGE = 256  # rows (one-hot grad_outputs) per batched backward, or gathered per transposed write
COL_STAGE = 256  # perturbations per batched forward
STAGE_BYTES = 64 * 2**20  # at most this much of perturbed arguments and outputs per batched forward


@dataclass
class Layout:
    """Where each checked argument's columns and each differentiable output's rows lie."""

    inputs: list[torch.Tensor]  # the tensors whose gradients are checked, one per column block
    outputs: list[int]  # positions of the differentiable outputs
    col_starts: list[int]
    row_sizes: list[int]

    @property
    def n_cols(self) -> int:
        return self.col_starts[-1]

    @property
    def n_rows(self) -> int:
        return sum(self.row_sizes)

    def row_location(self, row: int) -> tuple[int, int, int]:
        """(output number among differentiable outputs, real index within it, output position)."""
        for i, size in enumerate(self.row_sizes):
            if row < size:
                return i, row, self.outputs[i]
            row -= size
        raise IndexError(row)


def make_layout(inputs: list[torch.Tensor], outputs: tuple, positions: list[int]) -> Layout:
    starts = [0]
    for t in inputs:
        starts.append(starts[-1] + real_numel(t))
    return Layout(inputs, positions, starts, [real_numel(outputs[p]) for p in positions])


def same(batched: torch.Tensor, single: torch.Tensor) -> bool:
    """Batched and single calls agree up to rounding (a batched matmul may sum in another order)."""
    return torch.equal(batched, single) or bool(torch.allclose(batched, single, rtol=1e-6, atol=1e-8, equal_nan=True))


def quietly(fn: Any, *args: Any) -> Any:
    """``fn(*args)``, or None when it raises (batching unsupported): the caller falls back."""
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")  # vmap's "performance drop" fallbacks
            return fn(*args)
    except Exception:  # noqa: BLE001 - any failure to batch means: call one at a time
        return None


@dataclass
class SparseRows:
    """The non-zero entries of the analytical Jacobian, sorted by column (then row), read a span of columns at a time."""

    cols: torch.Tensor
    rows: torch.Tensor
    vals: torch.Tensor
    n_cols: int

    def __post_init__(self) -> None:
        order = torch.argsort(self.cols, stable=True)
        self.cols, self.rows, self.vals = self.cols[order], self.rows[order], self.vals[order]
        self.starts = torch.searchsorted(self.cols, torch.arange(self.n_cols + 1)).tolist()

    def entries(self, col0: int, col1: int) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """The non-zero entries of columns col0..col1: column - col0, row and value, by column then row."""
        lo, hi = self.starts[col0], self.starts[col1]
        return self.cols[lo:hi] - col0, self.rows[lo:hi], self.vals[lo:hi]


class Jacobians:
    """Analytical rows and numerical columns of one check, with batching decided once."""

    def __init__(self, call: Call, grad: Vjp, outputs: list[torch.Tensor], grad_inputs: list[torch.Tensor],
                 values: list[Any], layout: Layout, eps: float, batched: Optional[Call], memory_bytes: int) -> None:
        self.call, self.grad, self.outputs, self.grad_inputs = call, grad, outputs, grad_inputs
        self.batched = batched  # the forward that vmap batches (None: none may be)
        self.values, self.layout, self.eps, self.memory_bytes = values, layout, eps, memory_bytes
        self.live = [o for o in outputs if o.requires_grad]
        self.wanted = list(range(len(grad_inputs)))  # the arguments whose gradients the rows need
        ends = [sum(layout.row_sizes[: k + 1]) for k in range(len(layout.outputs))]
        self.segments = [(p, end - size, end) for p, size, end in zip(layout.outputs, layout.row_sizes, ends)]
        self.batched_rows: Optional[bool] = None if self.live else False  # None: not tried yet
        self.one_hot: Optional[list[torch.Tensor]] = None  # batched grad_outputs, reused from stage to stage
        self.batched_cols: Optional[bool] = None if batched else False

    # -- analytical: J^T e_r for one-hot e_r, a row of the Jacobian per backward ---------------------

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

    def sparse_rows(self, limit: int, early: bool = False) -> Optional[SparseRows]:
        """The whole analytical Jacobian from one pass of backward calls, its non-zero entries only;
        None when there are more than ``limit`` of them, or, if ``early``, as soon as the rows so far
        hold more than twice their share of ``limit`` (less backward work thrown away)."""
        self.wanted = list(range(len(self.grad_inputs)))
        # filled in place: small pieces kept between the stages' large temporaries would fragment
        # the heap (up to 0.5 GB more at Linear n=96); pages not written are never touched
        cols, rows = torch.empty(limit, dtype=torch.long), torch.empty(limit, dtype=torch.long)
        vals, count = torch.empty(limit, dtype=torch.float64), 0
        for k, out, j0, j1 in self._stages():
            for start, grad in zip(self.layout.col_starts, self._row_stage(out, j0, j1)):
                grad = grad.cpu()  # the store is on the CPU, as dense rows are
                r, c = grad.nonzero(as_tuple=True)  # NaN counts as non-zero
                if count + len(r) > (min(limit, 2 * limit * (k + j1) // self.layout.n_rows) if early else limit):
                    return None
                torch.add(c, start, out=cols[count : count + len(r)])
                torch.add(r, k + j0, out=rows[count : count + len(r)])
                vals[count : count + len(r)] = grad[r, c]
                count += len(r)
        self.one_hot = None  # its memory is not needed past the rows
        return SparseRows(cols[:count], rows[:count], vals[:count], self.layout.n_cols)

    def _stages(self) -> Iterator[tuple[int, torch.Tensor, int, int]]:
        """(first row of the output, output, first and last row of the stage within it)."""
        k = 0
        for out in self.outputs:
            size = real_numel(out)
            for j0 in range(0, size if out.requires_grad else 0, ROW_STAGE):
                yield k, out, j0, min(size, j0 + ROW_STAGE)
            k += size

    def _row_stage(self, out: torch.Tensor, j0: int, j1: int) -> list[torch.Tensor]:
        """Rows j0..j1 of output ``out``: for each wanted argument, its real gradients (rows x numel)."""
        if self.batched_rows is not False:
            batched = quietly(self._batched_rows, out, j0, j1)
            if batched is not None and self.batched_rows is None:
                picks = sorted({0, (j1 - j0) // 2, j1 - j0 - 1})
                single = [self._single_rows(out, j0 + p, j0 + p + 1) for p in picks]
                self.batched_rows = all(same(g[picks], torch.cat(s)) for g, s in zip(batched, zip(*single)))
            if batched is None:
                self.batched_rows = False
            elif self.batched_rows:
                return batched
        return self._single_rows(out, j0, j1)

    def _flat_grads(self, grads: tuple, batch: int) -> list[torch.Tensor]:
        return [torch.zeros(batch, real_numel(x), dtype=torch.float64) if g is None else
                (torch.view_as_real(g) if g.is_complex() else g).reshape(batch, -1).to(torch.float64)
                for g, x in zip(grads, self._wanted_inputs())]

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
        if self.one_hot is None:  # one buffer: fresh zeros per stage cost 4% at Linear n=128 (page faults)
            self.one_hot = [torch.empty((ROW_STAGE,) + o.shape, dtype=o.dtype, device=o.device) for o in self.live]
        # zeroed in full, as a backward that writes grad_output (a contract failure) may have written
        # anywhere; the last stage's gradients, which may be views of it, are read by now
        grad_outs = [z[:n].zero_() for z in self.one_hot]
        one = grad_outs[next(i for i, o in enumerate(self.live) if o is out)]
        flat = (torch.view_as_real(one) if one.is_complex() else one).view(n, -1)
        flat[torch.arange(n), torch.arange(j0, j1)] = 1
        inputs = self._wanted_inputs()

        def vjp(*one_hot: torch.Tensor) -> tuple:  # through autograd's engine, as a single row is
            return torch.autograd.grad(self.live, inputs, one_hot, retain_graph=True, materialize_grads=True)

        # twice as fast as is_grads_batched (an older vmap) on a Linear layer's backward
        return self._flat_grads(torch.func.vmap(vjp)(*grad_outs), n)

    # -- numerical: (f(x + eps e_j) - f(x - eps e_j)) / 2 eps, a column per pair of forwards ----------

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
        """Columns col0..col1 in stages of at most COL_STAGE, as spans (argument, first and last
        column within it); a stage may span several small arguments. A stage's batch (2 rows per
        column, each a copy of the arguments it moves and of the outputs) stays within STAGE_BYTES."""
        starts, stage, size, moved = self.layout.col_starts, [], 0, 0  # moved: elements of the stage's arguments
        for i, x in enumerate(self.layout.inputs):
            lo, hi = max(col0, starts[i]), min(col1, starts[i + 1])
            while lo < hi:
                row_bytes = 16 * (moved + real_numel(x) + self.layout.n_rows)  # both signs, float64
                limit = max(1, min(COL_STAGE, STAGE_BYTES // row_bytes))
                if stage and size >= limit:
                    yield stage
                    stage, size, moved = [], 0, 0
                    continue
                take = min(hi - lo, limit - size)
                stage.append((i, lo - starts[i], lo - starts[i] + take))
                size, lo = size + take, lo + take
            if stage and stage[-1][0] == i:
                moved += real_numel(x)
        if stage:
            yield stage

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


Batches = dict[int, tuple[torch.Tensor, torch.Tensor]]  # id(argument) -> (argument, its batch as flat real rows)


def copies(batches: Batches, x: torch.Tensor, rows: int) -> torch.Tensor:
    """``x``'s batch in ``batches`` (``rows`` flat real copies of it, to perturb), made on first use:
    one per tensor, so a tensor passed as two arguments is moved in both places, as in a single call."""
    if id(x) not in batches:
        real = (torch.view_as_real(x) if x.is_complex() else x).contiguous()
        batches[id(x)] = x, real.reshape(1, -1).expand(rows, -1).clone(memory_format=torch.contiguous_format)
    return batches[id(x)][1]


def vmapped(batched: Call, values: list[Any], batches: Batches, positions: list[int]) -> torch.Tensor:
    """One vmapped forward: the realified outputs at ``positions`` for each batch row, the arguments
    in ``batches`` taken row by row, every other value as it is. Without grad mode, as ``apply``
    runs forward."""
    moved = list(batches)

    def forward(*xbs: torch.Tensor) -> torch.Tensor:
        swap = dict(zip(moved, xbs))
        return outputs_vector(as_tuple(batched([swap.get(id(v), v) for v in values])), positions, copy=False)

    with torch.no_grad():
        return torch.func.vmap(forward)(*(_shaped(x, batch) for x, batch in batches.values()))


def _shaped(x: torch.Tensor, batch: torch.Tensor) -> torch.Tensor:
    """A batch of flat real rows as a batch of tensors like ``x`` (complex again if ``x`` is)."""
    shape = (len(batch),) + x.shape + ((2,) if x.is_complex() else ())
    return torch.view_as_complex(batch.view(shape)) if x.is_complex() else batch.view(shape)
