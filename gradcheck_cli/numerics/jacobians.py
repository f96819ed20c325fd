"""Both Jacobians of one check, compared entry by entry, a block of columns at a time, in bounded memory.

Complex tensors are handled as pairs of reals ("realified"): a complex input contributes two
columns per element (real and imaginary part), a complex output two rows. With PyTorch's
convention (the gradient of a real loss L w.r.t. z = a + ib is dL/da + i dL/db) the
vector-Jacobian product of the realified function is exactly the realified gradient, so one
comparison serves real and complex functions alike. Pure torch.

``compare`` takes the two Jacobians one of six ways (``Strategy``), chosen by ``choose_strategy`` from the
sizes, the memory budget and the non-zero entries found, each compared by a function of its own:
``DENSE`` (the dense analytical rows held whole, as a small check always is), ``DENSE_BLOCKS`` (the dense rows
recomputed for each block of columns that fits), ``SPARSE`` (the rows' non-zero entries kept in a store, the
numerical columns made one by one), ``COMPRESSED`` (the store's entries, the numerical columns a group of
structurally orthogonal columns at a time), ``COMPRESSED_AT_ONCE`` (as ``COMPRESSED``, the rows from one backward
call for every output's elements) and ``BY_ARGUMENT`` (each block of arguments compared on its own, in a store of
its own). In each, at most about ``memory_bytes`` of Jacobian entries are held at once. What ``compare``
returns (``Compared``) records the strategy that ran; no report shows it.
"""

from __future__ import annotations

import enum
from collections.abc import Iterator
from dataclasses import dataclass, field
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
from .stats import ArgumentComparison
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
    """The random probe u over the rows whose u^T J every ``ArgumentComparison`` of ``compare`` keeps."""
    return signed_uniform((layout.n_rows,), streams.generator(Stream.PROJECTION))


class Strategy(enum.Enum):
    """How ``compare`` takes the two Jacobians (``choose_strategy`` picks one, ``Compared.strategy`` says which ran)."""

    DENSE = "dense"  # the dense analytical rows held whole (a small check: always), one pass over the columns
    DENSE_BLOCKS = "dense blocks"  # the dense rows recomputed for each block of columns that fits the budget
    SPARSE = "sparse"  # the non-zero entries of the rows kept in a store, the numerical columns one by one
    COMPRESSED = "compressed"  # the store's entries, the numerical columns a group of orthogonal columns at a time
    COMPRESSED_AT_ONCE = "compressed at once"  # as COMPRESSED, every output's elements in one backward call
    BY_ARGUMENT = "by argument"  # each block of arguments compared on its own, in a store of its own


class Compared(tuple[Layout, list[ArgumentComparison]]):
    """What ``compare`` returns: ``(layout, entries)``, and the ``strategy`` that made them (no report shows it)."""

    strategy: Strategy

    def __new__(cls, layout: Layout, entries: list[ArgumentComparison], strategy: Strategy) -> Compared:
        made = super().__new__(cls, (layout, entries))
        made.strategy = strategy
        return made

    def __getnewargs__(self) -> tuple[Layout, list[ArgumentComparison], Strategy]:
        return self[0], self[1], self.strategy


@dataclass(frozen=True)
class Plan:
    """The sizes ``compare`` decides from, and the statistics it fills: fixed before any backward call."""

    jac: Jacobians
    inputs: list[torch.Tensor]  # ``plain_inputs``
    probe: torch.Tensor
    entries: list[ArgumentComparison]
    block: int  # columns whose dense rows are held at once
    chunk: int  # numerical columns made at once
    fits: bool  # the dense rows of all the columns fit at once
    most: int  # non-zero entries a store keeps at most
    small: bool  # taken whole (see ``compare``)
    compress: bool  # the numerical columns may be taken a group at a time
    grouping: bool  # and the rows' non-zero entries found from grouped rows (``RowGroups``)

    @property
    def layout(self) -> Layout:
        return self.jac.layout


