"""Span sums off the CPU (``stats.span_by_span``, base 86d652d): a compressed check's pieces hold
a span per chunk of columns, and a chunk is a few columns where the outputs are large (an elementwise function
of 300,000 elements has about 100,000 spans), so a GPU's span sums take a constant number of ops, whatever the
number of spans (one sum per span was a launch and a Python step each), read no value on the host (the spans
are sliced there from the store's column bounds), and no GPU thread sums more than a block of rows in order. The sums are the sequential ones to rounding, and a span's bits do not depend on the
spans beside it."""

from __future__ import annotations

import collections
from typing import Any

import pytest
import torch
from torch.utils._python_dispatch import TorchDispatchMode

from gradcheck_cli.numerics import stats


class Ops(TorchDispatchMode):
    """Counts the aten ops run."""

    def __init__(self) -> None:
        super().__init__()
        self.count: collections.Counter[str] = collections.Counter()

    def __torch_dispatch__(self, func: Any, types: Any, args: Any = (), kwargs: Any = None) -> Any:
        self.count[str(func.overloadpacket)] += 1
        return func(*args, **(kwargs or {}))


def sequential(terms: torch.Tensor, spans: list[int]) -> torch.Tensor:
    ends = [0, *spans, len(terms)]
    lengths = torch.tensor([b - a for a, b in zip(ends, ends[1:])])
    return torch.segment_reduce(terms, "sum", lengths=lengths, axis=0)


def ops(terms: torch.Tensor, spans: list[int], *there: torch.Tensor) -> collections.Counter[str]:
    with Ops() as seen:
        stats.span_by_span(terms, spans, *there)
    return seen.count


def test_span_sums_off_the_cpu_take_a_constant_number_of_ops_whatever_the_number_of_spans():
    terms = torch.randn(20_000, 3, generator=torch.Generator().manual_seed(0), dtype=torch.float64)
    few, many = ops(terms, list(range(2_000, 20_000, 2_000))), ops(terms, list(range(2, 20_000, 2)))
    assert sum(many.values()) == sum(few.values()), (few, many)  # one sum per span: 10 and 10,000 ops


def test_span_sums_of_spans_at_hand_on_the_device_read_nothing_on_the_host():
    terms = torch.randn(20_000, 3, generator=torch.Generator().manual_seed(0), dtype=torch.float64)
    spans = list(range(2, 20_000, 2))
    seen = ops(terms, spans, torch.tensor(spans, dtype=torch.int64))  # (the CPU stands for the device)
    # no value read (segment_reduce's own check of its lengths reads two), no tensor made from the host's data
    assert not {"aten._local_scalar_dense", "aten.lift_fresh", "aten._to_copy"} & set(seen), seen


@pytest.mark.cuda
def test_span_sums_on_a_gpu_wait_for_nothing():
    terms = torch.randn(20_000, 3, generator=torch.Generator().manual_seed(0), dtype=torch.float64)
    spans = list(range(2, 20_000, 2))
    there, on_gpu = torch.tensor(spans, device="cuda"), terms.cuda()
    torch.cuda.synchronize()
    torch.cuda.set_sync_debug_mode("error")  # a host wait raises
    try:
        got = stats.span_by_span(on_gpu, spans, there)
    finally:
        torch.cuda.set_sync_debug_mode("default")
    assert torch.allclose(got.cpu(), sequential(terms, spans), rtol=1e-12, atol=1e-9)


@pytest.mark.parametrize("block", [1, 3, 4, 1 << 10])
@pytest.mark.parametrize(
    "spans", [[], [0], [1000], [10, 10, 500], [0, 999], list(range(0, 1000, 7)), [1, 2, 3, 900], list(range(1, 1000))]
)
def test_span_sums_in_blocks_are_the_sequential_sums(spans, block, monkeypatch):
    monkeypatch.setattr(stats, "SPAN_BLOCK", block)
    terms = torch.randn(1000, 3, generator=torch.Generator().manual_seed(1), dtype=torch.float64) * 1e3
    got, want = stats.span_by_span(terms, spans), sequential(terms, spans)
    assert torch.equal(stats.span_by_span(terms, spans, torch.tensor(spans, dtype=torch.int64)), got)
    assert got.shape == want.shape == (len(spans) + 1, 3)
    assert torch.allclose(got, want, rtol=1e-12, atol=1e-9), spans
    ends = [0, *spans, 1000]
    for k, (a, b) in enumerate(zip(ends, ends[1:])):  # a span's bits are its own, whatever stands beside it
        assert torch.equal(got[k], stats.span_by_span(terms[a:b], [])[0])


def test_no_rows_and_empty_spans_sum_to_zero():
    empty = torch.zeros(0, 3, dtype=torch.float64)
    assert torch.equal(stats.span_by_span(empty, []), torch.zeros(1, 3, dtype=torch.float64))
    assert torch.equal(stats.span_by_span(empty, [0, 0]), torch.zeros(3, 3, dtype=torch.float64))
