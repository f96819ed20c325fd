"""Finite differences and the entry-by-entry Jacobian comparison, in bounded memory.

Pure torch, no I/O. Complex tensors are handled as pairs of reals ("realified"): a complex
input contributes two columns per element (real and imaginary part), a complex output two
rows. With PyTorch's convention (the gradient of a real loss L w.r.t. z = a + ib is
dL/da + i dL/db) the vector-Jacobian product of the realified function is exactly the
realified gradient, so one comparison serves real and complex functions alike.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Callable, Optional, Sequence

import torch

ROW_STAGE = 256  # analytical rows gathered before one transposed write
Call = Callable[[Sequence[Any]], tuple]
Vjp = Callable[..., tuple]  # signature of torch.autograd.grad


def vjp(outputs: Sequence[torch.Tensor], inputs: Sequence[torch.Tensor], grad_outputs: Sequence[torch.Tensor]) -> tuple:
    """Vector-Jacobian product through the graph (kept for more calls); None for unused inputs."""
    return torch.autograd.grad(outputs, inputs, grad_outputs, retain_graph=True, allow_unused=True)


def probe_generator(seed: int, stream: int) -> torch.Generator:
    """A generator for probes, seeded from the spec's seed but independent of the inputs' stream."""
    return torch.Generator().manual_seed((seed * 1_000_003 + 7919 * (stream + 1)) % 2**63)


def as_tuple(out: Any) -> tuple:
    """A forward's return value as a tuple of outputs."""
    return tuple(out) if isinstance(out, (tuple, list)) else (out,)


def is_float_tensor(value: Any) -> bool:
    return isinstance(value, torch.Tensor) and (value.is_floating_point() or value.is_complex())


def real_flat(t: torch.Tensor) -> torch.Tensor:
    """A flat real view of contiguous ``t`` (no copy): complex elements become (re, im) pairs."""
    return (torch.view_as_real(t) if t.is_complex() else t).view(-1)


def unravel(flat: int, shape: Sequence[int]) -> list[int]:
    """The multi-index of flat (row-major) position ``flat`` in ``shape``."""
    index = []
    for size in reversed(shape):
        flat, r = divmod(flat, size)
        index.append(r)
    return index[::-1]


def element_ref(t: torch.Tensor) -> Callable[[int], tuple[torch.Tensor, Any]]:
    """For in-place perturbation: real element j of ``t`` (any strides) as (tensor, index)."""
    real = torch.view_as_real(t) if t.is_complex() else t
    if real.is_contiguous():
        flat = real.view(-1)
        return lambda j: (flat, j)
    return lambda j: (real, tuple(unravel(j, real.shape)))


def real_numel(t: torch.Tensor) -> int:
    return t.numel() * (2 if t.is_complex() else 1)


def outputs_vector(outputs: tuple, positions: Sequence[int]) -> torch.Tensor:
    """The realified, flattened, float64 concatenation of the chosen outputs (a copy)."""
    if not positions:
        return torch.zeros(0, dtype=torch.float64)
    return torch.cat([real_flat(outputs[p].detach().contiguous()).to(torch.float64) for p in positions])


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

    def __post_init__(self) -> None:
        self.bad = torch.zeros(self.real_numel, dtype=torch.bool)
        self.proj_a = torch.zeros(self.real_numel, dtype=torch.float64)
        self.proj_n = torch.zeros(self.real_numel, dtype=torch.float64)

    def update(self, a: torch.Tensor, n: torch.Tensor, col0: int, probe: torch.Tensor) -> None:
        """Fold in analytical ``a`` and numerical ``n`` for columns col0..col0+C of the Jacobian.

        Both are stored transposed, C x M (a row per input element), so each is contiguous.
        """
        cols = slice(col0, col0 + a.shape[0])
        self.proj_a[cols] = a @ probe
        self.proj_n[cols] = n @ probe
        if a.numel() == 0:
            return
        diff = (a - n).abs_()
        if not bool(torch.isfinite(diff).all()):
            # a non-finite entry is a mismatch; the statistics below are over the finite ones
            finite = torch.isfinite(a) & torch.isfinite(n)
            self.nonfinite += int((~finite).sum())
            self.bad[cols] |= ~finite.all(1)
            a, n = torch.where(finite, a, 0.0), torch.where(finite, n, 0.0)
            diff = (a - n).abs_()
        a, n = a.contiguous(), n.contiguous()
        n_abs = n.abs()
        tol = n_abs * self.rtol + self.atol
        # |a - n| <= atol + rtol * |n|, as torch.allclose(a, n)
        self.bad[cols] |= ~(diff <= tol).all(1)
        excess = diff / tol
        col, row = divmod(int(torch.argmax(excess)), a.shape[1])
        if float(excess[col, row]) > self.worst_excess:
            self.worst_excess = float(excess[col, row])
            self.worst_row, self.worst_col = row, col0 + col
            self.analytical, self.numerical = float(a[col, row]), float(n[col, row])
        self.max_abs = max(self.max_abs, float(diff.max()))
        big = n_abs > self.atol  # relative error only where the numerical value is not ~0
        if bool(big.any()):
            rel = float(torch.where(big, diff / n_abs, 0.0).max())
            self.max_rel = rel if self.max_rel is None else max(self.max_rel, rel)
        a_flat, n_flat = a.view(-1), n.view(-1)
        self.sum_an += float(a_flat @ n_flat)
        self.sum_nn += float(n_flat @ n_flat)
        self.sum_aa += float(a_flat @ a_flat)


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