@dataclass(frozen=True)
class Choice:
    """The strategy ``choose_strategy`` chose, and what finding it made: the store of non-zero entries, the groups
    of columns, the calls of the compressed check at its cheapest, the blocks of arguments compared on their own."""

    strategy: Strategy
    store: SparseRows | None = None
    groups: Groups | None = None
    calls: int = 0
    blocks: list[list[int]] = field(default_factory=list)


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
) -> Compared:
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
    columns, each argument is compared on its own (its own store: ``_in_blocks``).
    ``keep_share``: the number of arguments that share the kept mismatching columns' memory (0: these).

    ``choose_strategy`` picks how (a ``Strategy``), one comparer per strategy compares; the result is
    ``(layout, entries)``, its ``strategy`` the one that ran.
    """
    plan = _plan(
        Jacobians(
            call,
            grad,
            [outputs[p] for p in positions],
            grad_inputs,
            plain_values,
            make_layout(plain_inputs, outputs, positions),
            eps,
            batched,
            memory_bytes,
        ),
        plain_inputs,
        streams,
        atol=atol,
        rtol=rtol,
        memory_bytes=memory_bytes,
        compress=compress,
        keep_share=keep_share,
    )
    choice = choose_strategy(plan, streams, atol, rtol, budget)
    if choice.strategy is Strategy.BY_ARGUMENT:
        again = partial(
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
            compress=plan.compress,
            keep_share=len(plain_inputs),
        )
        layout, entries = _in_blocks(again, plan.layout, grad_inputs, plain_inputs, choice.blocks, budget)
        return Compared(layout, entries, choice.strategy)
    _COMPARERS[choice.strategy](plan, choice, budget)
    return Compared(plan.layout, plan.entries, choice.strategy)


def _plan(
    jac: Jacobians,
    plain_inputs: list[torch.Tensor],
    streams: Streams,
    *,
    atol: float,
    rtol: float,
    memory_bytes: int,
    compress: bool,
    keep_share: int,
) -> Plan:
    """``compare``'s sizes, from the memory budget and the layout alone."""
    layout = jac.layout
    probe = projection(layout, streams)
    keep = memory_bytes // 16 // max(1, keep_share or len(plain_inputs))  # mismatching columns kept whole, each
    entries = [ArgumentComparison(real_numel(t), atol, rtol, keep_bytes=keep) for t in plain_inputs]
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
    return Plan(jac, plain_inputs, probe, entries, block, chunk, fits, most, small, compress, grouping)


