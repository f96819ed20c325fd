"""On a GPU the compressed check keeps its numbers there (issue 30, item 1): the store's values (sorted there,
``rows.sorted_there``), the numerical entries and the statistics folded from them stay on the arguments'
device; only the structure (rows, column bounds, colours) is on the host. The report is the CPU's: verdicts,
counts and places the same, values to rounding (a GPU sums in another order). The folds that run on the host
(entries not finite, a failing argument's maps) read one host copy of the numerical entries.

On a CPU every tensor is on the host and the same code runs: the CPU half of each test holds there too."""

from __future__ import annotations

import math
from typing import Any

import numpy as np
import pytest
import torch
from corpus import Mul

from gradcheck_cli import check
from gradcheck_cli.examples import broken
from gradcheck_cli.examples.linear import LinearFunction
from gradcheck_cli.numerics import compressed
from gradcheck_cli.results import Status

cuda = pytest.mark.cuda
DEVICES = ["cpu", pytest.param("cuda", marks=cuda)]


def linear_args(n: int, device: str, seed: int = 0) -> list[torch.Tensor]:
    g = torch.Generator().manual_seed(seed)
    shapes = ((n, n), (n, n), (n,))
    return [torch.randn(*s, generator=g, dtype=torch.float64).to(device).requires_grad_() for s in shapes]


def rows_of(result: Any) -> list[tuple[Any, ...]]:
    (backward,) = [c for c in result.checks if c.check == "backward"]
    return [(r.name, r.status, r.mismatched, r.worst_index, r.max_abs_err) for r in backward.inputs]


def where_held(monkeypatch: pytest.MonkeyPatch) -> list[tuple[str, str]]:
    """(values' device, numerical entries' device) of each compressed fold, recorded."""
    seen: list[tuple[str, str]] = []
    fold = compressed.Groups.fold

    def recorded(self: compressed.Groups, *args: Any, **kwargs: Any) -> None:
        seen.append((self.store.vals.device.type, self.numerical.device.type))
        fold(self, *args, **kwargs)

    monkeypatch.setattr(compressed.Groups, "fold", recorded)
    return seen


def same_rows(got: list[tuple[Any, ...]], want: list[tuple[Any, ...]]) -> None:
    assert [r[:4] for r in got] == [r[:4] for r in want]
    for g, w in zip(got, want):
        assert (g[4] is None and w[4] is None) or g[4] == pytest.approx(w[4], rel=1e-6, abs=1e-12)


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("fn, status", [(LinearFunction, Status.PASS), (broken.LinearDoubleBias, Status.FAIL)])
def test_the_compressed_check_folds_where_the_arguments_are_and_reports_as_the_cpu(fn, status, device, monkeypatch):
    seen = where_held(monkeypatch)
    got = check(fn, linear_args(24, device))
    assert got.status is status
    assert seen and all(n == device for _, n in seen), seen  # the numerical entries stay on the device
    if device == "cuda":
        assert all(v == "cuda" for v, _ in seen), seen  # the store's values were sorted there and stay
    monkeypatch.undo()
    same_rows(rows_of(got), rows_of(check(fn, linear_args(24, "cpu"))))


@pytest.mark.parametrize("device", DEVICES)
def test_entries_not_finite_are_folded_on_the_host_from_one_copy(device, monkeypatch):
    g = torch.Generator().manual_seed(1)
    x = torch.randn(40, 40, generator=g, dtype=torch.float64)
    w = torch.randn(40, 40, generator=g, dtype=torch.float64)
    w[3, 4] = math.inf  # x * w's Jacobian has an infinite entry there (the fold's host path)
    args = [x.to(device).requires_grad_(), w.to(device).requires_grad_()]
    copies: list[int] = []
    on_host = compressed.Groups._numerical_on_host

    def counted(self: compressed.Groups, p: int, q: int) -> torch.Tensor:
        copies.append(self._host_numerical is None)
        return on_host(self, p, q)

    monkeypatch.setattr(compressed.Groups, "_numerical_on_host", counted)
    got = check(Mul, args)
    assert copies and sum(copies) <= 1  # asked for each block with an infinite entry, copied once
    monkeypatch.undo()
    want = check(Mul, [x.requires_grad_(), w.requires_grad_()])
    assert got.status is want.status
    same_rows(rows_of(got), rows_of(want))


