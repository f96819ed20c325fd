"""--max-memory bounds the check's buffers, and a check too large to finish is refused up front
(issue 14, item 13)."""

from __future__ import annotations

from typing import Any

import pytest
import torch

from gradcheck_cli import check
from gradcheck_cli.results import ErrorKind, Status

try:  # tests/ on sys.path (rootdir-style collection) or tests/ as a package
    from corpus import CORPUS
except ImportError:  # pragma: no cover
    from tests.corpus import CORPUS

DT = torch.float64


class Softplus(torch.autograd.Function):
    """Elementwise: a diagonal Jacobian, one non-zero entry per row and column."""

    @staticmethod
    def forward(ctx: Any, x: torch.Tensor) -> torch.Tensor:
        ctx.save_for_backward(x)
        return torch.nn.functional.softplus(x)

    @staticmethod
    def backward(ctx: Any, g: torch.Tensor) -> torch.Tensor:
        (x,) = ctx.saved_tensors
        return g * torch.sigmoid(x)


class RowSum(torch.autograd.Function):
    """``x * x.sum(1, keepdim=True)``: a dense block per row, so its rows are held dense."""

    @staticmethod
    def forward(ctx: Any, x: torch.Tensor) -> torch.Tensor:
        ctx.save_for_backward(x)
        return x * x.sum(1, keepdim=True)

    @staticmethod
    def backward(ctx: Any, g: torch.Tensor) -> torch.Tensor:
        (x,) = ctx.saved_tensors
        return g * x.sum(1, keepdim=True) + (g * x).sum(1, keepdim=True)


def x(*shape: int, seed: int = 0) -> torch.Tensor:
    return torch.randn(*shape, dtype=DT, generator=torch.Generator().manual_seed(seed)).requires_grad_()


def batches(monkeypatch: pytest.MonkeyPatch) -> list[int]:
    """Records the bytes of the batched arguments of every torch.func.vmap call (one-hot
    grad_outputs of a stage of rows, perturbed arguments of a stage of columns or probes)."""
    sizes: list[int] = []
    vmap = torch.func.vmap

    def recording(fn: Any, *a: Any, **k: Any) -> Any:
        inner = vmap(fn, *a, **k)

        def call(*args: Any) -> Any:
            sizes.append(sum(t.numel() * t.element_size() for t in args if isinstance(t, torch.Tensor)))
            return inner(*args)

        return call

    monkeypatch.setattr(torch.func, "vmap", recording)
    return sizes


@pytest.mark.parametrize("fast, memory", [(False, 8 * 2**20), (True, 2**20)], ids=["elementwise", "--fast"])
def test_every_batch_stays_within_its_share_of_max_memory(
    monkeypatch: pytest.MonkeyPatch, fast: bool, memory: int
) -> None:
    """64 x 64 elementwise under a budget of a few MB: a stage of rows (one-hot grad_outputs, 32 kB
    each), of columns or of probes holds at most an eighth of it. Before, a stage of rows was 256
    rows (8 MB) whatever the limit: a 1000 x 1000 input took 6.4 GB under --max-memory 64."""
    sizes = batches(monkeypatch)
    result = check(Softplus, [x(64, 64)], memory_bytes=memory, probes=3 if fast else 0)
    assert result.status is Status.PASS, result.checks[0].message
    assert sizes or fast, "nothing was batched"  # --fast's probes (393 kB at once) are single calls here
    assert max(sizes, default=0) <= memory // 8, sizes


def test_batches_still_fill_a_large_budget(monkeypatch: pytest.MonkeyPatch) -> None:
    """The budget bounds the stages, it does not shrink them where they fit: 256 rows a stage (one-hot
    rows: without compression, which takes this elementwise function in one group)."""
    sizes = batches(monkeypatch)
    check(Softplus, [x(64, 64)], memory_bytes=512 * 2**20, compress=False)
    assert sizes.count(256 * 64 * 64 * 8) == 4096 // 256, sizes


