"""Host synchronisations of a check do not grow with the number of groups or columns (issue 30, item 1).

What counts as a host synchronisation here (``HostSyncs``): every point where the host waits for a value of a
tensor, which on a GPU blocks until the device has computed it. On the CPU nothing waits, so the points are
counted, not timed:

- operators that read a value into Python: ``aten._local_scalar_dense`` (``t.item()``, ``float(t)``, ``int(t)``,
  ``bool(t)``, ``if t.any():``), ``aten.equal`` and ``aten.is_nonzero`` (they return a Python bool);
- operators whose output's shape depends on the values, which must read them to allocate it: ``aten.nonzero``,
  ``aten.masked_select``, ``aten.masked_scatter``, ``aten._unique``/``_unique2``/``unique_dim``/
  ``unique_consecutive``, ``aten.bincount``, ``aten.histc``, ``aten.repeat_interleave`` with a tensor of
  repeats and no ``output_size``, and indexing or index_put with a boolean mask (``t[mask]``, ``t[mask] = v``,
  which torch turns into a ``nonzero``);
- copies to the host, which do not all go through the dispatcher on the CPU and are counted by patching the
  Tensor methods for the duration: ``t.tolist()``, ``t.numpy()``, ``t.cpu()`` and ``t.to(<a cpu device>)``
  (by a device argument: ``"cpu"``, ``torch.device("cpu")``, ``device="cpu"``). On the CPU each of these is
  a no-op or a view, and on a GPU it is a blocking device-to-host copy, so each call counts, whatever its size.

Not counted: copies from the host to the device, which the numerics make without waiting for it
(``numerics.transfer.sent``, through pinned memory: a plain copy to a GPU waits for it, and
tests/unit/test_store_on_device.py counts a GPU's own synchronisations with its profiler), and host work on
NumPy arrays and Python lists (the groups' structure is made on the host once,
from one copy, and reading it waits for nothing).

A check's count is then compared at two sizes: a count that does not grow is a constant number of waits,
whatever the number of groups, stages, columns or pieces (before, a Linear layer made 481 at n=32 and 3,416 at
n=128: reads per group, per stage of groups and per piece of the statistics)."""

from __future__ import annotations

import collections
import math
from types import TracebackType
from typing import Any, Callable

import pytest
import torch
from torch.autograd.gradcheck import GradcheckError
from torch.utils._python_dispatch import TorchDispatchMode

import gradcheck_cli
from gradcheck_cli.examples.linear import LinearFunction
from gradcheck_cli.results import Status

READS = {"aten._local_scalar_dense", "aten.equal", "aten.is_nonzero"}
VALUE_SHAPED = {
    "aten.nonzero",
    "aten.masked_select",
    "aten.masked_scatter",
    "aten.masked_scatter_",
    "aten._unique",
    "aten._unique2",
    "aten.unique_dim",
    "aten.unique_consecutive",
    "aten.unique_dim_consecutive",
    "aten.bincount",
    "aten.histc",
}
INDEXING = {"aten.index", "aten.index_put", "aten.index_put_", "aten._index_put_impl_"}
COPIES = ("tolist", "numpy", "cpu", "to")


def _to_cpu(args: tuple[Any, ...], kwargs: dict[str, Any]) -> bool:
    """Whether a ``Tensor.to`` call names the CPU as its device."""
    named = [kwargs["device"]] if "device" in kwargs else [a for a in args if isinstance(a, (str, torch.device))]
    return any(torch.device(d).type == "cpu" for d in named if d is not None)


