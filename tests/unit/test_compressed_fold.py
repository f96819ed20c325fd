"""The compressed check's fold under a small budget (numerics/compressed.py, ``Groups.fold``): the columns come
in chunks; a chunk holding a column of a group that was not accepted is made column by column, the accepted
spans between such chunks are folded as their entries alone, in pieces of whole chunks. Every column of an
argument must reach its statistics once, with the element-by-element values: the report's rows, error maps
and systematic ratios included, are those of ``compress=False`` at the same budget."""

from __future__ import annotations

from collections.abc import Callable, Iterator

import pytest
import torch

from gradcheck_cli import check
from gradcheck_cli.numerics import compressed
from gradcheck_cli.numerics.stats import ArgumentComparison
from gradcheck_cli.results import CaseResult

try:  # tests/ on sys.path (rootdir-style collection) or tests/ as a package
    from corpus import report_rows
except ImportError:  # pragma: no cover
    from tests.corpus import report_rows

F64 = torch.float64
N = 12  # features: x, W of 12 x 12 and b of 12 are 300 columns of 12 entries (144 rows)
# bytes: the store (3600 entries) fits; the columns come in chunks of 5 (8 bytes x 144 rows x 64 x 5), so W's
# columns (144..288) and b's (288..300) start within a chunk
BUDGET = 368_640


def linear(scale_x: float = 1.0, scale_b: float = 1.0, wrong_w: float = 1.0, big_row: float = 0.0) -> type:
    """y = x W^T + b (+ ``big_row`` added to output column 0), its backward's x and b gradients scaled by
    ``scale_x`` and ``scale_b``, W's by ``wrong_w`` at [3, 5] and [9, 10]."""

    class Linear(torch.autograd.Function):
        @staticmethod
        def forward(ctx, x, w, b):
            ctx.save_for_backward(x, w)
            y = x @ w.t() + b
            if big_row:
                y = y + torch.zeros_like(y).index_fill_(1, torch.tensor([0]), big_row)
            return y

        @staticmethod
        def backward(ctx, g):
            x, w = ctx.saved_tensors
            gw = g.t() @ x
            gw[3, 5] *= wrong_w
            gw[9, 10] *= wrong_w
            return g @ w * scale_x, gw, g.sum(0) * scale_b

    return Linear


def arguments() -> list[torch.Tensor]:
    g = torch.Generator().manual_seed(0)
    return [torch.randn(*s, dtype=F64, generator=g).requires_grad_() for s in ((N, N), (N, N), (N,))]


@pytest.fixture(autouse=True)
def compress_small_checks_too(monkeypatch: pytest.MonkeyPatch) -> None:
    """300 columns of 144 rows are few enough to be taken whole by default: compressed here."""
    from gradcheck_cli.numerics import jacobians

    monkeypatch.setattr(jacobians, "SMALL", 0)


@pytest.fixture
def folds(monkeypatch: pytest.MonkeyPatch) -> list[tuple[int, int, int, int]]:
    """Each argument's fold (columns lo..hi, chunk size, columns of groups not accepted): that the small budget
    really takes the chunked fold, which the comparisons below are about (not what they assert)."""
    seen: list[tuple[int, int, int, int]] = []
    fold = compressed.Groups.fold

    def spied(
        self: compressed.Groups, entry: ArgumentComparison, lo: int, hi: int, probe: torch.Tensor, chunk: int
    ) -> None:
        seen.append((lo, hi, chunk, int((~self.accepted[lo:hi]).sum())))
        fold(self, entry, lo, hi, probe, chunk)

    monkeypatch.setattr(compressed.Groups, "fold", spied)
    return seen


def both(fn: type, args: list[torch.Tensor]) -> Iterator[CaseResult]:
    """The check compressed, then element by element, at the same small budget."""
    for compress in (True, False):
        yield check(fn, args, memory_bytes=BUDGET, compress=compress)


def chunked(folds: list[tuple[int, int, int, int]], made: Callable[[int, int], bool]) -> None:
    """The compressed check took the chunked fold: three arguments in chunks smaller than each, with
    columns made one by one where ``made(argument, count)`` says."""
    assert len(folds) == 3
    for i, (lo, hi, chunk, not_accepted) in enumerate(folds):
        assert chunk < hi - lo
        assert made(i, not_accepted), (i, not_accepted)


@pytest.mark.parametrize("piece", [50, compressed.PIECE], ids=["pieces of 50 entries", "whole spans"])
def test_every_accepted_column_reaches_the_rows_maps_and_ratios_as_element_by_element(piece, folds, monkeypatch):
    """x and b within tolerance but 1.0005x everywhere (passing, with the systematic factor's ratio, a sum over
    all of their columns), W wrong at two elements (failing, with its error map: each element's error and
    u^T J of both sides): a column left out of the fold, or folded twice, changes a ratio or a map."""
    monkeypatch.setattr(compressed, "PIECE", piece)
    fn = linear(scale_x=1.0005, scale_b=1.0005, wrong_w=1.1)
    got, plain = both(fn, arguments())
    chunked(folds, lambda i, made: (made > 0) == (i == 1))  # W's wrong elements' groups, made one by one
    x, w, b = got.checks[0].inputs
    assert (x.status.value, w.status.value, b.status.value) == ("pass", "fail", "pass")
    assert x.pattern is not None and x.pattern.value == "systematic" and x.ratio is not None
    assert b.pattern is not None and b.pattern.value == "systematic" and b.ratio is not None
    assert w.mismatched_indices == [[3, 5], [9, 10]] and w.worst_index in ([3, 5], [9, 10])
    assert w.error_map is not None and w.error_map.analytical is not None  # per element, as compared below
    assert report_rows(got) == report_rows(plain)


@pytest.mark.parametrize("factor", [1.0015, 0.9985])
def test_a_gradient_just_past_its_tolerance_in_a_made_chunk_fails_as_element_by_element_and_torch(factor, folds):
    """Two elements of W's gradient 0.15% off (just past rtol = 0.1%): their chunks are made column by column,
    and they fail with the element-by-element numbers, as torch.autograd.gradcheck fails them."""
    fn = linear(wrong_w=factor)
    args = arguments()
    got, plain = both(fn, args)
    chunked(folds, lambda i, made: (made > 0) == (i == 1))
    w = got.checks[0].inputs[1]
    assert (got.status.value, w.status.value, w.mismatched) == ("fail", "fail", 2)
    assert report_rows(got) == report_rows(plain)
    assert not torch.autograd.gradcheck(fn.apply, args, raise_exception=False)


def test_a_gradient_within_its_tolerance_in_made_chunks_passes_as_element_by_element_and_torch(folds):
    """Output column 0 is large (1e4): the columns reaching it (all of x, W's row 0, b[0]) are in doubt and made
    one by one, the others accepted. x's gradient 0.05% off is within rtol = 0.1%: it passes, with the
    element-by-element numbers, as torch.autograd.gradcheck passes it."""
    fn = linear(scale_x=0.9995, big_row=1e4)
    args = arguments()
    got, plain = both(fn, args)
    chunked(folds, lambda i, made: made == (N * N, N, 1)[i])
    x = got.checks[0].inputs[0]
    assert (got.status.value, x.status.value) == ("pass", "pass")
    assert report_rows(got) == report_rows(plain)
    assert torch.autograd.gradcheck(fn.apply, args, raise_exception=False)
