"""Both Jacobians of one check, compared entry by entry, a block of columns at a time, in bounded memory.

Complex tensors are handled as pairs of reals ("realified"): a complex input contributes two
columns per element (real and imaginary part), a complex output two rows. With PyTorch's
convention (the gradient of a real loss L w.r.t. z = a + ib is dL/da + i dL/db) the
vector-Jacobian product of the realified function is exactly the realified gradient, so one
comparison serves real and complex functions alike. Pure torch.
"""

from __future__ import annotations

from functools import partial
from typing import Any, Callable

import torch

from .batching import COL_STAGE, ROW_STAGE
from .columns import Columns
from .compressed import Groups
from .jacobian_layout import Layout, make_layout
from .realify import Call, Vjp, real_numel, vjp
from .row_groups import RowGroups
from .rows import Rows, SparseRows, store_limit
from .stats import Entry
from .streams import Stream, Streams, signed_uniform


class Jacobians(Rows, Columns):
    """Analytical rows and numerical columns of one check, over one layout, with batching decided
    once for each side."""

    def __init__(
        self,
        call: Call,
        grad: Vjp,
        outputs: list[torch.Tensor],
        grad_inputs: list[torch.Tensor],
        values: list[Any],
        layout: Layout,
        eps: float,
        batched: Call | None,
        memory_bytes: int,
    ) -> None:
        Rows.__init__(self, grad, outputs, grad_inputs, layout, memory_bytes)
        Columns.__init__(self, call, values, layout, eps, batched, memory_bytes)


SMALL = 2**17  # Jacobian entries at most, for a check taken whole (see ``compare``)
WHOLE_STAGES = 4  # and batched forwards at most (of COL_STAGE perturbations), with one batched backward
SEED_0 = Streams(0)  # ``compare``'s streams unless given: those of seed 0, a spec's default


def no_limit(calls: int, passes: int) -> None:
    """``compare``'s default ``budget``: any amount of work is done."""


def projection(layout: Layout, streams: Streams) -> torch.Tensor:
    """The random probe u over the rows whose u^T J every ``Entry`` of ``compare`` keeps."""
    return signed_uniform((layout.n_rows,), streams.generator(Stream.PROJECTION))