def test_too_large_is_refused_up_front_with_the_size_and_what_to_do(monkeypatch: pytest.MonkeyPatch) -> None:
    """The limit is lowered so that a 40 x 40 input stands for a 1000 x 1000 one (hours of calls):
    an error before any backward or perturbed forward, naming the shapes and --fast."""
    from gradcheck_cli.checks.parts import base

    monkeypatch.setattr(base, "WORK_LIMIT", 10**6)
    calls = []
    backward = Softplus.backward
    monkeypatch.setattr(Softplus, "backward", staticmethod(lambda ctx, g: calls.append(1) or backward(ctx, g)))
    result = check(Softplus, [x(40, 40)], memory_bytes=64 * 2**20, compress=False)
    assert result.status is Status.ERROR and result.error is not None
    assert result.error.kind is ErrorKind.TOO_LARGE
    message = result.error.message
    assert "'x' [40, 40]" in message and "4,800 calls" in message and "--fast" in message, message
    # backward's contract (its repeated calls), its linearity (2) and undefined gradients (2): no row of the Jacobian
    assert len(calls) <= 3 + 1 + 2 + 2
    fast = check(Softplus, [x(40, 40)], memory_bytes=64 * 2**20, probes=3)  # random probes: no such work
    assert fast.status is Status.PASS, fast.error


def test_compressed_work_is_budgeted_as_it_is(monkeypatch: pytest.MonkeyPatch) -> None:
    """Compressed, the same 40 x 40 elementwise check is a few calls: it runs (a 1000 x 1000 one takes
    seconds); a wrong one, whose groups disagree and would be made column by column, is refused
    once that is known, with the calls it would take."""
    from gradcheck_cli.checks.parts import base

    monkeypatch.setattr(base, "WORK_LIMIT", 10**6)
    assert check(Softplus, [x(40, 40)], memory_bytes=64 * 2**20).status is Status.PASS
    wrong = check(SoftplusTwiceOnPositives, [x(40, 40)], memory_bytes=64 * 2**20)
    assert wrong.error is not None and wrong.error.kind is ErrorKind.TOO_LARGE, wrong
    assert "'x' [40, 40]" in wrong.error.message and "--fast" in wrong.error.message


def test_rows_recomputed_per_block_count_against_the_limit(monkeypatch: pytest.MonkeyPatch) -> None:
    """Dense rows that do not fit in the budget are recomputed for every block of columns: that
    work is counted too, and the message says a larger --max-memory helps."""
    from gradcheck_cli.checks.parts import base

    monkeypatch.setattr(base, "WORK_LIMIT", 10**7)
    big = check(RowSum, [x(24, 24)], memory_bytes=64 * 2**20)  # dense rows fit: one pass
    assert big.status is Status.PASS, big.error
    small = check(RowSum, [x(24, 24)], memory_bytes=64 * 1024)  # 10 columns of rows at a time: 58 passes
    assert small.error is not None and small.error.kind is ErrorKind.TOO_LARGE
    assert "--max-memory" in small.error.message and "58 blocks" in small.error.message, small.error.message


def _rows(result: Any) -> list[tuple]:
    return [
        (
            c.check,
            c.status,
            r.name,
            r.status,
            r.mismatched,
            r.worst_index,
            r.pattern,
            round(r.max_abs_err, 6) if r.max_abs_err is not None else None,
        )
        for c in result.checks
        for r in c.inputs
    ]


@pytest.mark.parametrize(
    "case",
    [
        c
        for c in CORPUS
        if c.name in {"ok_linear_three_inputs", "ok_softmax", "ok_bmm", "ok_two_float_outputs", "ok_int64_output_first"}
    ]
    + [c for c in CORPUS if not c.correct][:6],
    ids=lambda c: c.name,
)
def test_verdicts_do_not_depend_on_max_memory(case: Any) -> None:
    """The same rows, to the numbers, under a 1 kB budget (a column at a time, rows recomputed
    per column, one-row stages) as under the default."""

    def run(memory: int) -> list[tuple]:
        args = case.make_args(torch.Generator().manual_seed(1234))
        return _rows(check(case.fn, list(args), kwargs=case.kwargs, memory_bytes=memory))

    assert run(1024) == run(512 * 2**20)