class HostSyncs(TorchDispatchMode):
    """Counts host synchronisations (see the module) while it is entered, by name in ``counts``."""

    def __init__(self) -> None:
        super().__init__()
        self.counts: collections.Counter[str] = collections.Counter()
        self._saved: dict[str, Callable[..., Any]] = {}

    @property
    def total(self) -> int:
        return sum(self.counts.values())

    def __torch_dispatch__(self, func: Any, types: Any, args: Any = (), kwargs: Any = None) -> Any:
        kwargs = kwargs or {}
        name = str(func.overloadpacket)
        if name in READS or name in VALUE_SHAPED:
            self.counts[name] += 1
        elif name == "aten.repeat_interleave" and isinstance(args[0], torch.Tensor):
            repeats = args[1] if len(args) > 1 else kwargs.get("repeats")
            tensor_repeats = repeats is None or isinstance(repeats, torch.Tensor)  # (repeats) alone: a tensor
            if tensor_repeats and kwargs.get("output_size") is None:
                self.counts[name] += 1
        elif name in INDEXING:
            indices = args[1] if len(args) > 1 else kwargs.get("indices", ())
            if any(isinstance(i, torch.Tensor) and i.dtype in (torch.bool, torch.uint8) for i in indices or ()):
                self.counts[name + " (mask)"] += 1
        return func(*args, **kwargs)

    def __enter__(self) -> HostSyncs:
        for method in COPIES:
            original = getattr(torch.Tensor, method)
            self._saved[method] = original
            setattr(torch.Tensor, method, self._counted(method, original))
        try:
            super().__enter__()
        except BaseException:
            self._restore()
            raise
        return self

    def __exit__(
        self, kind: type[BaseException] | None, error: BaseException | None, trace: TracebackType | None
    ) -> None:
        try:
            super().__exit__(kind, error, trace)
        finally:
            self._restore()

    def _restore(self) -> None:
        for method, original in self._saved.items():
            setattr(torch.Tensor, method, original)
        self._saved = {}

    def _counted(self, method: str, original: Callable[..., Any]) -> Callable[..., Any]:
        def counted(tensor: torch.Tensor, *args: Any, **kwargs: Any) -> Any:
            if method != "to" or _to_cpu(args, kwargs):
                self.counts[f"Tensor.{method}"] += 1
            return original(tensor, *args, **kwargs)

        return counted


def test_the_counter_counts_each_kind_of_host_synchronisation_once_and_device_work_not_at_all():
    t = torch.arange(6, dtype=torch.float64)
    mask = t > 2
    methods = [getattr(torch.Tensor, m) for m in COPIES]
    with HostSyncs() as syncs:
        t.mul(2).add_(1).cumsum(0)  # device work: no wait
        t.index_select(0, torch.tensor([1, 2])).sum(0)
        torch.repeat_interleave(t, torch.tensor([1] * 6), output_size=6)
        torch.as_tensor([1.0, 2.0], device="cpu")  # to the device: no wait
        t.to(torch.float32)
        assert syncs.total == 0, syncs.counts
        float(t[0]), int(t[1]), bool(t[2]), t[3].item(), torch.equal(t, t)
        assert syncs.counts == {"aten._local_scalar_dense": 4, "aten.equal": 1}, syncs.counts
        t.nonzero(), t[mask], torch.bincount(t.long()), torch.unique(t), torch.repeat_interleave(t, t.long())
        t.tolist(), t.numpy(), t.cpu(), t.to("cpu"), t.to(device=torch.device("cpu"), dtype=torch.float32)
    assert syncs.counts == {
        "aten._local_scalar_dense": 4,
        "aten.equal": 1,
        "aten.nonzero": 1,
        "aten.index (mask)": 1,
        "aten.bincount": 1,
        "aten._unique2": 1,
        "aten.repeat_interleave": 1,
        "Tensor.tolist": 1,
        "Tensor.numpy": 1,
        "Tensor.cpu": 1,
        "Tensor.to": 2,
    }, syncs.counts
    assert [getattr(torch.Tensor, m) for m in COPIES] == methods  # put back


def _linear(n: int, wrong: bool = False) -> tuple[Any, list[torch.Tensor]]:
    g = torch.Generator().manual_seed(n)
    args = [torch.randn(*s, dtype=torch.float64, generator=g).requires_grad_() for s in ((n, n), (n, n), (n,))]
    return (WrongBias if wrong else LinearFunction), args


class WrongBias(LinearFunction):
    """A Linear layer whose bias gradient is twice the true one."""

    @staticmethod
    def backward(ctx: Any, grad_output: torch.Tensor) -> Any:
        gi, gw, gb = LinearFunction.backward(ctx, grad_output)
        return gi, gw, None if gb is None else 2 * gb


def _counted(fn: Any, args: Any) -> tuple[Status, collections.Counter[str]]:
    with HostSyncs() as syncs:
        result = gradcheck_cli.check(fn, args)
    return result.status, syncs.counts


