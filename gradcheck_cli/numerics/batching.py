"""The batching policy: how many rows or columns go into one vmapped call, and the vmapped call.

A stage of analytical rows is one backward over a batch of one-hot grad_outputs, a stage of
numerical columns (or of random probes) one forward over a batch of perturbed arguments, both
through ``torch.func.vmap``. Batching changes the speed, never the numbers: a batched result is
used only where it gives what single calls give (``same``), and any failure to batch means single
calls (``quietly``). Pure torch.
"""

from __future__ import annotations

import inspect
import warnings
from collections.abc import Iterator
from typing import Any, Callable, TypeVar

import torch
from torch.utils._pytree import tree_flatten

from .jacobian_layout import Layout
from .realify import Call, as_tuple, real_numel, real_view

ROW_STAGE = 256  # rows (one-hot grad_outputs) per batched backward, or gathered per transposed write
COL_STAGE = 256  # perturbations per batched forward
STAGE_BYTES = 64 * 2**20  # at most this much of perturbed arguments and outputs per batched forward
# the compressed checks' stages (column groups, grouped rows): smaller, as their decoding makes a dozen
# temporaries of a stage's size: smaller stages keep the heap smaller (fewer pages faulted in on a
# first check) and a pass in cache, for a few more calls; the grouped rows' stages, whose temporaries are
# the most (the products, the gradients and the decoding's), smaller again (CHANGELOG: the measurements)
GROUP_STAGE_BYTES = 16 * 2**20
ROW_GROUP_STAGE_BYTES = 8 * 2**20
BATCH_BYTES = 64 * 2**20  # at most this much of perturbed inputs and outputs in one vmapped forward of probes
STAGE_SHARE = 8  # and a stage (of rows, columns or probes) holds at most this share of the memory budget
SLACK = 2  # the user's forward or backward makes temporaries about as large as the batch it is given

T = TypeVar("T")
Batches = dict[int, tuple[torch.Tensor, torch.Tensor]]  # id(argument) -> (argument, its batch as flat real rows)


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


def try_batched(state: bool | None, batched: Callable[[], T], verify: Callable[[T], bool]) -> tuple[T | None, bool]:
    """One batched computation in place of single calls, the decision to batch made once.

    ``state``: True (batching verified and kept), None (not verified yet) or False (off:
    ``batched`` is not run). An error in ``batched()`` turns batching off, and so does ``verify``
    (single calls on a few of its rows or columns, compared with ``same``) rejecting the first
    result. Returns the result to use (None: make the single calls) and the state for the next
    call; a caller that passes None every time has every result verified."""
    if state is False:
        return None, False
    got = quietly(batched)
    if got is None:
        return None, False
    kept = verify(got) if state is None else True
    return (got if kept else None), kept