class SoftplusTwiceOnPositives(Softplus):
    """backward twice too large where x > 0: about half the elements mismatch."""

    @staticmethod
    def backward(ctx: Any, g: torch.Tensor) -> torch.Tensor:
        (x,) = ctx.saved_tensors
        return g * torch.sigmoid(x) * (1 + (x > 0))


def test_mismatching_columns_kept_for_a_second_look_are_held_as_their_non_zero_entries() -> None:
    """An elementwise Jacobian's columns have one non-zero entry: the 16 kept columns of a
    100 x 100 input take 16 x 24 bytes, not 16 x 160 kB, and read back whole."""
    from gradcheck_cli.numerics.stats import KEEP_BAD, ArgumentComparison

    n = 100 * 100
    a = torch.zeros(KEEP_BAD, n, dtype=DT)
    num = torch.zeros(KEEP_BAD, n, dtype=DT)
    a[range(KEEP_BAD), range(KEEP_BAD)] = 2.0
    num[range(KEEP_BAD), range(KEEP_BAD)] = 1.0
    entry = ArgumentComparison(KEEP_BAD, 1e-5, 1e-3, keep_bytes=2**20)
    entry.update(a, num, 0, torch.ones(n, dtype=DT))
    assert len(entry.bad_columns) == KEEP_BAD and entry.bad_columns.nbytes == KEEP_BAD * 24
    col, a_col, n_col = entry.bad_columns[3]
    assert col == 3 and torch.equal(a_col, a[3]) and torch.equal(n_col, num[3])
    dense = ArgumentComparison(
        KEEP_BAD, 1e-5, 1e-3, keep_bytes=3 * 16 * n
    )  # dense columns: as many as fit, at least one
    dense.update(a + 1e-3, num, 0, torch.ones(n, dtype=DT))
    assert len(dense.bad_columns) == 3


def test_a_wrong_elementwise_gradient_is_named_the_same_under_a_small_budget() -> None:
    """8 kB: no room for the non-zero entries, rows recomputed for blocks of 5 columns, mismatching
    columns kept sparse: the same diagnosis as under the default budget."""
    small, large = (check(SoftplusTwiceOnPositives, [x(12, 12)], memory_bytes=m) for m in (8192, 512 * 2**20))
    assert small.status is large.status is Status.FAIL
    assert _rows(small) == _rows(large)
    assert small.checks[0].inputs[0].diagnosis == large.checks[0].inputs[0].diagnosis


def test_the_gpu_estimate_counts_the_batches_the_check_puts_on_the_device(monkeypatch: pytest.MonkeyPatch) -> None:
    """A batch of calls lives on the device (up to an eighth of --max-memory, 64 MB by default):
    with a few MB free beyond six times the arguments and outputs, the default budget is refused up
    front, a 4 MB one fits."""
    from gradcheck_cli.checks.parts.base import CheckContext, Options, refuse_if_too_big
    from gradcheck_cli.sandbox.errors import UserCodeError
    from gradcheck_cli.subject.binding import bind
    from gradcheck_cli.subject.devices import MEMORY_FACTOR
    from gradcheck_cli.subject.target import Target

    arg, out = x(64, 64), torch.zeros(64, 64, dtype=DT)
    free = MEMORY_FACTOR * 2 * 64 * 64 * 8 + 2**20
    monkeypatch.setattr(torch.cuda, "mem_get_info", lambda device=None: (free, 10**12))
    bound = bind(Target("Softplus", Softplus, True), [(None, arg)], [])

    def refused(memory: int) -> bool:
        try:
            refuse_if_too_big(
                CheckContext(Target("Softplus", Softplus, True), bound, "cuda:0", Options(memory_bytes=memory)), (out,)
            )
        except UserCodeError as exc:
            assert exc.kind is ErrorKind.OUT_OF_MEMORY
            return True
        return False

    assert refused(512 * 2**20) and not refused(4 * 2**20)
