"""Work that must not grow with the size of the input: counted in torch operations, not timed.

Host synchronisations (``aten._local_scalar_dense``: a ``float(t)``, ``int(t)``, ``t.item()``) and the
number of torch operations a check makes, counted with a dispatch mode, are the same whether the
input has 1,600 or 25,600 elements: a Python loop over columns or chunks would show up as a count
that grows with them (as it did: 56 reads at (40, 40), 1,961 at (160, 160), a sum per chunk)."""

from __future__ import annotations

import collections
from typing import Any

import torch
from torch.utils._python_dispatch import TorchDispatchMode

import gradcheck_cli
from gradcheck_cli.examples.linear import LinearFunction
from gradcheck_cli.numerics.rows import Rows, SparseRows
from gradcheck_cli.results import Status


class _Count(TorchDispatchMode):
    def __init__(self) -> None:
        super().__init__()
        self.ops: collections.Counter[str] = collections.Counter()

    def __torch_dispatch__(self, func: Any, types: Any, args: Any = (), kwargs: Any = None) -> Any:
        self.ops[str(func.overloadpacket)] += 1
        return func(*args, **(kwargs or {}))


def _counted(n: int) -> collections.Counter[str]:
    x = torch.randn(n, n, dtype=torch.float64, generator=torch.Generator().manual_seed(n), requires_grad=True)
    with _Count() as mode:
        result = gradcheck_cli.check(torch.square, (x,))
    assert result.status is Status.PASS, result
    return mode.ops


def test_an_elementwise_check_reads_the_host_as_often_at_any_size():
    small, large = _counted(40), _counted(160)  # 16x the elements, 16x the columns and chunks
    reads = "aten._local_scalar_dense"
    assert large[reads] <= small[reads] + 8, (small[reads], large[reads])
    assert sum(large.values()) <= 1.5 * sum(small.values()), (sum(small.values()), sum(large.values()))


def test_a_jacobian_too_large_to_store_is_refused_after_a_few_grouped_calls(monkeypatch):
    """A Linear layer whose input alone has more non-zero entries (n^3) than the store holds within --max-memory,
    and whose dense rows would be recomputed hundreds of times: refused as too_large. The diagonal groups went
    on past the store's limit (all n of them), then a pass of one-hot rows looked for what the groups had already
    counted: 291 grad_outputs and a one-hot pass before the refusal at n = 96. The groups now stop once one
    argument alone has more entries than the store holds (an argument that fits is compared on its own): the
    all-at-once group's 3 grad_outputs, 3 for each diagonal up to the store's limit and 1 (the unit call, whose
    columns reached count the entries at least) for each one after."""
    seen = {"grad_outputs": 0, "one_hot_passes": 0}
    products, sparse_rows = Rows.products, Rows.sparse_rows

    def counted_products(self: Rows, grad_outs: list[torch.Tensor]) -> torch.Tensor:
        seen["grad_outputs"] += len(grad_outs[0])
        return products(self, grad_outs)

    def counted_sparse_rows(self: Rows, *args: Any, **kwargs: Any) -> Any:
        seen["one_hot_passes"] += 1
        return sparse_rows(self, *args, **kwargs)

    monkeypatch.setattr(Rows, "products", counted_products)
    monkeypatch.setattr(Rows, "sparse_rows", counted_sparse_rows)
    gen = torch.Generator().manual_seed(0)
    n = 96
    args = [
        torch.randn(*shape, dtype=torch.float64, generator=gen, requires_grad=True) for shape in ((n, n), (n, n), (n,))
    ]
    result = gradcheck_cli.check(LinearFunction, args, max_memory=4)
    assert result.status is Status.ERROR and result.error is not None and result.error.kind.value == "too_large"
    assert "the backward check was not started" in result.error.message and "--max-memory 4 MB" in result.error.message
    # the store holds 131,072 entries under --max-memory 4; a diagonal has 2n^2 + n = 18,528 (8 diagonals pass
    # the limit), the input n^2 = 9,216 of them (7 more diagonals, their unit calls alone, pass it)
    assert seen["one_hot_passes"] == 0 and seen["grad_outputs"] <= 3 + 3 * 8 + 7, seen


def _linear_args(n: int) -> list[torch.Tensor]:
    gen = torch.Generator().manual_seed(0)
    return [torch.randn(*s, dtype=torch.float64, generator=gen, requires_grad=True) for s in ((n, n), (n, n), (n,))]