def compare(
    call: Call,
    outputs: tuple[Any, ...],
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
    streams: Streams = SEED_0,
    batched: Call | None = None,
    budget: Callable[[int, int], None] = no_limit,
    compress: bool = True,
    keep_share: int = 0,
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
    ``streams``, so that patterns across a whole gradient (e.g. a transpose) can be named.
    ``batched``, the same forward as ``call`` in a form torch.func.vmap may batch, lets the finite
    differences be batched; see ``columns``.
    ``budget(calls, passes)`` is told the calls of forward and of backward the comparison will make
    (2 per column, one per row and pass over the rows) before they are made: up front for one pass,
    and again when the dense rows must be recomputed for each of ``passes`` blocks of columns. It
    raises to stop the comparison (work that would not finish in reasonable time).
    ``compress``: where the non-zero entries are kept, take the numerical columns a group of
    structurally orthogonal columns at a time (see ``compressed``), each group's columns made one
    by one where the group's check does not accept them. Where the non-zero entries of all the
    arguments do not fit in the store at once, and the dense rows would be recomputed per block of
    columns, each argument is compared on its own (its own store: ``_by_argument``).
    ``keep_share``: the number of arguments that share the kept mismatching columns' memory (0: these).
    """
    layout = make_layout(plain_inputs, outputs, positions)
    jac = Jacobians(
        call, grad, [outputs[p] for p in positions], grad_inputs, plain_values, layout, eps, batched, memory_bytes
    )
    probe = projection(layout, streams)
    keep = memory_bytes // 16 // max(1, keep_share or len(plain_inputs))  # mismatching columns kept whole, each
    entries = [Entry(real_numel(t), atol, rtol, keep_bytes=keep) for t in plain_inputs]
    per_col = 8 * max(1, layout.n_rows)
    # the memory budget: analytical rows held at once (3/4), a stage of batched calls (1/8, see
    # ``batching``), mismatching columns kept whole (1/16), numerical columns and temporaries
    # (1/64); a column of each is held anyway
    block = max(1, memory_bytes * 3 // 4 // per_col)
    chunk = max(1, min(block, memory_bytes // 8 // 8 // per_col))
    # The non-zero entries, from one pass of backward calls, are kept instead of the dense rows
    # when they fit in the dense rows' share (``store_limit``) and, if the dense rows fit too, are at most an
    # eighth of the entries: each chunk of numerical columns is then compared at those entries
    # (and wherever it is non-zero itself), never scanning the entries zero on both sides. Else
    # the dense rows are computed per block.
    fits = block >= layout.n_cols
    limit = store_limit(memory_bytes)
    most = min(limit, layout.n_rows * layout.n_cols // 8) if fits else limit
    # a small Jacobian (rows one batched backward, columns at most four batched forwards) is taken
    # whole: grouping's fixed costs (its own backward calls, the colouring, a forward per group and
    # move) are more than the few batched calls it could save (12 inputs of 4 x 4, a Linear layer of 12
    # features: CHANGELOG has the measurements)
    small = (
        layout.n_rows * layout.n_cols <= SMALL
        and 2 * layout.n_cols <= WHOLE_STAGES * COL_STAGE
        and layout.n_rows <= ROW_STAGE
    )
    compress = compress and not small
    grouping = compress and RowGroups.applies(jac)
    # first the compressed check at its cheapest: every output's elements in one backward call (an
    # elementwise or row-wise function), a few forwards per group of columns; its calls are
    # budgeted as they are, so a large sparse check is no longer refused for what it would cost
    # element by element
    found = RowGroups(jac, streams.generator(Stream.ROW_GROUPS), most, at_once=True) if grouping else None
    store = found.store() if found is not None else None
    groups = _groups(jac, store, atol, rtol, streams) if store is not None else None
    calls = (found.calls + groups.forwards) if found is not None and groups is not None else 0
    if groups is not None:
        budget(calls, 1)
    else:
        budget(2 * layout.n_cols + layout.n_rows, 1)
        if store is None:  # the diagonals, else one-hot rows
            # where the dense rows would be recomputed per block, the diagonals count each argument's entries
            # past the store's limit: arguments that fit on their own are compared in blocks that fit
            distinct = len({id(x) for x in plain_inputs}) == len(plain_inputs) > 1  # a tensor passed twice: joint
            parts = layout.col_starts if not fits and distinct else None
            diagonals = (
                RowGroups(jac, streams.generator(Stream.ROW_GROUPS), most, tried=True, parts=parts)
                if grouping
                else None
            )
            store = diagonals.store() if diagonals is not None else None
            if diagonals is not None and diagonals.counted:
                return _in_blocks(
                    partial(
                        compare,
                        call,
                        outputs,
                        positions,
                        plain_values=plain_values,
                        eps=eps,
                        atol=atol,
                        rtol=rtol,
                        memory_bytes=memory_bytes,
                        grad=grad,
                        streams=streams,
                        batched=batched,
                        compress=compress,
                        keep_share=len(plain_inputs),
                    ),
                    layout,
                    grad_inputs,
                    plain_inputs,
                    _blocks(diagonals.per_part.tolist(), most),
                    budget,
                )
            # where the diagonals already found more than ``most`` non-zero entries, the one-hot rows would too
            if store is None and not small and not (diagonals is not None and diagonals.count > diagonals.limit):
                store = jac.sparse_rows(most, early=fits)
        if store is None and block < layout.n_cols:
            passes = -(-layout.n_cols // block)  # after the pass that looked for the non-zero entries
            budget(2 * layout.n_cols + (passes + 1) * layout.n_rows, passes)
        groups = _groups(jac, store, atol, rtol, streams) if compress and store is not None else None
    if store is not None:
        block = max(1, layout.n_cols)  # no rows held: one pass over the chunks
    if groups is not None:
        groups.evaluate()
        if calls:  # the columns of the groups that disagree, one by one (halving them first costs less)
            budget(calls + 2 * int((~groups.accepted).sum()), 1)
        groups.narrow()
        for i, entry in enumerate(entries):
            groups.fold(entry, layout.col_starts[i], layout.col_starts[i + 1], probe, chunk)
        return layout, entries
    for col0 in range(0, layout.n_cols, block):
        col1 = min(layout.n_cols, col0 + block)
        a_block = jac.rows(col0, col1) if store is None else None
        for c0 in range(col0, col1, chunk):
            c1 = min(col1, c0 + chunk)
            n_chunk = jac.columns(c0, c1)
            for i, entry in enumerate(entries):
                lo, hi = max(c0, layout.col_starts[i]), min(c1, layout.col_starts[i + 1])
                if lo < hi:
                    start = lo - layout.col_starts[i]
                    n = n_chunk[lo - c0 : hi - c0]
                    if store is not None:
                        c, r, v = store.entries(lo, hi)
                        entry.update_sparse(c, r, v, n, start, probe)
                    elif a_block is not None:
                        entry.update(a_block[lo - col0 : hi - col0], n, start, probe)
        del a_block  # free it before the next block is allocated: one block at a time
    return layout, entries


def _blocks(counts: list[int], most: int) -> list[list[int]]:
    """Consecutive arguments in blocks whose non-zero entries (``counts``, each at most ``most``) fit together
    (the counts may be lower bounds: a block that does not fit is then compared as its own check would be)."""
    blocks: list[list[int]] = []
    held = most + 1
    for i, c in enumerate(counts):
        if held + c > most:
            blocks.append([])
            held = 0
        blocks[-1].append(i)
        held += c
    return blocks


def _in_blocks(
    one: Callable[..., tuple[Layout, list[Entry]]],
    layout: Layout,
    grad_inputs: list[torch.Tensor],
    plain_inputs: list[torch.Tensor],
    blocks: list[list[int]],
    budget: Callable[[int, int], None],
) -> tuple[Layout, list[Entry]]:
    """Each block of arguments compared on its own (``one``: ``compare`` but for the arguments), its non-zero
    entries in a store of their own: the same entries, columns and statistics as a joint comparison makes, a
    pass of backward calls per block. ``budget`` is told the calls of the blocks before too."""
    spent = Spent(budget)
    entries: list[Entry] = []
    for block in blocks:
        found = one(
            grad_inputs=[grad_inputs[i] for i in block],
            plain_inputs=[plain_inputs[i] for i in block],
            budget=spent.next(),
        )
        entries += found[1]
    return layout, entries


class Spent:
    """One ``budget`` over several comparisons: each is told the calls of those before it too."""

    def __init__(self, budget: Callable[[int, int], None]) -> None:
        self.budget, self.done, self.last = budget, 0, 0

    def next(self) -> Callable[[int, int], None]:
        """The budget of the next comparison (the calls of the one before counted as made)."""
        self.done, self.last = self.done + self.last, 0

        def told(calls: int, passes: int) -> None:
            self.last = max(self.last, calls)
            self.budget(self.done + calls, passes)

        return told


def _groups(jac: Jacobians, store: SparseRows, atol: float, rtol: float, streams: Streams) -> Groups | None:
    """The compressed numerical side, where it takes fewer forwards and fits (None: column by column)."""
    if len({id(x) for x in jac.layout.inputs}) < len(jac.layout.inputs):
        return None  # a tensor passed twice moves in both places: its columns are not independent
    groups = Groups(jac, store, atol, rtol, streams.generator(Stream.COMPRESSION), jac.outputs)
    return groups if groups.worthwhile() else None