def analytical_rows(
    outputs: list[torch.Tensor], inputs: list[torch.Tensor], layout: Layout, col0: int, col1: int, grad: Vjp = vjp
) -> torch.Tensor:
    """The analytical Jacobian restricted to columns col0..col1, transposed (C x M), one
    backward per output element (row of the Jacobian).

    Outputs that do not require grad have zero rows (the function claims no gradient there).
    """
    rows = torch.zeros(col1 - col0, layout.n_rows, dtype=torch.float64)
    live = [o for o in outputs if o.requires_grad]
    zero_grads = [torch.zeros_like(t) for t in inputs]
    k = 0
    for out in outputs:
        size = real_numel(out)
        for j0 in range(0, size if out.requires_grad else 0, ROW_STAGE):
            staged = []  # a few rows gathered, then written transposed in one go
            for j in range(j0, min(size, j0 + ROW_STAGE)):
                grad_out = torch.zeros_like(out, memory_format=torch.contiguous_format)  # fresh: backward may write it
                real_flat(grad_out)[j] = 1
                grads = grad(live, inputs, [grad_out if o is out else torch.zeros_like(o) for o in live])
                parts = [real_flat((g if g is not None else z).contiguous()) for g, z in zip(grads, zero_grads)]
                staged.append(torch.cat(parts)[col0:col1])
            rows[:, k + j0 : k + j0 + len(staged)] = torch.stack(staged).t()
        k += size
    return rows


def numerical_columns(
    call: Call, values: list[Any], layout: Layout, col0: int, col1: int, eps: float
) -> torch.Tensor:
    """Central differences (f(x + eps e_j) - f(x - eps e_j)) / 2 eps for columns col0..col1,
    transposed (C x M) like ``analytical_rows``.

    ``values`` are the detached argument values; the checked tensors among them are perturbed
    in place, one real element at a time, and restored (as torch.autograd.gradcheck does).
    """
    cols = torch.empty(col1 - col0, layout.n_rows, dtype=torch.float64)
    bounds = [0]
    for size in layout.row_sizes:
        bounds.append(bounds[-1] + size)
    with torch.no_grad():
        for i, t in enumerate(layout.inputs):
            start = layout.col_starts[i]
            ref = element_ref(t)
            for c in range(max(col0, start), min(col1, layout.col_starts[i + 1])):
                base, j = ref(c - start)
                out = cols[c - col0]
                orig = base[j].item()
                base[j] = orig - eps
                _write_outputs(as_tuple(call(values)), layout.outputs, bounds, out, None)
                base[j] = orig + eps
                _write_outputs(as_tuple(call(values)), layout.outputs, bounds, out, out)
                base[j] = orig
    return cols.div_(2 * eps)


def _write_outputs(outputs: tuple, positions: list[int], bounds: list[int], out: torch.Tensor,
                   minus: Optional[torch.Tensor]) -> None:
    """``out`` = the realified outputs, or, given ``minus``, the outputs minus ``minus`` (a copy either way)."""
    for k, p in enumerate(positions):
        o = outputs[p].detach()
        flat = (torch.view_as_real(o) if o.is_complex() else o).reshape(-1)
        seg = out[bounds[k] : bounds[k + 1]]
        if minus is None:
            seg.copy_(flat)
        else:
            torch.sub(flat.to(torch.float64), seg, out=seg)


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
) -> tuple[Layout, list[Entry]]:
    """Compare analytical and numerical Jacobians entry by entry, block of columns by block.

    ``outputs`` come from one forward with grad enabled on the leaves ``grad_inputs``;
    ``positions`` name the outputs compared. ``plain_inputs`` are detached copies (inside
    ``plain_values``, the arguments ``call`` takes) that get perturbed. At most about
    ``memory_bytes`` of Jacobian entries are held at once, so memory stays
    O(memory_bytes + inputs + outputs) instead of O(inputs x outputs): when the analytical rows
    do not fit, they are recomputed for each block of columns. ``call`` and ``grad`` are the
    forward and the vector-Jacobian product (the caller may wrap them to label user errors).
    Each entry also keeps u^T J (analytical and numerical) for one Gaussian probe u drawn from
    ``seed``, so that patterns across a whole gradient (e.g. a transpose) can be named.
    """
    layout = make_layout(plain_inputs, outputs, positions)
    probe = torch.randn(layout.n_rows, generator=probe_generator(seed, 0), dtype=torch.float64)
    entries = [Entry(real_numel(t), atol, rtol) for t in plain_inputs]
    per_col = 8 * max(1, layout.n_rows)
    block = max(1, memory_bytes * 7 // 8 // per_col)  # analytical rows held at once
    chunk = max(1, min(block, memory_bytes // 8 // 8 // per_col))  # numerical columns and temporaries
    for col0 in range(0, layout.n_cols, block):
        col1 = min(layout.n_cols, col0 + block)
        a_block = analytical_rows([outputs[p] for p in positions], grad_inputs, layout, col0, col1, grad)
        for c0 in range(col0, col1, chunk):
            c1 = min(col1, c0 + chunk)
            n_chunk = numerical_columns(call, plain_values, layout, c0, c1, eps)
            for i, entry in enumerate(entries):
                lo, hi = max(c0, layout.col_starts[i]), min(c1, layout.col_starts[i + 1])
                if lo < hi:
                    entry.update(a_block[lo - col0 : hi - col0], n_chunk[lo - c0 : hi - c0],
                                 lo - layout.col_starts[i], probe)
        del a_block  # free it before the next block is allocated: one block at a time
    return layout, entries