class _WrongWeight(torch.autograd.Function):
    """A Linear layer whose weight gradient is half what it should be at W[0, 0] (a wrong entry in every row of
    output column 0)."""

    @staticmethod
    def forward(ctx: Any, x: torch.Tensor, w: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
        ctx.save_for_backward(x, w)
        return x @ w.t() + b

    @staticmethod
    def backward(ctx: Any, g: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        x, w = ctx.saved_tensors
        gw = g.t() @ x
        gw[0, 0] = gw[0, 0] / 2
        return g @ w, gw, g.sum(0)


def test_the_store_holds_an_entry_in_twelve_bytes():
    """The analytical Jacobian's non-zero entries are held as 32-bit rows and float64 values, the columns implied
    by where each column starts: 12 bytes an entry (a Linear layer's n = 256 has 33.6 million), where 64-bit
    columns and rows took 24 (and the compressed check kept each entry's rounding limit too, 8 more)."""
    n = 24
    x, w, b = _linear_args(n)
    store = SparseRows(*_entries(x, w, b), n_cols=2 * n * n + n)
    held = {t.untyped_storage().data_ptr(): t for t in vars(store).values() if isinstance(t, torch.Tensor)}
    per_entry = sum(t.element_size() * t.numel() for t in held.values())  # each memory once (a view of it is free)
    per_entry -= store.bounds.element_size() * store.bounds.numel()
    assert per_entry == 12 * len(store.vals) == 12 * (2 * n**3 + n * n)
    c, r, v = store.entries(n * n, 2 * n * n)  # the weight's columns, as before: column - first, row, value
    cols, rows, vals = _entries(x, w, b)
    mine = (cols >= n * n) & (cols < 2 * n * n)
    order = torch.argsort(cols[mine] * n * n + rows[mine])
    assert torch.equal(c, (cols[mine] - n * n)[order]) and torch.equal(r, rows[mine][order])
    assert torch.equal(v, vals[mine][order])
    from gradcheck_cli.numerics.rows import BUILD_BYTES, HELD_BYTES, store_limit

    assert BUILD_BYTES <= 28 and HELD_BYTES <= 20 and store_limit(512 * 2**20) >= 2**24  # n = 256: n^3 per argument


def _entries(x: torch.Tensor, w: torch.Tensor, b: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """The Linear layer's analytical Jacobian's non-zero entries (column, row, value), by row."""
    jac = torch.autograd.functional.jacobian(lambda *a: LinearFunction.apply(*a), (x, w, b))
    dense = torch.cat([j.reshape(x.shape[0] * w.shape[0], -1) for j in jac], dim=1)
    r, c = dense.nonzero(as_tuple=True)
    return c, r, dense[r, c]


def test_an_elementwise_check_whose_entries_fit_compactly_passes_within_max_memory():
    """x**2 on 400 x 400 under --max-memory 8: its 160,000 entries fit in the store, and one group of columns takes
    a few forwards. It was refused as too_large (6.4e+10 ... element visits): the compressed check was thought to
    hold five float64 values per group and output element at once (6.4 MB, beyond half the budget), though it
    makes them a stage of groups at a time. A wrong gradient at one element of 300 x 300 fails there (at 400 x 400
    the columns of the group it rejects, counted before they are made, are beyond the work limit)."""
    x = torch.randn(400, 400, dtype=torch.float64, generator=torch.Generator().manual_seed(3), requires_grad=True)
    result = gradcheck_cli.check(torch.square, (x,), max_memory=8)
    assert result.status is Status.PASS, result.error
    wrong = gradcheck_cli.check(_HalfSquare, (x[:300, :300].detach().requires_grad_(),), max_memory=8)
    assert wrong.status is Status.FAIL and wrong.checks[0].inputs[0].mismatched == 1, wrong.error


class _HalfSquare(torch.autograd.Function):
    """x**2 whose gradient is half what it should be at one element."""

    @staticmethod
    def forward(ctx: Any, x: torch.Tensor) -> torch.Tensor:
        ctx.save_for_backward(x)
        return x * x

    @staticmethod
    def backward(ctx: Any, g: torch.Tensor) -> torch.Tensor:
        (x,) = ctx.saved_tensors
        grad = 2 * x * g
        grad.view(-1)[777] /= 2
        return grad


def test_arguments_that_fit_the_store_one_at_a_time_are_compared_in_blocks(monkeypatch):
    """Linear n = 48 under --max-memory 4: its 223,488 non-zero entries do not fit in the store at once, the
    input's and the weight's 110,592 each do. The arguments are compared in blocks, each with a store of its own
    (the same numbers as with memory to spare); the dense rows, recomputed for each of 28 blocks of columns
    (76,128 calls), were the only way before."""

    def dense_rows(*args: Any, **kwargs: Any) -> Any:
        raise AssertionError("the dense rows were computed")

    big = gradcheck_cli.check(_WrongWeight, _linear_args(48), max_memory=512)
    monkeypatch.setattr(Rows, "rows", dense_rows)
    for fn in (LinearFunction, _WrongWeight):
        result = gradcheck_cli.check(fn, _linear_args(48), max_memory=4)
        assert result.status is (Status.PASS if fn is LinearFunction else Status.FAIL), result.error
    wrong = result.checks[0].inputs
    assert [(i.name, i.status, i.mismatched, i.worst_index, i.max_abs_err) for i in wrong] == [
        (i.name, i.status, i.mismatched, i.worst_index, i.max_abs_err) for i in big.checks[0].inputs
    ]
    assert (
        wrong[1].mismatched == 1
        and wrong[1].worst_index == [0, 0]
        and wrong[0].status is wrong[2].status is Status.PASS
    )
