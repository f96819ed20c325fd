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
    """A Linear layer whose 2n^3 non-zero entries exceed the store's share of --max-memory, and whose dense rows
    would be recomputed hundreds of times: refused as too_large. The diagonal groups went on past the store's
    limit (all n of them), then a pass of one-hot rows looked for what the groups had already counted: 291
    grad_outputs and a one-hot pass before the refusal at n = 96 (0.6 s against 6.8 s), now 12."""
    from gradcheck_cli.examples.linear import LinearFunction
    from gradcheck_cli.numerics.rows import Rows

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
    assert seen["one_hot_passes"] == 0 and seen["grad_outputs"] <= 30, seen
