"""Compressed finite differences: the groups, the verdicts they must not change, the wrong gradients
that cancel in a unit move, and the forwards they save (numerics/compressed.py)."""

from __future__ import annotations

import math

import pytest
import torch

from gradcheck_cli import check
from gradcheck_cli.numerics import compressed
from gradcheck_cli.numerics.compressed import colour
from gradcheck_cli.numerics.rows import SparseRows

try:  # tests/ on sys.path (rootdir-style collection) or tests/ as a package
    from corpus import CORPUS, one_input_function, report_rows
except ImportError:  # pragma: no cover
    from tests.corpus import CORPUS, one_input_function, report_rows

F64 = torch.float64


def store(cols, rows, n_cols) -> SparseRows:
    cols, rows = torch.as_tensor(cols).reshape(-1), torch.as_tensor(rows).reshape(-1)
    return SparseRows(cols, rows, torch.ones(len(cols), dtype=F64), n_cols)


def linear_pattern(n: int) -> SparseRows:
    """The analytical pattern of y = x W^T + b (x, W: n x n, b: n), rows (i, k) = i n + k."""
    i, k = torch.arange(n * n) // n, torch.arange(n * n) // n
    out = torch.arange(n)
    x_rows = i[:, None] * n + out[None, :]  # x[i, l] reaches y[i, :]
    w_rows = out[None, :] * n + k[:, None]  # W[k, l] reaches y[:, k]
    b_rows = out[None, :] * n + out[:, None]  # b[k] reaches y[:, k]
    cols = torch.cat(
        [
            torch.arange(n * n)[:, None].expand(-1, n),
            (n * n + torch.arange(n * n))[:, None].expand(-1, n),
            (2 * n * n + out)[:, None].expand(-1, n),
        ]
    )
    return store(cols, torch.cat([x_rows, w_rows, b_rows]), 2 * n * n + n)


def valid(s: SparseRows, colours: torch.Tensor) -> bool:
    key = s.rows * (int(colours.max()) + 1) + colours[s.cols]
    return len(torch.unique(key)) == len(key)


# ---------------------------------------------------------------------------------- the groups


def test_a_linear_layer_takes_2n_plus_1_groups_the_least_possible():
    s = linear_pattern(16)
    colours, n = colour(s, 16 * 16)
    assert valid(s, colours) and n == 2 * 16 + 1  # a row of y has 2n + 1 entries: no fewer groups can do


def test_an_elementwise_pattern_is_one_group():
    s = store(torch.arange(100), torch.arange(100).flip(0), 100)
    assert colour(s, 100)[1] == 1