def stage_budget(memory_bytes: int, cap: int = STAGE_BYTES) -> int:
    """Bytes one stage of batched calls may hold: its share of the memory budget, at most ``cap``."""
    return max(1, min(cap, memory_bytes // STAGE_SHARE))


def device_cap(cap: int, device: torch.device) -> int:
    """A stage's cap on ``device``: ``cap`` on a CPU, tuned to keep a stage's temporaries in its caches; on a
    GPU, where each call of a stage is a kernel launch and a host round trip and a stage outgrows the caches
    anyway, a share of the device's free memory (at least ``cap``). The memory budget's share bounds either
    (``stage_budget``): a larger ``--max-memory`` means fewer, larger stages on a GPU."""
    if device.type != "cuda":
        return cap
    free, _ = torch.cuda.mem_get_info(device)
    return max(cap, free // STAGE_SHARE)


def stage_size(most: int, row_bytes: int, memory_bytes: int, cap: int = STAGE_BYTES) -> int:
    """How many rows (one-hot grad_outputs, perturbed arguments) one batched call takes: at most
    ``most``, within the stage's budget (at most ``cap``) at ``row_bytes`` each plus the user code's
    temporaries (SLACK); at least one, as a single call holds that much anyway."""
    return max(1, min(most, stage_budget(memory_bytes, cap) // max(1, SLACK * row_bytes)))


def column_stages(layout: Layout, col0: int, col1: int, memory_bytes: int) -> Iterator[list[tuple[int, int, int]]]:
    """Columns col0..col1 in stages of at most COL_STAGE, as spans (argument, first and last
    column within it); a stage may span several small arguments. A stage's batch (2 rows per
    column, each a copy of the arguments it moves and two of the outputs: vmap's and the float64
    one) stays within its share of ``memory_bytes`` (see ``stage_size``)."""
    stage: list[tuple[int, int, int]] = []
    starts, size, moved = layout.col_starts, 0, 0  # moved: elements of the stage's arguments
    cap = device_cap(STAGE_BYTES, layout.inputs[0].device) if layout.inputs else STAGE_BYTES
    for i, x in enumerate(layout.inputs):
        lo, hi = max(col0, starts[i]), min(col1, starts[i + 1])
        while lo < hi:
            row_bytes = 16 * (moved + real_numel(x) + 2 * layout.n_rows)  # both signs, float64
            limit = stage_size(COL_STAGE, row_bytes, memory_bytes, cap)
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


def argument_groups(inputs: list[torch.Tensor], n_probes: int, n_rows: int, budget: int) -> list[list[int]]:
    """Arguments whose probes are batched together, in order, each group within ``budget`` bytes
    (one vmapped forward costs more than the work it saves by leaving the other arguments
    unbatched); an argument too large for ``budget`` on its own is left out (single calls)."""
    groups: list[list[int]] = [[]]
    size = 0
    for i, x in enumerate(inputs):
        n = real_numel(x)
        if _bytes(1, n, n_probes, n_rows) > budget:
            continue
        if groups[-1] and _bytes(len(groups[-1]) + 1, size + n, n_probes, n_rows) > budget:
            groups.append([])
            size = 0
        groups[-1].append(i)
        size += n
    return [g for g in groups if g]


def _bytes(n_args: int, elements: int, n_probes: int, n_rows: int) -> int:
    """Perturbed inputs and outputs of one vmapped forward over ``n_args`` arguments."""
    return 2 * n_args * n_probes * (elements + n_rows) * 8


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

    def forward(*xbs: torch.Tensor) -> Any:
        swap = dict(zip(moved, xbs))
        outputs = as_tuple(batched([swap.get(id(v), v) for v in values]))
        return outputs[positions[0]] if len(positions) == 1 else tuple(outputs[p] for p in positions)

    rows = len(next(iter(batches.values()))[1])
    with torch.no_grad():  # the outputs realified after the call: an operation under vmap costs more
        outputs = _vmap(forward, [_shaped(x, batch) for x, batch in batches.values()], rows)
        return _flat_rows(as_tuple(outputs), rows)


def _flat_vmap() -> Any:
    """torch.func.vmap's last step (torch/_functorch/vmap.py) after its checks of the arguments' structure,
    where this torch has it with the arguments this module gives it; else None."""
    try:
        from torch._functorch import vmap as functorch_vmap
        from torch._functorch.predispatch import lazy_load_decompositions

        step = functorch_vmap._flat_vmap
        params = list(inspect.signature(step).parameters)
    except (ImportError, AttributeError, TypeError, ValueError):  # pragma: no cover - another torch
        return None
    expected = ["func", "batch_size", "flat_in_dims", "flat_args", "args_spec", "out_dims", "randomness", "kwargs"]
    return (lazy_load_decompositions, step) if params == expected else None


_FLAT_VMAP = _flat_vmap()


def _vmap(forward: Callable[..., Any], xs: list[torch.Tensor], rows: int) -> Any:
    """``torch.func.vmap(forward)(*xs)`` for ``xs`` batched along their first dimension (``rows`` long):
    torch.func.vmap's own last step, without its checks of the arguments' structure, which is always
    this one here (a third of a small vmapped call); torch.func.vmap itself where that step differs."""
    if _FLAT_VMAP is None:  # pragma: no cover - another torch
        return torch.func.vmap(forward)(*xs)
    load, step = _FLAT_VMAP
    load()  # what torch.func.vmap does first: its batching rules, loaded on the first call
    return step(forward, rows, [0] * len(xs), xs, tree_flatten(tuple(xs))[1], 0, "error")  # vmap's defaults


def _flat_rows(outputs: tuple[torch.Tensor, ...], rows: int) -> torch.Tensor:
    """A batch's outputs as ``outputs_vector`` makes them of a single call's, one row per batch row
    (a view where there is one float64 output)."""
    if not outputs:
        return torch.zeros(rows, 0, dtype=torch.float64)
    parts = [real_view(o.detach()).reshape(rows, -1).to(torch.float64) for o in outputs]
    return parts[0] if len(parts) == 1 else torch.cat(parts, dim=1)


def _shaped(x: torch.Tensor, batch: torch.Tensor) -> torch.Tensor:
    """A batch of flat real rows as a batch of tensors like ``x`` (complex again if ``x`` is)."""
    shape = (len(batch),) + x.shape + ((2,) if x.is_complex() else ())
    return torch.view_as_complex(batch.view(shape)) if x.is_complex() else batch.view(shape)
