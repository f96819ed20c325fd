"""Memory traffic: the bytes the ops run under a ``Traffic`` mode read and write, the time of a memory-bound
device (a GPU comparing kernel-sized tensors) counted on any device, the same on every run.

An op's traffic is its tensor arguments' bytes and its new results' bytes: an in-place op reads and writes
its tensor, an ``out=`` op writes its out tensor, a view (a result on an argument's storage) moves nothing, a gather (``take``, ``index_select``)
reads what it writes. Tensors under ``least`` bytes are left out (scalars, indices). Used by the tests of
the reference check and by benchmarks/bench_gpu.py (``from tests.traffic import Traffic``)."""

from __future__ import annotations

from collections import Counter
from typing import Any

import torch
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils._pytree import tree_flatten

aten = torch.ops.aten
GATHERS = {aten.take.default, aten.index_select.default, aten.index.Tensor}


def _tensors(tree: Any) -> list[torch.Tensor]:
    return [t for t in tree_flatten(tree)[0] if isinstance(t, torch.Tensor)]


class Traffic(TorchDispatchMode):
    """``bytes``: the traffic of the ops run under it; ``by_op``: the same per op."""

    def __init__(self, least: int = 1 << 16) -> None:
        super().__init__()
        self.least = least
        self.by_op: Counter[str] = Counter()

    @property
    def bytes(self) -> int:
        return sum(self.by_op.values())

    def __torch_dispatch__(self, func: Any, types: Any, args: Any = (), kwargs: Any = None) -> Any:
        kwargs = kwargs or {}
        out = func(*args, **kwargs)
        given = _tensors((args, {k: v for k, v in kwargs.items() if k != "out"}))  # an out= tensor is not read
        made = _tensors(out)
        storages = {t.untyped_storage().data_ptr() for t in given}
        new = [t for t in made if t.untyped_storage().data_ptr() not in storages]
        if func in GATHERS:
            moved = [*made, *made]
        elif func._schema.is_mutable:
            moved = [*given, *made]  # read and written in place
        elif made and not new:
            moved = []  # a view
        else:
            moved = [*given, *new]
        size = sum(t.numel() * t.element_size() for t in moved if t.numel() * t.element_size() >= self.least)
        if size:
            self.by_op[str(func)] += size
        return out