@pytest.mark.parametrize("seed", range(5))
def test_random_and_banded_patterns_are_coloured_validly(seed):
    g = torch.Generator().manual_seed(seed)
    cols, rows = torch.randint(0, 300, (2000,), generator=g), torch.randint(0, 200, (2000,), generator=g)
    key = torch.unique(cols * 200 + rows)
    s = store(key // 200, key % 200, 300)
    colours, n = colour(s, 200)
    degree = int(torch.bincount(s.rows).max())
    assert valid(s, colours) and degree <= n <= 3 * degree
    band = torch.arange(500)[:, None] + torch.tensor([-1, 0, 1])
    keep = (band >= 0) & (band < 500)
    s = store(torch.arange(500)[:, None].expand(-1, 3)[keep], band[keep], 500)
    colours, n = colour(s, 500)
    assert valid(s, colours) and n == 3


def test_too_many_column_patterns_are_not_coloured(monkeypatch):
    from gradcheck_cli.numerics import colouring

    monkeypatch.setattr(colouring, "PATTERNS", 10)
    s = store(torch.arange(50).repeat_interleave(2), torch.stack([torch.arange(50), torch.arange(1, 51)], 1), 50)
    assert colour(s, 51) is None
    x = torch.randn(50, dtype=F64, requires_grad=True)
    assert check(Diff, (x,), compress=True).status.value == "fail"  # column by column, still judged


# ------------------------------------------------------ wrong gradients a unit move would cancel


class Diff(torch.autograd.Function):
    """y_i = x_{i+1} - x_i with backward forgetting the gradient: a unit move of x_i and x_{i+1}
    together leaves y_i exactly where it was."""

    @staticmethod
    def forward(ctx, x):
        return x[1:] - x[:-1]

    @staticmethod
    def backward(ctx, g):
        return torch.zeros(len(g) + 1, dtype=g.dtype)


class TwoMinusNext(torch.autograd.Function):
    """y_i = 2 x_i - x_{i+1} (cyclic), backward giving 1 on the diagonal and nothing off it: a unit
    move of the diagonal group gives 2 - 1 = 1, exactly backward's value."""

    @staticmethod
    def forward(ctx, x):
        return 2 * x - x.roll(-1)

    @staticmethod
    def backward(ctx, g):
        return g.clone()


class RowSumForgotten(torch.autograd.Function):
    """y = x.sum(1), backward zero: columns with no analytical entry, all in one group, ones that
    cancel in pairs under random signs."""

    @staticmethod
    def forward(ctx, x):
        return x.sum(1)

    @staticmethod
    def backward(ctx, g):
        return torch.zeros(len(g), 2, dtype=g.dtype)


@pytest.mark.parametrize("fn, shape", [(Diff, (64,)), (TwoMinusNext, (64,)), (RowSumForgotten, (32, 2))])
def test_wrong_gradients_that_unit_moves_cancel_fail_as_without_compression(fn, shape):
    x = torch.randn(*shape, dtype=F64, generator=torch.Generator().manual_seed(0)).requires_grad_()
    got, plain = check(fn, (x,)), check(fn, (x,), compress=False)
    assert got.status.value == plain.status.value == "fail"
    assert _rows(got) == _rows(plain)


def test_the_weighted_moves_are_what_catches_two_minus_next(monkeypatch):
    """With the weights all 1 (spread and random), the second moves repeat the first and TwoMinusNext
    passes: the weights are needed."""
    x = torch.randn(64, dtype=F64, generator=torch.Generator().manual_seed(0)).requires_grad_()
    assert check(TwoMinusNext, (x,)).status.value == "fail"
    monkeypatch.setattr(compressed, "weights", lambda n, gen: torch.ones(n, dtype=F64))
    monkeypatch.setattr(compressed, "spread", lambda colours, n_groups, gen: torch.ones(len(colours), dtype=F64))
    assert check(TwoMinusNext, (x,)).status.value == "pass"  # the weakness the weights remove


# ----------------------------------------------------------------- the same verdicts and rows


_rows = report_rows  # a result as JSON, without its times


@pytest.fixture(autouse=True)
def compress_small_checks_too(monkeypatch):
    """The corpus's Jacobians are small, which the default takes whole: compressed here, so that
    every comparison below compares the compressed path."""
    from gradcheck_cli.numerics import jacobians

    monkeypatch.setattr(jacobians, "SMALL", 0)


@pytest.fixture
def used(monkeypatch):
    """Counts the checks whose numerical side was compressed."""
    count = {"n": 0}
    evaluate = compressed.Groups.evaluate

    def counted(self):
        count["n"] += 1
        return evaluate(self)

    monkeypatch.setattr(compressed.Groups, "evaluate", counted)
    return count


@pytest.mark.parametrize("case", CORPUS, ids=lambda c: c.name)
def test_the_corpus_gets_the_same_rows_with_and_without_compression(case):
    args = case.make_args(torch.Generator().manual_seed(1234))
    got = check(case.fn, args, kwargs=case.kwargs, checks=["backward", "double_backward"])
    plain = check(case.fn, args, kwargs=case.kwargs, checks=["backward", "double_backward"], compress=False)
    assert _rows(got) == _rows(plain)


def test_most_of_the_corpus_is_compressed(used):
    for case in CORPUS:
        check(case.fn, case.make_args(torch.Generator().manual_seed(1234)), kwargs=case.kwargs)
    assert used["n"] >= len(CORPUS) // 3  # else the test above compares nothing new


relu = one_input_function(torch.relu, lambda x, g: g * (x > 0), "ReLU")
relu_ge = one_input_function(torch.relu, lambda x, g: g * (x >= 0), "ReLUGe")
relu_double = one_input_function(torch.relu, lambda x, g: 2 * g * (x > 0), "ReLUDouble")
absolute = one_input_function(torch.abs, lambda x, g: g * torch.sign(x), "Abs")
clamp = one_input_function(lambda x: x.clamp(-1, 1), lambda x, g: g * ((x >= -1) & (x <= 1)), "Clamp")
maximum = one_input_function(lambda x: x.max(), lambda x, g: g * (x == x.max()), "Max")


@pytest.mark.parametrize("fn", [relu, relu_ge, relu_double, absolute, clamp, maximum], ids=lambda f: f.__name__)
@pytest.mark.parametrize("near", [0.0, 0.4e-6, 1.5e-6, 1e-3])
def test_kinks_get_the_same_rows_with_and_without_compression(fn, near, used):
    """Elements at a kink, within eps of it (a unit move crosses it), within 2 eps (only a
    weighted move crosses it) and away from it."""
    g = torch.Generator().manual_seed(3)
    x = torch.randn(8, 8, dtype=F64, generator=g)
    x[::3, ::2] = near * torch.sign(torch.randn(3, 4, generator=g, dtype=F64))
    x[1, 1] = 1 + near  # clamp's upper kink
    x = x.requires_grad_()
    before = used["n"]
    got, plain = check(fn, (x,)), check(fn, (x,), compress=False)
    assert _rows(got) == _rows(plain)
    assert fn is maximum or used["n"] > before  # elementwise: compressed


class LinearOneWrong(torch.autograd.Function):
    """y = x W^T + b with one element of W's gradient 10% off: one group fails and is made column
    by column."""

    @staticmethod
    def forward(ctx, x, w, b):
        ctx.save_for_backward(x, w)
        return x @ w.t() + b

    @staticmethod
    def backward(ctx, g):
        x, w = ctx.saved_tensors
        gw = g.t() @ x
        gw[3, 5] *= 1.1
        return g @ w, gw, g.sum(0)


def test_one_wrong_element_is_named_as_without_compression(used):
    g = torch.Generator().manual_seed(0)
    args = [torch.randn(*s, dtype=F64, generator=g).requires_grad_() for s in ((24, 24), (24, 24), (24,))]
    got, plain = check(LinearOneWrong, args), check(LinearOneWrong, args, compress=False)
    assert used["n"] == 1 and got.status.value == "fail"
    assert _rows(got) == _rows(plain)
    w = got.checks[0].inputs[1]
    assert (w.status.value, w.mismatched, w.worst_index) == ("fail", 1, [3, 5])


# ------------------------------------------------------------------------------ the work saved


class NumpyTanh(torch.autograd.Function):
    """tanh through NumPy: vmap refuses it, so every forward is a single call (counted)."""

    calls = 0

    @staticmethod
    def forward(ctx, x):
        NumpyTanh.calls += 1
        y = torch.from_numpy(__import__("numpy").tanh(x.detach().numpy()))
        ctx.save_for_backward(y)
        return y

    @staticmethod
    def backward(ctx, g):
        (y,) = ctx.saved_tensors
        return g * (1 - y * y)


def test_a_function_vmap_refuses_takes_a_handful_of_forwards_instead_of_two_per_element():
    x = torch.randn(32, 32, dtype=F64, generator=torch.Generator().manual_seed(0)).requires_grad_()
    NumpyTanh.calls = 0
    assert check(NumpyTanh, (x,))
    compressed_calls = NumpyTanh.calls
    NumpyTanh.calls = 0
    assert check(NumpyTanh, (x,), compress=False)
    assert NumpyTanh.calls >= 2 * 32 * 32 and compressed_calls < 20


# ------------------------------------------------------------------------ every shipped spec


@pytest.mark.slow
def test_every_shipped_and_broken_spec_gets_the_same_report_with_and_without_compression(invoke, monkeypatch):
    """`gradcheck specs/ broken-specs/ --format json` (in this process, so that small checks are
    compressed too): the same report, but for times and the replay command's --no-compress."""
    import json
    from pathlib import Path

    monkeypatch.chdir(Path(__file__).resolve().parents[2])

    def report(*extra: str) -> dict:
        # --no-shrink: a shrunk case is information found within a time budget, not the verdict compared here
        result = invoke("specs", "broken-specs", "--format", "json", "--no-isolate", "--no-shrink", *extra)
        assert result.exit_code == 1, result.stderr  # broken-specs fail
        # a passing row's noise aside: the groups' sums round otherwise than the columns' (AVX2 on one thread)
        out = report_rows(json.loads(result.stdout), noise=False)
        for result in out["results"]:
            result["replay"] = result["replay"].replace(" --no-compress", "")
        return out

    compressed_report, plain_report = report(), report("--no-compress")
    assert len(compressed_report["results"]) > 60
    assert compressed_report == plain_report


class NumpyTanhOneWrong(NumpyTanh):
    """NumpyTanh whose gradient is 1% off at one element (number 1234)."""

    @staticmethod
    def backward(ctx, g):
        (y,) = ctx.saved_tensors
        grad = g * (1 - y * y)
        grad.view(-1)[1234] *= 1.01
        return grad


def test_a_wrong_element_in_a_large_group_is_found_by_halving_it_with_the_same_report(used):
    """The one group of an elementwise function fails; its halves that agree are accepted and only the
    last small group is made column by column: a few hundred forwards instead of 2 per element, and
    the report element-wise checking gives."""
    x = torch.randn(64, 64, dtype=F64, generator=torch.Generator().manual_seed(0)).requires_grad_()
    NumpyTanh.calls = 0
    got = check(NumpyTanhOneWrong, (x,))
    halving_calls = NumpyTanh.calls
    NumpyTanh.calls = 0
    plain = check(NumpyTanhOneWrong, (x,), compress=False)
    assert got.status.value == plain.status.value == "fail"
    assert _rows(got) == _rows(plain)
    assert used["n"] == 1 and NumpyTanh.calls >= 2 * 4096 and halving_calls < 300


@pytest.mark.parametrize("wrong", [[5], [0, 4095], list(range(0, 4096, 7))], ids=["one", "two", "many"])
def test_halving_names_the_same_elements_as_element_by_element(wrong):
    """One, two far apart (in both halves at once) and every seventh element wrong: the same rows."""

    def some_wrong(x, g):
        grad = 2 * g * x
        grad.view(-1)[wrong] *= 1.5
        return grad

    Square = one_input_function(lambda x: x * x, some_wrong, "SquareSomeWrong")
    x = torch.randn(64, 64, dtype=F64, generator=torch.Generator().manual_seed(1)).requires_grad_()
    got, plain = check(Square, (x,)), check(Square, (x,), compress=False)
    assert got.status.value == plain.status.value == "fail"
    assert _rows(got) == _rows(plain)


# ---------------------------------------------------------------------- the rows, grouped


def _stores(fn, args, kwargs=None):
    """The analytical Jacobian's non-zero entries from grouped backward calls and from one-hot ones."""
    from gradcheck_cli.numerics import as_tuple, is_float_tensor, make_layout, vjp
    from gradcheck_cli.numerics.row_groups import RowGroups
    from gradcheck_cli.numerics.rows import Rows
    from gradcheck_cli.numerics.streams import Stream, Streams

    leaves = [a.detach().clone().requires_grad_() if isinstance(a, torch.Tensor) else a for a in args]
    outs = as_tuple(fn.apply(*leaves, *(kwargs or {}).values()))
    positions = [p for p, o in enumerate(outs) if is_float_tensor(o) and o.requires_grad]
    tensors = [t for t in leaves if isinstance(t, torch.Tensor)]
    layout = make_layout(tensors, outs, positions)

    def rows() -> Rows:
        return Rows(vjp, [outs[p] for p in positions], tensors, layout, 512 * 2**20)

    grouped = rows()
    assert RowGroups.applies(grouped)
    return RowGroups(grouped, Streams(0).generator(Stream.ROW_GROUPS), 10**7).store(), rows().sparse_rows(10**7)


def _same_store(a: SparseRows, b: SparseRows) -> bool:
    return (
        torch.equal(a.cols, b.cols)
        and torch.equal(a.rows, b.rows)
        and torch.equal(a.vals.nan_to_num(7.0), b.vals.nan_to_num(7.0))
    )


GROUPABLE = [
    c
    for c in CORPUS
    if all(
        isinstance(a, torch.Tensor) and a.dtype == F64 and a.requires_grad
        for a in c.make_args(torch.Generator().manual_seed(1234))
    )
    and not c.kwargs
]


@pytest.mark.parametrize("case", GROUPABLE, ids=lambda c: c.name)
def test_grouped_rows_are_the_one_hot_rows_entry_for_entry(case):
    grouped, one_hot = _stores(case.fn, case.make_args(torch.Generator().manual_seed(1234)))
    assert grouped is None or _same_store(grouped, one_hot)


def test_a_linear_layer_takes_a_few_grouped_backward_calls(monkeypatch):
    from gradcheck_cli.numerics.rows import Rows

    calls = []
    products = Rows.products
    monkeypatch.setattr(Rows, "products", lambda self, g: calls.append(len(g[0])) or products(self, g))
    g = torch.Generator().manual_seed(0)
    args = [torch.randn(*s, dtype=F64, generator=g).requires_grad_() for s in ((24, 24), (24, 24), (24,))]
    grouped, one_hot = _stores(LinearOneWrong, args)
    assert grouped is not None and _same_store(grouped, one_hot)
    assert sum(calls) == 3 + 3 * 24  # all at once (it overlaps), then each of 24 diagonals: 3 grad_outputs each


def test_grouped_rows_past_the_first_buffer_are_the_one_hot_rows():
    """More entries (Linear n = 40: 129,600) than the first buffer holds (65,536): grown, none lost."""
    g = torch.Generator().manual_seed(3)
    args = [torch.randn(*s, dtype=F64, generator=g).requires_grad_() for s in ((40, 40), (40, 40), (40,))]
    grouped, one_hot = _stores(LinearOneWrong, args)
    assert grouped is not None and len(grouped.vals) == 40 * 40 * 81
    assert _same_store(grouped, one_hot)


class ForgetsAnOutput(torch.autograd.Function):
    """Outputs 2x and x_0 x_1; backward forgets the last: its analytical row is empty, so the one group
    of columns (a diagonal pattern) leaves a row without an entry, where the moves are not zero."""

    @staticmethod
    def forward(ctx, x):
        return torch.cat([2 * x, (x[0] * x[1]).reshape(1)])

    @staticmethod
    def backward(ctx, g):
        return 2 * g[:-1]


def test_a_group_moving_a_row_the_analytical_pattern_leaves_empty_is_not_accepted():
    x = torch.randn(6, dtype=F64, generator=torch.Generator().manual_seed(0)).requires_grad_()
    got, plain = check(ForgetsAnOutput, (x,)), check(ForgetsAnOutput, (x,), compress=False)
    assert got.status.value == plain.status.value == "fail"
    assert _rows(got) == _rows(plain)


class AbsGrad(torch.autograd.Function):
    """A backward that is not linear in grad_output: no ratio names a row, every row is one-hot."""

    @staticmethod
    def forward(ctx, x):
        return x * 2

    @staticmethod
    def backward(ctx, g):
        return g.abs() * 2


def test_a_backward_not_linear_in_grad_output_is_taken_one_hot():
    x = torch.randn(8, 8, dtype=F64, generator=torch.Generator().manual_seed(0)).requires_grad_()
    grouped, one_hot = _stores(AbsGrad, [x])
    assert grouped is None or _same_store(grouped, one_hot)
    got, plain = check(AbsGrad, (x,)), check(AbsGrad, (x,), compress=False)
    assert _rows(got) == _rows(plain)


def test_float32_rows_are_not_grouped():
    from gradcheck_cli.numerics.row_groups import RowGroups
    from gradcheck_cli.numerics.rows import Rows

    x = torch.randn(4, dtype=torch.float32, requires_grad=True)
    assert not RowGroups.applies(Rows(None, [x * 2], [x], None, 1))


def test_a_backward_that_writes_its_grad_output_gets_the_same_rows():
    """Each batch of grouped grad_outputs is used once: a backward that scales it in place (a contract
    failure) does not scale the single calls that verify the batch."""
    from gradcheck_cli.examples.broken import ScalesGradOutputInPlace

    x = torch.randn(4, 6, dtype=F64, generator=torch.Generator().manual_seed(0)).requires_grad_()
    got, plain = check(ScalesGradOutputInPlace, (x, 2.5)), check(ScalesGradOutputInPlace, (x, 2.5), compress=False)
    assert _rows(got) == _rows(plain)
    assert got.checks[0].inputs[0].status.value == "pass"  # its values are right


@pytest.mark.parametrize("piece", [50, compressed.PIECE], ids=["pieces of 50 entries", "whole spans"])
@pytest.mark.parametrize("memory", [600_000, 512 * 2**20], ids=["chunks of a few columns", "one chunk"])
def test_accepted_spans_and_remade_chunks_fold_as_without_compression(memory, piece, monkeypatch, used):
    """Under a small budget the columns come in chunks: the chunk with the wrong element is made
    column by column, the accepted spans around it are folded as their entries alone (in pieces of
    whole chunks). tests/unit/test_compressed_fold.py holds every column of the fold to this."""
    monkeypatch.setattr(compressed, "PIECE", piece)
    g = torch.Generator().manual_seed(0)
    # 16 features: 528 columns of 16 entries; 600_000 bytes hold their 8448 entries (a budget under 32 bytes an
    # entry holds no store: the check is element by element, both sides alike) in chunks of 4 columns
    args = [torch.randn(*s, dtype=F64, generator=g).requires_grad_() for s in ((16, 16), (16, 16), (16,))]
    got = check(LinearOneWrong, args, memory_bytes=memory)
    assert used["n"] == 1  # compressed, at this budget too
    plain = check(LinearOneWrong, args, memory_bytes=memory, compress=False)
    # the chunks' widths set the matrix products' shapes, so their kernels and a passing row's noise
    assert report_rows(got, noise=False) == report_rows(plain, noise=False)
    assert got.checks[0].inputs[1].worst_index == [3, 5]


def test_a_million_element_elementwise_check_is_not_refused():
    """1000 x 1000 elementwise: element by element it was refused as too large; compressed it is a
    handful of calls."""
    x = torch.randn(1000, 1000, dtype=F64, generator=torch.Generator().manual_seed(0)).requires_grad_()
    assert check(NumpyTanh, (x,)).status.value == "pass"


# ------------------------------------------------------ user code that fails where groups go further


class SquareNonNegative(torch.autograd.Function):
    """x^2 that refuses negative inputs: elements 1.5 eps above 0 are fine for a column's own move of
    eps, not for a weighted move of up to 2 eps."""

    @staticmethod
    def forward(ctx, x):
        if bool((x < 0).any()):
            raise ValueError("negative input")
        ctx.save_for_backward(x)
        return x * x

    @staticmethod
    def backward(ctx, g):
        (x,) = ctx.saved_tensors
        return g * 2 * x


class BoundedGradOutput(torch.autograd.Function):
    """A backward that refuses grad_outputs above 1 (the contract's are in (-1, 1), one-hot ones are 1;
    the grouped rows' weights are in [1, 2))."""

    @staticmethod
    def forward(ctx, x):
        return x * 3

    @staticmethod
    def backward(ctx, g):
        if bool((g.abs() > 1).any()):
            raise ValueError("grad_output above 1")
        return g * 3


@pytest.mark.parametrize("fn", [SquareNonNegative], ids=lambda f: f.__name__)
def test_a_call_that_fails_only_for_a_group_leaves_the_verdict_to_element_by_element(fn):
    x = torch.rand(16, dtype=F64, generator=torch.Generator().manual_seed(0)).add_(0.5)
    x[::2] = 1.5e-6
    x.requires_grad_()
    got, plain = check(fn, (x,)), check(fn, (x,), compress=False)
    assert plain.status.value == "pass", plain
    assert _rows(got) == _rows(plain)


@pytest.mark.parametrize("compress", [True, False])
def test_a_backward_that_refuses_large_grad_outputs_is_the_same_error_compressed_or_not(compress):
    # autograd passes any grad_output (a loss scaled by 100): the default check's linearity step gives
    # backward a one-hot grad_output of the dense one's size, so the refusal is found on both paths alike
    x = torch.rand(16, dtype=F64, generator=torch.Generator().manual_seed(0)).add_(0.5).requires_grad_()
    got = check(BoundedGradOutput, (x,), compress=compress)
    # a backward that raises on a valid input is a fail of kind backward (issue 44 item 7), alike on both paths
    assert got.status.value == "fail" and got.error is None, got
    assert "grad_output above 1" in got.checks[0].message and "backward raised" in got.checks[0].message, got


def test_deferred_column_errors_and_projections_equal_the_eager_ones_and_wait_to_be_read() -> None:
    """Entries folded with ``extras=False`` and their ``add_extras`` deferred: nothing computed until
    ``err``/``proj_a``/``proj_n`` are read, then exactly what an eager fold makes of them (an
    infinite and a NaN entry among them: their columns' error is inf)."""
    from gradcheck_cli.numerics.stats import ArgumentComparison

    g = torch.Generator().manual_seed(3)
    n_cols, n_rows = 6, 5
    c = torch.arange(n_cols).repeat_interleave(torch.tensor([2, 0, 3, 1, 4, 2]))
    r = torch.cat([torch.randperm(n_rows, generator=g)[:k].sort().values for k in (2, 0, 3, 1, 4, 2)])
    av, nv = torch.randn(len(c), dtype=F64, generator=g), torch.randn(len(c), dtype=F64, generator=g)
    nv[3], av[7] = float("inf"), float("nan")
    probe = torch.randn(n_rows, dtype=F64, generator=g)
    eager, lazy = (ArgumentComparison(n_cols + 2, 1e-5, 1e-3) for _ in range(2))
    eager.update_entries(c, r, av, nv.clone(), (n_cols, n_rows), 2, probe)
    lazy.update_entries(c, r, av, nv.clone(), (n_cols, n_rows), 2, probe, extras=False)
    assert not bool(lazy._err.any()) and not bool(lazy._proj_a.any())  # not computed at the fold
    lazy.defer(lambda entry: entry.add_extras(c, r, av, nv.clone(), n_cols, 2, probe))
    assert torch.equal(lazy.err, eager.err)
    for side in ("proj_a", "proj_n"):  # a NaN entry makes its column's projection NaN on both
        assert torch.equal(getattr(lazy, side).nan_to_num(7.0), getattr(eager, side).nan_to_num(7.0))
    assert math.isinf(float(lazy.err[2 + 2])) and math.isinf(float(lazy.err[2 + 4]))  # entries 3 and 7
    assert (lazy.max_abs, lazy.nonfinite, bool(lazy.bad.any())) == (eager.max_abs, eager.nonfinite, True)


def test_a_passing_compressed_check_never_computes_the_deferred_extras(monkeypatch: pytest.MonkeyPatch) -> None:
    """The probe's projections and the per-column errors serve a failing argument's maps, its
    diagnosis and --strict: a passing check's accepted groups never compute them (that a failing
    one's reports are the same as element by element, maps included, the comparisons above show)."""
    from gradcheck_cli.examples.linear import LinearFunction
    from gradcheck_cli.numerics.stats import ArgumentComparison

    calls: list[int] = []
    original = ArgumentComparison.add_extras
    monkeypatch.setattr(ArgumentComparison, "add_extras", lambda self, *a: calls.append(1) or original(self, *a))
    g = torch.Generator().manual_seed(0)
    args = [torch.randn(*s, dtype=F64, generator=g).requires_grad_() for s in ((24, 24), (24, 24), (24,))]
    assert check(LinearFunction, args).status.value == "pass"
    assert calls == []


def test_a_checks_groups_and_store_are_freed_when_it_ends_without_the_garbage_collector(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The deferred extras hold the groups (and through them the store: tens of MB), not the entry
    that holds them: no reference cycle keeps them alive after the check, with the collector off."""
    import gc
    import weakref

    from gradcheck_cli.examples.linear import LinearFunction
    from gradcheck_cli.numerics.compressed import Groups

    made: list[weakref.ref] = []
    original = Groups.__init__

    def init(self, *a, **k):  # type: ignore[no-untyped-def]
        original(self, *a, **k)
        made.append(weakref.ref(self))

    monkeypatch.setattr(Groups, "__init__", init)
    g = torch.Generator().manual_seed(0)
    args = [torch.randn(*s, dtype=F64, generator=g).requires_grad_() for s in ((24, 24), (24, 24), (24,))]
    gc.collect()
    gc.disable()
    try:
        assert check(LinearFunction, args).status.value == "pass"
        assert made and all(ref() is None for ref in made)
    finally:
        gc.enable()


def _forgets(coupling: float, every_row: bool) -> type:
    """y = x + coupling * (next element of x), in every output element or only in the first; backward
    forgets the coupling (returns g): the analytical pattern is the diagonal, so every column is in one
    group, whose rows carry 1 + coupling beside the entry 1, within the entry's rtol."""

    class ForgetsCoupling(torch.autograd.Function):
        @staticmethod
        def forward(ctx, x):
            if every_row:
                return x + coupling * x.roll(-1)
            y = x.clone()
            y[0] = y[0] + coupling * x[1]
            return y

        @staticmethod
        def backward(ctx, g):
            return g.clone()

    return ForgetsCoupling


@pytest.mark.parametrize("every_row", [True, False], ids=["every-row", "one-element"])
@pytest.mark.parametrize("coupling", [3e-4, 1e-4, 5e-5])
@pytest.mark.parametrize("seed", range(3))
def test_a_small_gradient_left_out_beside_an_entry_fails_as_without_compression(every_row, coupling, seed, used):
    """The forgotten gradient is 5-30x atol, so element by element fails it, but under rtol of the entry beside
    it: the group's rows agree with the analytical side within the element-wise tolerance in both moves, and
    only the two moves' difference (over the element's weight) shows it."""
    fn = _forgets(coupling, every_row)
    x = torch.randn(1000, dtype=F64, generator=torch.Generator().manual_seed(seed)).requires_grad_()
    before = used["n"]
    got, plain = check(fn, (x,), seed=seed), check(fn, (x,), seed=seed, compress=False)
    assert plain.status.value == "fail"
    assert _rows(got) == _rows(plain)
    assert used["n"] > before  # the compressed path judged it


sine50 = one_input_function(lambda x: torch.sin(50 * x), lambda x, g: g * 50 * torch.cos(50 * x), "Sine50")
log_near_0 = one_input_function(torch.log, lambda x, g: g / x, "LogNear0")


@pytest.mark.parametrize("fn", [sine50, log_near_0], ids=lambda f: f.__name__)
def test_a_large_third_derivative_stays_compressed_with_the_same_report(fn, used):
    """The unit and weighted moves differ by the finite differences' third-order term (sin 50x: third
    derivative 125,000; log at 0.001: 2e9), far past their rounding: a third move shows the three quotients
    on one line in the step's square, and the groups are accepted."""
    g = torch.Generator().manual_seed(0)
    x = (
        torch.randn(40, 40, dtype=F64, generator=g)
        if fn is sine50
        else 0.001 + torch.rand(40, 40, dtype=F64, generator=g)
    )
    evaluated = []
    evaluate = compressed.Groups.evaluate
    # the groups' verdicts (their curved weightings' too, which every stage's groups take at once after the last
    # stage): all accepted at once, none halved
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(compressed.Groups, "evaluate", lambda self: evaluate(self) or evaluated.append(self.ok.clone()))
        got = check(fn, (x.requires_grad_(),))
    assert used["n"] == 1
    if fn is log_near_0:  # sin(50 x): its argument's rounding is near the rows' limit (NOISE 5 ulps of the
        assert len(evaluated) == 1 and bool(evaluated[0].all())  # output): some of its groups are halved
    assert _rows(got) == _rows(check(fn, (x,), compress=False))


class CurvedAndForgetful(torch.autograd.Function):
    """sin(50 x) + 3e-4 x.roll(-1), backward forgetting the coupling: curved and wrong."""

    @staticmethod
    def forward(ctx, x):
        ctx.save_for_backward(x)
        return torch.sin(50 * x) + 3e-4 * x.roll(-1)

    @staticmethod
    def backward(ctx, g):
        (x,) = ctx.saved_tensors
        return g * 50 * torch.cos(50 * x)


@pytest.mark.parametrize("seed", range(3))
def test_a_gradient_left_out_of_a_curved_function_is_not_taken_for_curvature(seed, used):
    x = torch.randn(1000, dtype=F64, generator=torch.Generator().manual_seed(seed)).requires_grad_()
    got, plain = check(CurvedAndForgetful, (x,), seed=seed), check(CurvedAndForgetful, (x,), seed=seed, compress=False)
    assert plain.status.value == "fail" and used["n"] == 1
    assert _rows(got) == _rows(plain)
