"""The store's values left where they were sorted (``rows.sorted_there``, base 86d652d): the folds
that run on the host (a failing argument's maps, entries not finite, columns made one by one, and the checks
that are not compressed) read the values from one host copy, made once, as they read the numerical entries
(``Groups._numerical_on_host``): not a copy to the host per piece of columns, which on a GPU is a wait per
piece. On the CPU the values are on the host already and no copy is made."""

from __future__ import annotations

from typing import Any, Callable

import pytest
import torch

from gradcheck_cli import check
from gradcheck_cli.numerics import compressed
from gradcheck_cli.numerics.rows import SparseRows
from gradcheck_cli.results import Status


def copies_to_host(monkeypatch: pytest.MonkeyPatch) -> list[str]:
    """Each ``t.cpu()`` and ``t.to(<the cpu>)`` called from now on by a store's ``entries`` (the values of the
    columns a fold on the host reads), recorded."""
    seen: list[str] = []
    inside = [False]

    def counted(name: str, original: Callable[..., Any]) -> Callable[..., Any]:
        def call(t: torch.Tensor, *args: Any, **kwargs: Any) -> Any:
            where = kwargs.get("device", args[0] if args else None)
            if inside[0] and (name == "cpu" or str(where) == "cpu"):
                seen.append(name)
            return original(t, *args, **kwargs)

        return call

    entries = SparseRows.entries

    def reading(self: SparseRows, col0: int, col1: int) -> Any:
        inside[0] = True
        try:
            return entries(self, col0, col1)
        finally:
            inside[0] = False

    for name in ("cpu", "to"):
        monkeypatch.setattr(torch.Tensor, name, counted(name, getattr(torch.Tensor, name)))
    monkeypatch.setattr(SparseRows, "entries", reading)
    return seen


def test_the_stores_entries_read_its_values_from_one_host_copy(monkeypatch):
    n_cols, per = 50, 3
    rows = torch.arange(n_cols * per, dtype=torch.int64) % 7
    vals = torch.randn(n_cols * per, dtype=torch.float64)
    store = SparseRows.by_column(rows, vals, torch.arange(0, n_cols * per + 1, per))
    seen = copies_to_host(monkeypatch)
    got = [store.entries(c, c + 1)[2] for c in range(n_cols)]
    assert len(seen) <= 1, seen  # one copy of the values at most, not one per span of columns read
    monkeypatch.undo()
    assert torch.equal(torch.cat(got), vals)
    c, r, v = store.entries(3, 7)
    assert c.tolist() == [k // per for k in range(12)] and torch.equal(r, rows[9:21]) and torch.equal(v, vals[9:21])


class Square(torch.autograd.Function):
    """x^2, its gradient wrong at element 5 only (``WRONG``) or right."""

    WRONG = True

    @classmethod
    def forward(cls, ctx: Any, x: torch.Tensor) -> torch.Tensor:
        ctx.save_for_backward(x)
        return x * x

    @classmethod
    def backward(cls, ctx: Any, g: torch.Tensor) -> torch.Tensor:
        (x,) = ctx.saved_tensors
        grad = 2 * g * x
        if cls.WRONG:
            grad = grad.clone()
            grad[5] *= 3
        return grad


def failing(n: int, monkeypatch: pytest.MonkeyPatch) -> tuple[list[str], Any]:
    x = torch.randn(n, generator=torch.Generator().manual_seed(n), dtype=torch.float64).requires_grad_()
    seen = copies_to_host(monkeypatch)
    result = check(Square, [x])
    (row,) = [r for c in result.checks if c.check == "backward" for r in c.inputs]
    copied = list(seen)
    monkeypatch.undo()
    return copied, (result.status, row.status, row.mismatched, row.worst_index, row.pattern)


def test_a_failing_arguments_maps_copy_as_often_whatever_the_number_of_pieces(monkeypatch):
    # PIECE entries folded at once, in whole chunks of columns: at 64, one piece of the 1,000 elements' one chunk,
    # 16 of the 4,000 elements' (a chunk holds fewer columns where the outputs are more); a failing argument's
    # maps fold every piece's extras on the host
    monkeypatch.setattr(compressed, "PIECE", 64)
    few, small = failing(1000, monkeypatch)
    monkeypatch.setattr(compressed, "PIECE", 64)
    many, large = failing(4000, monkeypatch)
    assert small[:4] == large[:4] == (Status.FAIL, Status.FAIL, 1, [5])
    assert len(many) == len(few) <= 1, (few, many)  # the store's values copied to the host once at most
    x = torch.randn(1000, generator=torch.Generator().manual_seed(1000), dtype=torch.float64).requires_grad_()
    assert not torch.autograd.gradcheck(Square.apply, [x], raise_exception=False)