@cuda
def test_on_a_gpu_a_failing_arguments_maps_and_diagnosis_are_the_cpus():
    got = check(broken.LinearWrongWeightTranspose, linear_args(16, "cuda"))
    want = check(broken.LinearWrongWeightTranspose, linear_args(16, "cpu"))
    assert got.status is want.status is Status.FAIL
    (g,) = [c for c in got.checks if c.check == "backward"]
    (w,) = [c for c in want.checks if c.check == "backward"]
    for a, b in zip(g.inputs, w.inputs):
        assert (a.status, a.pattern, a.mismatched_indices) == (b.status, b.pattern, b.mismatched_indices)
        assert (a.error_map is None) == (b.error_map is None)


def test_the_span_sums_made_span_by_span_are_the_sequential_sums_to_rounding():
    # a GPU sums each span on its own (its segment_reduce would sum a span's rows in one thread): the same sums
    from gradcheck_cli.numerics.stats import span_by_span

    g = torch.Generator().manual_seed(0)
    terms = torch.randn(1000, 3, generator=g, dtype=torch.float64)
    for spans in ([], [0], [1000], [10, 10, 500], [0, 999], list(range(0, 1000, 7))):
        ends = [0, *spans, 1000]
        lengths = torch.tensor([b - a for a, b in zip(ends, ends[1:])])
        want = torch.segment_reduce(terms, "sum", lengths=lengths, axis=0)
        got = span_by_span(terms, spans)
        assert got.shape == want.shape and torch.allclose(got, want, rtol=1e-12, atol=1e-12), spans


@cuda
def test_on_a_gpu_the_compressed_check_waits_for_the_device_as_often_at_any_size():
    # issue 30 item 1 on the device itself: a copy to a GPU from pageable memory waits for it (torch synchronises
    # the stream after it), which the CPU's count (tests/unit/test_host_syncs.py) cannot see. The profiler sees
    # every synchronisation the CUDA runtime makes: as many at n = 32 as at n = 96 (more stages, more pieces)
    from torch.profiler import ProfilerActivity, profile

    counts = []
    for n in (32, 96):
        args = linear_args(n, "cuda")
        check(LinearFunction, args)  # its first kernels and allocations are not the check's
        with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA]) as prof:
            assert check(LinearFunction, args).status is Status.PASS
        events = prof.key_averages()
        assert sum(e.count for e in events if e.key == "cudaLaunchKernel") > 0  # the runtime's calls are seen
        counts.append(sum(e.count for e in events if "Synchronize" in e.key))
    assert counts[0] > 0 and counts[0] == counts[1], counts


def test_a_host_array_sent_to_the_cpu_is_as_torch_makes_it():
    from gradcheck_cli.numerics.transfer import sent

    a = np.arange(12).reshape(3, 4)
    t = sent(a, torch.device("cpu"))
    assert torch.equal(t, torch.as_tensor(a)) and t.device.type == "cpu"
    assert sent([True, False], torch.device("cpu"), torch.bool).dtype == torch.bool
    assert sent(a, torch.device("meta")).device.type == "meta"  # another device: a plain copy


@cuda
def test_on_a_gpu_a_host_array_is_sent_without_waiting_for_the_device():
    from gradcheck_cli.numerics.transfer import sent

    a = np.random.default_rng(0).standard_normal(1 << 20)
    busy = torch.randn(4096, 4096, device="cuda")
    torch.cuda.set_sync_debug_mode("error")  # a synchronising call raises
    try:
        _ = busy @ busy  # work queued before the copy
        t = sent(a, torch.device("cuda"))
    finally:
        torch.cuda.set_sync_debug_mode(0)
    assert torch.equal(t.cpu(), torch.as_tensor(a))