def choose_strategy(
    plan: Plan, streams: Streams, atol: float, rtol: float, budget: Callable[[int, int], None]
) -> Choice:
    """The strategy of one comparison, with what finding it made. The choice rests on the non-zero entries
    found, so it makes the backward passes that find them (and tells ``budget`` their calls first), in order:

    - COMPRESSED_AT_ONCE: the compressed check at its cheapest, every output's elements in one backward call
      (an elementwise or row-wise function), a few forwards per group of columns; its calls are budgeted as
      they are, so a large sparse check is not refused for what it would cost element by element;
    - else, one pass budgeted: the diagonals (grouped rows), else one-hot rows (``sparse_rows``), find the
      non-zero entries: BY_ARGUMENT where the diagonals counted the arguments past the store's limit, each
      within it; COMPRESSED where the store's groups of columns take fewer forwards; SPARSE where a store
      holds the entries but the columns are made one by one;
    - no store (a small check, or too many non-zero entries): DENSE where the dense rows fit at once, else
      DENSE_BLOCKS, the passes over the rows budgeted.
    """
    layout = plan.layout
    found = (
        RowGroups(plan.jac, streams.generator(Stream.ROW_GROUPS), plan.most, at_once=True) if plan.grouping else None
    )
    store = found.store() if found is not None else None
    groups = _groups(plan.jac, store, atol, rtol, streams) if store is not None else None
    if found is not None and groups is not None:
        calls = found.calls + groups.forwards
        budget(calls, 1)
        return Choice(Strategy.COMPRESSED_AT_ONCE, store, groups, calls)
    budget(2 * layout.n_cols + layout.n_rows, 1)
    if store is None:  # the diagonals, else one-hot rows
        store, blocks = _kept_entries(plan, streams)
        if blocks is not None:
            return Choice(Strategy.BY_ARGUMENT, blocks=blocks)
    if store is None:
        if plan.block < layout.n_cols:
            passes = -(-layout.n_cols // plan.block)  # after the pass that looked for the non-zero entries
            budget(2 * layout.n_cols + (passes + 1) * layout.n_rows, passes)
            return Choice(Strategy.DENSE_BLOCKS)
        return Choice(Strategy.DENSE)
    groups = _groups(plan.jac, store, atol, rtol, streams) if plan.compress else None
    return Choice(Strategy.COMPRESSED if groups is not None else Strategy.SPARSE, store, groups)


def _kept_entries(plan: Plan, streams: Streams) -> tuple[SparseRows | None, list[list[int]] | None]:
    """The store of the non-zero entries from the diagonals, else from one-hot rows (None: too many, or a small
    check), or the blocks of arguments to compare on their own (where the diagonals counted them)."""
    layout = plan.layout
    # where the dense rows would be recomputed per block, the diagonals count each argument's entries
    # past the store's limit: arguments that fit on their own are compared in blocks that fit
    distinct = len({id(x) for x in plan.inputs}) == len(plan.inputs) > 1  # a tensor passed twice: joint
    parts = layout.col_starts if not plan.fits and distinct else None
    diagonals = (
        RowGroups(plan.jac, streams.generator(Stream.ROW_GROUPS), plan.most, tried=True, parts=parts)
        if plan.grouping
        else None
    )
    store = diagonals.store() if diagonals is not None else None
    if diagonals is not None and diagonals.counted:
        return store, _blocks(diagonals.per_part.tolist(), plan.most)
    # where the diagonals already found more than ``most`` non-zero entries, the one-hot rows would too
    if store is None and not plan.small and not (diagonals is not None and diagonals.count > diagonals.limit):
        store = plan.jac.sparse_rows(plan.most, early=plan.fits)
    return store, None


def _compare_compressed(plan: Plan, choice: Choice, budget: Callable[[int, int], None]) -> None:
    """COMPRESSED and COMPRESSED_AT_ONCE: the groups' columns, those of the groups that disagree one by one
    (halving them first costs less; budgeted again where the calls were budgeted as they are)."""
    groups = choice.groups
    assert groups is not None
    groups.evaluate()
    if choice.calls:
        budget(choice.calls + 2 * int((~groups.accepted).sum()), 1)
    groups.narrow()
    starts = plan.layout.col_starts
    for i, entry in enumerate(plan.entries):
        groups.fold(entry, starts[i], starts[i + 1], plan.probe, plan.chunk)


def _compare_sparse(plan: Plan, choice: Choice, budget: Callable[[int, int], None]) -> None:
    """SPARSE: each chunk of numerical columns compared at the store's entries (no rows held: one pass)."""
    store = choice.store
    assert store is not None
    for c0, c1 in _spans(0, plan.layout.n_cols, plan.chunk):
        n_chunk = plan.jac.columns(c0, c1)
        for entry, lo, hi, start in _overlaps(plan, c0, c1):
            c, r, v = store.entries(lo, hi)
            entry.update_sparse(c, r, v, n_chunk[lo - c0 : hi - c0], start, plan.probe)


def _compare_dense(plan: Plan, choice: Choice, budget: Callable[[int, int], None]) -> None:
    """DENSE: the dense rows of all the columns held at once, one pass over the chunks of columns."""
    if plan.layout.n_cols:
        _dense_block(plan, 0, plan.layout.n_cols)


def _compare_dense_blocks(plan: Plan, choice: Choice, budget: Callable[[int, int], None]) -> None:
    """DENSE_BLOCKS: the dense rows recomputed for each block of columns, one block held at a time."""
    for col0, col1 in _spans(0, plan.layout.n_cols, plan.block):
        _dense_block(plan, col0, col1)


def _dense_block(plan: Plan, col0: int, col1: int) -> None:
    """The dense rows of columns ``col0:col1``, compared with their numerical columns chunk by chunk (the rows
    are freed on return: before the next block is allocated)."""
    a_block = plan.jac.rows(col0, col1)
    for c0, c1 in _spans(col0, col1, plan.chunk):
        n_chunk = plan.jac.columns(c0, c1)
        for entry, lo, hi, start in _overlaps(plan, c0, c1):
            entry.update(a_block[lo - col0 : hi - col0], n_chunk[lo - c0 : hi - c0], start, plan.probe)


def _spans(start: int, stop: int, step: int) -> Iterator[tuple[int, int]]:
    """``start:stop`` in consecutive spans of ``step`` (the last may be shorter)."""
    for lo in range(start, stop, step):
        yield lo, min(stop, lo + step)


def _overlaps(plan: Plan, c0: int, c1: int) -> Iterator[tuple[ArgumentComparison, int, int, int]]:
    """Each argument's entry whose columns meet ``c0:c1``, with the columns they share (``lo:hi``) and where
    ``lo`` lies among the argument's own columns."""
    starts = plan.layout.col_starts
    for i, entry in enumerate(plan.entries):
        lo, hi = max(c0, starts[i]), min(c1, starts[i + 1])
        if lo < hi:
            yield entry, lo, hi, lo - starts[i]


_COMPARERS: dict[Strategy, Callable[[Plan, Choice, Callable[[int, int], None]], None]] = {
    Strategy.DENSE: _compare_dense,
    Strategy.DENSE_BLOCKS: _compare_dense_blocks,
    Strategy.SPARSE: _compare_sparse,
    Strategy.COMPRESSED: _compare_compressed,
    Strategy.COMPRESSED_AT_ONCE: _compare_compressed,
}  # BY_ARGUMENT: ``_in_blocks`` (it compares again, through ``compare``)


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
    one: Callable[..., tuple[Layout, list[ArgumentComparison]]],
    layout: Layout,
    grad_inputs: list[torch.Tensor],
    plain_inputs: list[torch.Tensor],
    blocks: list[list[int]],
    budget: Callable[[int, int], None],
) -> tuple[Layout, list[ArgumentComparison]]:
    """Each block of arguments compared on its own (``one``: ``compare`` but for the arguments), its non-zero
    entries in a store of their own: the same entries, columns and statistics as a joint comparison makes, a
    pass of backward calls per block. ``budget`` is told the calls of the blocks before too."""
    spent = Spent(budget)
    entries: list[ArgumentComparison] = []
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
