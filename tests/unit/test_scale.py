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