@pytest.mark.slow
def test_the_default_check_of_a_linear_layer_waits_for_the_host_as_often_at_n_32_and_n_128():
    """The compressed path (grouped rows: n diagonals; column groups: 2n + 1 pieces of 4 moves): 4x the groups,
    64x the Jacobian's entries, the same count. torch.autograd.gradcheck agrees that it is right."""
    small, large = _counted(*_linear(32)), _counted(*_linear(128))
    assert small[0] is Status.PASS and large[0] is Status.PASS
    assert torch.autograd.gradcheck(LinearFunction.apply, _linear(32)[1])
    assert large[1] == small[1], (sum(small[1].values()), sum(large[1].values()), large[1] - small[1])


def test_a_wrong_bias_gradient_of_a_linear_layer_still_fails_on_the_compressed_path():
    """The same path (compressed from n = 16 on) fails a bias gradient twice the true one, as torch does."""
    for n in (16, 32):
        fn, args = _linear(n, wrong=True)
        assert gradcheck_cli.check(fn, args).status is Status.FAIL
        with pytest.raises(GradcheckError):
            torch.autograd.gradcheck(fn.apply, args)


def test_an_elementwise_check_waits_for_the_host_as_often_at_any_size():
    """x**2 (one group of every column, the elementwise path): 16x the elements, the same count."""

    def square(n: int) -> tuple[Status, collections.Counter[str]]:
        x = torch.randn(n, n, dtype=torch.float64, generator=torch.Generator().manual_seed(n), requires_grad=True)
        return _counted(torch.square, (x,))

    small, large = square(40), square(160)
    assert small[0] is Status.PASS and large[0] is Status.PASS
    assert large[1] == small[1], (sum(small[1].values()), sum(large[1].values()), large[1] - small[1])


def _blocks(finite: bool) -> tuple[Any, Any, list[int]]:
    """Five blocks folded into two entries: one by one (``update_entries``: each block's ``fallback``), and by
    ``fold_agreed`` (not yet flushed); a block holds an infinite numerical entry unless ``finite``."""
    from gradcheck_cli.numerics import ArgumentComparison

    g = torch.Generator().manual_seed(0)
    one_by_one, at_once = ArgumentComparison(40, atol=1e-5, rtol=1e-3), ArgumentComparison(40, atol=1e-5, rtol=1e-3)
    located: list[int] = []
    for b, size in enumerate([6, 0, 9, 5, 7]):
        c = torch.sort(torch.randint(0, 4, (size,), generator=g)).values
        r = torch.randint(0, 6, (size,), generator=g)
        av = torch.randn(size, dtype=torch.float64, generator=g)
        nv = av * (1 + 1e-4 * b * torch.randn(size, dtype=torch.float64, generator=g))
        if b == 3 and not finite:
            nv[2] = math.inf
        spans = [size // 2] if size else []
        places = list(zip(c.tolist(), r.tolist()))

        def locate(k: int, places: list[tuple[int, int]] = places) -> tuple[int, int]:
            located.append(k)
            return places[k]

        def fallback(entry: Any, c: Any = c, r: Any = r, av: Any = av, nv: Any = nv, b: int = b) -> None:
            no_probe = torch.zeros(6, dtype=torch.float64)
            entry.update_entries(c, r, av, nv, (4, 6), 4 * b, no_probe, spans=[len(av) // 2] if len(av) else [])

        fallback(one_by_one)
        at_once.fold_agreed(av, nv, (4, 6), 4 * b, locate, fallback, spans=spans)
    located.clear()
    return one_by_one, at_once, located


@pytest.mark.parametrize("finite", [True, False], ids=["finite", "an-infinite-entry"])
def test_statistics_read_once_for_many_blocks_are_those_read_block_by_block(finite: bool):
    """``ArgumentComparison.fold_agreed`` then one ``flush`` gives what ``update_entries`` gives block by block (its
    ``fallback`` too where a block holds an entry that is not finite), the worst entry located once; of
    finite blocks, two reads: every block's statistics, and the sums."""
    one_by_one, at_once, located = _blocks(finite)
    with HostSyncs() as syncs:
        at_once.flush()
    fields = ("max_abs", "max_rel", "worst_excess", "worst_row", "worst_col", "analytical", "numerical")
    fields += ("nonfinite", "sum_an", "sum_nn", "sum_aa")
    assert [getattr(at_once, f) for f in fields] == [getattr(one_by_one, f) for f in fields]
    assert at_once.nonfinite == (0 if finite else 1) and len(located) <= 1
    if finite:
        assert syncs.counts == {"Tensor.tolist": 2}, syncs.counts
