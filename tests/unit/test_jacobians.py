"""Batched rows and columns of the Jacobians (``gradcheck_cli.jacobians``): the numbers single
calls give, and single calls whenever batching cannot be done (forward's body does not vmap) or
does not give those numbers."""

from __future__ import annotations

import math
from typing import Any, Callable, Optional

import pytest
import torch
from torch.autograd import Function

from gradcheck_cli import check
from gradcheck_cli.examples.linear import LinearFunction
from gradcheck_cli.numerics import engine
from gradcheck_cli.numerics.batching import COL_STAGE
from gradcheck_cli.numerics.jacobian_layout import make_layout
from gradcheck_cli.numerics.jacobians import Jacobians
from gradcheck_cli.numerics.realify import as_tuple, vjp
from gradcheck_cli.subject.binding import bind
from gradcheck_cli.subject.target import Target

try:  # tests/ on sys.path (rootdir-style collection) or tests/ as a package
    from corpus import determined
except ImportError:  # pragma: no cover
    from tests.corpus import determined

try:  # tests/ on sys.path (rootdir-style collection) or tests/ as a package
    from corpus import report_rows
except ImportError:  # pragma: no cover
    from tests.corpus import report_rows

DT = torch.float64


class SetupContextScale(Function):
    """``3 x + y``, new style (``setup_context``) but without ``generate_vmap_rule``."""

    @staticmethod
    def forward(x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
        return 3 * x + y

    @staticmethod
    def setup_context(ctx: Any, inputs: tuple, output: torch.Tensor) -> None:
        pass

    @staticmethod
    def backward(ctx: Any, g: torch.Tensor) -> tuple:
        return 3 * g, g


class ItemScale(Function):
    """``x * max(x)`` through ``.item()``: forward's body cannot be vmapped."""

    @staticmethod
    def forward(ctx: Any, x: torch.Tensor) -> torch.Tensor:
        return x * x.max().item()

    @staticmethod
    def backward(ctx: Any, g: torch.Tensor) -> torch.Tensor:
        raise NotImplementedError


class NumpySin(Function):
    @staticmethod
    def forward(ctx: Any, x: torch.Tensor) -> torch.Tensor:
        return torch.from_numpy(x.numpy().copy()).sin()

    @staticmethod
    def backward(ctx: Any, g: torch.Tensor) -> torch.Tensor:
        raise NotImplementedError


class InPlaceDouble(Function):
    """Marks its input dirty: only ``apply`` knows what that means."""

    @staticmethod
    def forward(ctx: Any, x: torch.Tensor) -> torch.Tensor:
        ctx.mark_dirty(x)
        return x.mul_(2)

    @staticmethod
    def backward(ctx: Any, g: torch.Tensor) -> torch.Tensor:
        return 2 * g


class BranchOnValue(Function):
    """A Python branch on a tensor's value: vmap refuses it."""

    @staticmethod
    def forward(ctx: Any, x: torch.Tensor) -> torch.Tensor:
        return x.sin() if x.sum() > 0 else x.cos()

    @staticmethod
    def backward(ctx: Any, g: torch.Tensor) -> torch.Tensor:
        raise NotImplementedError


def jacobians(fn: type, args: list[torch.Tensor], batched: Optional[Callable]) -> Jacobians:
    leaves = [a.clone().requires_grad_() for a in args]
    outputs = as_tuple(fn.apply(*[t.clone() for t in leaves]))  # not leaves: a Function may work in place
    plain = [a.clone() for a in args]
    layout = make_layout(plain, outputs, [0])
    return Jacobians(lambda values: fn.apply(*values), vjp, [outputs[0]], leaves, plain, layout, 1e-6, batched, 1 << 28)


def columns(fn: type, args: list[torch.Tensor], batched: Optional[Callable]) -> tuple[torch.Tensor, Jacobians]:
    jac = jacobians(fn, args, batched)
    return jac.columns(0, jac.layout.n_cols), jac


def body(fn: type) -> Callable:
    return Target(fn.__qualname__, fn, True).body


def randn(*shape: int, seed: int = 0) -> torch.Tensor:
    return torch.randn(*shape, dtype=DT, generator=torch.Generator().manual_seed(seed))


@pytest.mark.parametrize(
    "fn, args",
    [
        (LinearFunction, [randn(5, 4), randn(3, 4, seed=1), randn(3, seed=2)]),
        (SetupContextScale, [randn(3, 4), randn(3, 4, seed=1)]),
        (LinearFunction, [randn(40, 9), randn(9, 9, seed=1), randn(9, seed=2)]),  # x: 360 > COL_STAGE columns
    ],
    ids=["old-style", "setup_context", "stages"],
)
def test_forward_bodies_are_batched_and_give_the_single_calls_numbers(fn: type, args: list) -> None:
    single, _ = columns(fn, args, None)
    batched, jac = columns(fn, args, body(fn))
    assert jac.batched_cols is True
    torch.testing.assert_close(batched, single, rtol=1e-7, atol=1e-9)


@pytest.mark.parametrize("fn", [ItemScale, NumpySin, InPlaceDouble, BranchOnValue])
def test_bodies_that_do_not_vmap_fall_back_to_single_calls(fn: type) -> None:
    x = randn(3, 4)
    single, _ = columns(fn, [x], None)
    batched, jac = columns(fn, [x], body(fn))
    assert jac.batched_cols is False
    torch.testing.assert_close(batched, single, rtol=0, atol=0)


class ScaleWithRule(Function):
    """``3 x + y`` with a generated vmap rule, and a ``setup_context`` that reads a value (vmap refuses it)."""

    generate_vmap_rule = True
    forwards = 0

    @staticmethod
    def forward(x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
        ScaleWithRule.forwards += 1
        return 3 * x + y

    @staticmethod
    def setup_context(ctx: Any, inputs: tuple, output: torch.Tensor) -> None:
        ctx.total = float(inputs[0].sum())

    @staticmethod
    def backward(ctx: Any, g: torch.Tensor) -> tuple:
        return 3 * g, g


@pytest.mark.parametrize("probes", [0, 3])
def test_a_generated_vmap_rule_batches_forward_itself(probes: int) -> None:
    """A generated vmap rule is forward run under vmap: forward is batched directly, without
    ``apply`` (whose vmap runs setup_context too, and costs more than a small forward)."""
    args = [randn(4, 5).requires_grad_(), randn(4, 5, seed=1).requires_grad_()]
    ScaleWithRule.forwards = 0
    assert check(ScaleWithRule, args, probes=probes).status.value == "pass"
    assert ScaleWithRule.forwards < 10  # single calls: 2 per column (80), 2 per probe (12)


def test_a_batched_forward_with_other_numbers_is_not_used() -> None:
    """The first stage is compared with single calls: a batched forward that differs is dropped."""
    args = [randn(5, 4), randn(3, 4, seed=1), randn(3, seed=2)]
    single, _ = columns(LinearFunction, args, None)
    off = lambda values: 1.001 * body(LinearFunction)(values)  # noqa: E731
    batched, jac = columns(LinearFunction, args, off)
    assert jac.batched_cols is False
    torch.testing.assert_close(batched, single, rtol=0, atol=0)


def test_batched_columns_leave_the_inputs_as_they_were() -> None:
    args = [randn(5, 4), randn(3, 4, seed=1), randn(3, seed=2)]
    jac = jacobians(LinearFunction, args, body(LinearFunction))
    before = [v.clone() for v in jac.values]
    jac.columns(0, jac.layout.n_cols)
    for v, b in zip(jac.values, before):
        assert torch.equal(v, b)


def _spy_on_grad(monkeypatch: pytest.MonkeyPatch) -> list[bool]:
    """is_grads_batched of every backward call (numerics.engine.grad, torch.autograd.grad's stand-in) from now on."""
    calls: list[bool] = []
    grad = engine.grad
    monkeypatch.setattr(engine, "grad", lambda *a, **k: calls.append(k.get("is_grads_batched", False)) or grad(*a, **k))
    return calls


def _single_rows(args: list[torch.Tensor]) -> torch.Tensor:
    jac = jacobians(LinearFunction, args, None)
    jac.batched_rows = False
    return jac.rows(0, jac.layout.n_cols)


def test_batched_rows_give_the_single_calls_numbers(monkeypatch: pytest.MonkeyPatch) -> None:
    """Backward is vmapped through autograd's engine with torch.func.vmap (is_grads_batched's older
    vmap took twice as long on a Linear layer's backward)."""
    args = [randn(5, 4), randn(3, 4, seed=1), randn(3, seed=2)]
    calls = _spy_on_grad(monkeypatch)
    batched_jac = jacobians(LinearFunction, args, None)
    batched = batched_jac.rows(0, batched_jac.layout.n_cols)
    assert batched_jac.batched_rows is True and calls and not any(calls)
    torch.testing.assert_close(batched, _single_rows(args), rtol=1e-12, atol=0)


class PassThrough(Function):
    """``x`` as it is; backward returns grad_output itself, so the batched rows are views of it."""

    @staticmethod
    def forward(ctx: Any, x: torch.Tensor) -> torch.Tensor:
        return x.clone()

    @staticmethod
    def backward(ctx: Any, g: torch.Tensor) -> torch.Tensor:
        return g


@pytest.mark.parametrize("store", [False, True], ids=["dense rows", "sparse store"])
def test_batched_rows_that_are_views_of_the_grad_outputs_survive_the_next_stage(store: bool) -> None:
    """The one-hot grad_outputs are reused from stage to stage: a stage's rows are read before the
    next stage resets them."""
    from gradcheck_cli.numerics.batching import ROW_STAGE

    n = 2 * ROW_STAGE + 10  # three stages
    jac = jacobians(PassThrough, [randn(n)], None)
    if store:
        c, r, v = jac.sparse_rows(n).entries(0, n)
        rows = torch.zeros(n, n, dtype=DT).index_put_((c, r), v)
    else:
        rows = jac.rows(0, n)
    assert jac.batched_rows is True
    torch.testing.assert_close(rows, torch.eye(n, dtype=DT), rtol=0, atol=0)


class SoftmaxInPlace(Function):
    """softmax, right, but backward works on grad_output in place (a contract failure, not fatal)."""

    @staticmethod
    def forward(ctx: Any, x: torch.Tensor) -> torch.Tensor:
        y = torch.softmax(x, 0)
        ctx.save_for_backward(y)
        return y

    @staticmethod
    def backward(ctx: Any, g: torch.Tensor) -> torch.Tensor:
        (y,) = ctx.saved_tensors
        return g.sub_((g * y).sum()).mul_(y)


@pytest.mark.parametrize("batched", [True, False], ids=["batched rows", "single rows"])
def test_a_backward_that_writes_grad_output_gets_one_hot_rows_every_stage(
    batched: bool, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The reused grad_outputs are zeroed in full per stage (per row): its writes do not reach the
    next one, and its gradient, right, is not reported wrong besides the contract failure."""
    from gradcheck_cli.numerics.batching import ROW_STAGE

    if not batched:
        monkeypatch.setattr(Jacobians, "_batched_rows", None)  # vmap "refuses": single rows
    result = check(SoftmaxInPlace, [randn(ROW_STAGE + 44).requires_grad_()]).checks[0]
    assert result.status.value == "fail" and "modified grad_output in place" in result.message
    assert (result.inputs[0].status.value, result.inputs[0].mismatched) == ("pass", 0), result.message


def test_batched_rows_fall_back_to_single_calls_where_vmap_refuses(monkeypatch: pytest.MonkeyPatch) -> None:
    args = [randn(5, 4), randn(3, 4, seed=1), randn(3, seed=2)]
    single = _single_rows(args)

    def refuse(fn: Callable) -> Callable:
        def refused(*args: Any) -> None:
            raise RuntimeError("vmap: not supported")

        return refused

    monkeypatch.setattr(torch.func, "vmap", refuse)
    jac = jacobians(LinearFunction, args, None)
    rows = jac.rows(0, jac.layout.n_cols)
    assert jac.batched_rows is False
    torch.testing.assert_close(rows, single, rtol=0, atol=0)


class WrongWeightGrad(LinearFunction):
    @staticmethod
    def backward(ctx: Any, g: torch.Tensor) -> tuple:
        gx, gw, gb = LinearFunction.backward(ctx, g)
        return gx, gw.t(), gb  # BUG: transposed


def test_a_batched_check_gives_the_single_checks_verdict(monkeypatch: pytest.MonkeyPatch) -> None:
    """The whole backward check, forward's body batched or not: same rows, same numbers."""
    args = [randn(6, 6), randn(6, 6, seed=1), randn(6, seed=2)]
    batched = check(WrongWeightGrad, [a.clone().requires_grad_() for a in args])
    monkeypatch.setattr(Target, "body", None)  # no body to batch: one forward per column
    single = check(WrongWeightGrad, [a.clone().requires_grad_() for a in args])
    assert batched.status.value == single.status.value == "fail"
    assert [determined(i) for i in batched.checks[0].inputs] == [determined(i) for i in single.checks[0].inputs]
    for b, s in zip(batched.checks[0].inputs, single.checks[0].inputs):
        assert b.max_abs_err == pytest.approx(s.max_abs_err, rel=1e-6, abs=1e-9)


def test_keeping_freed_memory_is_harmless_where_there_is_no_glibc(monkeypatch: pytest.MonkeyPatch) -> None:
    from gradcheck_cli.run import pool

    def no_glibc(name: str) -> None:
        raise OSError(f"{name}: cannot open shared object file")

    pool.keep_freed_memory()  # glibc here: the allocator keeps freed memory
    monkeypatch.setattr(pool.ctypes, "CDLL", no_glibc)
    pool.keep_freed_memory()  # elsewhere: nothing changes, nothing raises
    args = [randn(4, 3), randn(2, 3, seed=1), randn(2, seed=2)]
    assert check(LinearFunction, [a.requires_grad_() for a in args]).status.value == "pass"


def _backward(fn: type, args: list[torch.Tensor], memory_bytes: int, compress: bool = False) -> Any:
    """The backward check of ``fn`` at ``args``, by default without compression (the store and the
    dense rows are what these tests compare)."""
    from gradcheck_cli.checks import backward
    from gradcheck_cli.checks.parts.base import CheckContext, Options
    from gradcheck_cli.spec import Tolerance

    target = Target(fn.__qualname__, fn, True)
    bound = bind(target, [(None, a.clone().requires_grad_()) for a in args], [])
    return backward.run(CheckContext(target, bound, options=Options(Tolerance(), memory_bytes, compress=compress)))


class TimesRowSum(Function):
    """``x * x.sum(1)``: every output depends on every input of its row."""

    @staticmethod
    def forward(ctx: Any, x: torch.Tensor) -> torch.Tensor:
        ctx.save_for_backward(x)
        return x * x.sum(1, keepdim=True)

    @staticmethod
    def backward(ctx: Any, g: torch.Tensor) -> torch.Tensor:
        (x,) = ctx.saved_tensors
        return g * x.sum(1, keepdim=True) + (g * x).sum(1, keepdim=True)


def test_a_dense_jacobian_gives_up_the_sparse_store_after_its_first_rows(monkeypatch: pytest.MonkeyPatch) -> None:
    """x: 2 x 800, half the 1600 x 1600 entries non-zero, more than an eighth: the store's pass
    stops after its first stage of rows (of 7; the second would pass the limit itself), and the
    dense rows give the verdict."""
    from gradcheck_cli.numerics.batching import ROW_STAGE

    stages = []
    row_stage = Jacobians._row_stage
    monkeypatch.setattr(Jacobians, "_row_stage", lambda self, *a: stages.append(a[1]) or row_stage(self, *a))
    result = _backward(TimesRowSum, [randn(2, 800)], 1 << 28)
    assert result.status.value == "pass"
    assert len(stages) == 1 + -(-1600 // ROW_STAGE) and stages[0] == 0


def test_the_sparse_store_holds_every_non_zero_entry_or_gives_up() -> None:
    args = [randn(16, 16), randn(16, 16, seed=1), randn(16, seed=2)]
    jac = jacobians(LinearFunction, args, None)
    dense = jac.rows(0, jac.layout.n_cols)
    nnz = int(torch.count_nonzero(dense))
    assert nnz == 16 * 16 * 16 * 2 + 16 * 16
    assert jac.sparse_rows(nnz - 1) is None  # over its limit: the caller recomputes rows per block
    store = jac.sparse_rows(nnz)
    assert store is not None and len(store.vals) == nnz
    for col0, col1 in [(0, jac.layout.n_cols), (100, 300)]:
        c, r, v = store.entries(col0, col1)
        assert torch.equal(c * jac.layout.n_rows + r, (c * jac.layout.n_rows + r).sort().values)  # by column, then row
        rebuilt = torch.zeros(col1 - col0, jac.layout.n_rows, dtype=DT).index_put_((c, r), v)
        torch.testing.assert_close(rebuilt, dense[col0:col1], rtol=0, atol=0)


def test_arguments_with_no_elements_are_compared_without_error() -> None:
    class Scale(Function):
        @staticmethod
        def forward(ctx: Any, x: torch.Tensor, w: torch.Tensor) -> tuple:
            return x * w.sum(), 2 * w

        @staticmethod
        def backward(ctx: Any, gx: torch.Tensor, gw: torch.Tensor) -> tuple:
            return gx * 0, 2 * gw

    result = check(Scale, [randn(0).requires_grad_(), randn(0, seed=1).requires_grad_()])
    # nothing compared is a skip that says why, never a pass (issue 44 item 3), and never an error
    assert result.status.value == "skip" and result.error is None, result.checks[0].message
    assert "has no elements" in result.checks[0].message


class TwoTapsWrong(Function):
    """``2 x + 2 roll(x, 1)``, with backward ``4 roll(g, -1)``: exact finite differences at x = 0,
    so many entries are equally far off; the worst reported is the first, on either path."""

    @staticmethod
    def forward(ctx: Any, x: torch.Tensor) -> torch.Tensor:
        return 2 * x + 2 * x.roll(1)

    @staticmethod
    def backward(ctx: Any, g: torch.Tensor) -> torch.Tensor:
        return 4 * g.roll(-1)


@pytest.mark.parametrize("memory", [900_000, 1 << 28], ids=["dense rows do not fit", "dense rows fit"])
@pytest.mark.parametrize("fn", [LinearFunction, WrongWeightGrad])
def test_the_sparse_store_gives_the_dense_numbers(fn: type, memory: int, monkeypatch: pytest.MonkeyPatch) -> None:
    """Linear n=16: the dense Jacobian (1.1 MB) does or does not fit, its 8448 non-zero entries
    (200 kB, 3% of the entries) do: the rows are computed once, and the numerical columns are
    compared chunk by chunk at the stored entries (and where they are non-zero themselves: a
    transposed weight gradient has its entries elsewhere), with the numbers of dense rows."""
    from gradcheck_cli.numerics.rows import SparseRows

    args = [randn(16, 16), randn(16, 16, seed=1), randn(16, seed=2)]
    with monkeypatch.context() as m:
        m.setattr(Jacobians, "sparse_rows", lambda *a, **k: None)
        dense = _backward(fn, args, 1 << 28)
    spans = []
    read = SparseRows.entries
    monkeypatch.setattr(SparseRows, "entries", lambda self, *a: spans.append(a) or read(self, *a))
    stored = _backward(fn, args, memory)
    assert len(spans) >= (6 if memory < 1 << 20 else 3)  # a span per argument and chunk, read from the store
    compressed = _backward(fn, args, memory, compress=True)
    assert stored.status == dense.status == compressed.status == ("pass" if fn is LinearFunction else "fail")
    for s, d in [*zip(stored.inputs, dense.inputs), *zip(compressed.inputs, dense.inputs)]:
        assert (determined(s), s.diagnosis) == (determined(d), d.diagnosis)
        if s.status.value == "fail":  # a passing row's largest error and the values where it is are noise
            assert s.max_abs_err == pytest.approx(d.max_abs_err, rel=1e-9, abs=1e-15)
            assert (s.analytical, s.numerical) == pytest.approx((d.analytical, d.numerical), rel=1e-9, abs=1e-15)


def test_the_sparse_store_reports_the_dense_rows_worst_element_among_ties(monkeypatch: pytest.MonkeyPatch) -> None:
    x = torch.zeros(32, dtype=DT)
    with monkeypatch.context() as m:
        m.setattr(Jacobians, "sparse_rows", lambda *a, **k: None)
        (dense,) = _backward(TwoTapsWrong, [x], 1 << 28).inputs
    (stored,) = _backward(TwoTapsWrong, [x], 1 << 28).inputs
    assert (
        (stored.worst_index, stored.worst_output, stored.analytical, stored.numerical)
        == (dense.worst_index, dense.worst_output, dense.analytical, dense.numerical)
        == ([0], "output 0 [0]", 0.0, 2.0)
    )
    assert stored.mismatched == dense.mismatched == 32


# -- probes (--fast): the 2 x arguments x probes perturbed forwards as one vmapped call ------------


class ComplexScale(Function):
    """``(1 + 2j) z + x``: a complex argument and a real one."""

    @staticmethod
    def forward(ctx: Any, z: torch.Tensor, x: torch.Tensor) -> torch.Tensor:
        return (1 + 2j) * z + x

    @staticmethod
    def backward(ctx: Any, g: torch.Tensor) -> tuple:
        return g * (1 - 2j), g.real


def numerical(fn: type, args: list[torch.Tensor], batched: Optional[Callable]) -> torch.Tensor:
    from gradcheck_cli.numerics import probes
    from gradcheck_cli.numerics.streams import Stream, Streams, signed_uniform

    values = [a.clone() for a in args]
    out = as_tuple(fn.apply(*values))
    n_rows = sum(o.numel() * (2 if o.is_complex() else 1) for o in out)
    gen = Streams(0).generator(Stream.PROBES)
    vs = signed_uniform((3, n_rows), gen)
    us = [signed_uniform((3, a.numel() * (2 if a.is_complex() else 1)), gen) for a in args]
    result = probes._numerical(lambda vals: fn.apply(*vals), batched, values, values, us, 1e-6, [0], vs)
    for v, a in zip(values, args):
        assert torch.equal(v, a)  # every perturbation undone
    return result


class GradModeScale(Function):
    """``x`` under apply (forward runs without grad mode), ``2 x`` if grad mode were on."""

    @staticmethod
    def forward(ctx: Any, x: torch.Tensor) -> torch.Tensor:
        return x * (2.0 if torch.is_grad_enabled() else 1.0)

    @staticmethod
    def backward(ctx: Any, g: torch.Tensor) -> torch.Tensor:
        return g


@pytest.mark.parametrize(
    "fn, args",
    [
        (LinearFunction, [randn(5, 4), randn(3, 4, seed=1), randn(3, seed=2)]),
        (ComplexScale, [torch.complex(randn(3, 2), randn(3, 2, seed=1)), randn(3, 2, seed=2)]),
        (GradModeScale, [randn(3, 4)]),  # the vmapped body runs as apply runs forward: without grad mode
    ],
    ids=["linear", "complex", "grad mode"],
)
def test_probes_batched_give_the_single_calls_numbers(fn: type, args: list, monkeypatch: pytest.MonkeyPatch) -> None:
    from gradcheck_cli.numerics import probes

    single = numerical(fn, args, None)
    singles = []
    perturbed = probes._perturbed
    monkeypatch.setattr(probes, "_perturbed", lambda *a: singles.append(1) or perturbed(*a))
    batched = numerical(fn, args, body(fn))
    assert len(singles) == 1 and batched.shape == (len(args), 3, 3)  # the batch was used, checked by one single call
    torch.testing.assert_close(batched, single, rtol=1e-6, atol=1e-8)


@pytest.mark.parametrize(
    "fn, batched",
    [(ItemScale, body(ItemScale)), (LinearFunction, lambda values: 1.001 * body(LinearFunction)(values))],
    ids=["does not vmap", "other numbers"],
)
def test_probes_fall_back_to_single_calls(fn: type, batched: Callable) -> None:
    args = [randn(3, 4), randn(2, 4, seed=1), randn(2, seed=2)][: 1 if fn is ItemScale else 3]
    torch.testing.assert_close(numerical(fn, args, batched), numerical(fn, args, None), rtol=0, atol=0)


def test_probes_batch_only_within_their_memory_budget(monkeypatch: pytest.MonkeyPatch) -> None:
    from gradcheck_cli.numerics import probes

    args = [randn(5, 4), randn(3, 4, seed=1), randn(3, seed=2)]
    single = numerical(LinearFunction, args, None)
    monkeypatch.setattr(probes, "BATCH_BYTES", 800)  # the smallest argument alone needs 864 bytes
    monkeypatch.setattr(probes, "_all_at_once", lambda *a: pytest.fail("batched beyond BATCH_BYTES"))
    torch.testing.assert_close(numerical(LinearFunction, args, body(LinearFunction)), single, rtol=0, atol=0)


def test_probes_batch_arguments_in_groups_within_their_memory_budget(monkeypatch: pytest.MonkeyPatch) -> None:
    """Each argument fits in BATCH_BYTES on its own, no two together: three vmapped forwards."""
    from gradcheck_cli.numerics import probes

    args = [randn(5, 4), randn(3, 4, seed=1), randn(3, seed=2)]
    single = numerical(LinearFunction, args, None)
    monkeypatch.setattr(probes, "BATCH_BYTES", 2000)
    groups, all_at_once, singles, perturbed = [], probes._all_at_once, [], probes._perturbed
    monkeypatch.setattr(probes, "_all_at_once", lambda *a: groups.append(len(a[2])) or all_at_once(*a))
    monkeypatch.setattr(probes, "_perturbed", lambda *a: singles.append(1) or perturbed(*a))
    torch.testing.assert_close(numerical(LinearFunction, args, body(LinearFunction)), single, rtol=1e-6, atol=1e-8)
    assert groups == [1, 1, 1] and len(singles) == 3  # each group checked by one single call


@pytest.mark.parametrize(
    "shapes, n_rows",
    [
        ([(4, 4)] * 12, 16),  # many small arguments: one stage
        ([(64, 64), (64, 64), (64,)], 4096),
        ([(128, 128), (128, 128), (128,)], 16384),  # STAGE_BYTES, not COL_STAGE, sets the size
        ([(400, 400), (3,)], 1),  # a large argument: a few columns per stage (6; a million elements took 1 each,
        # a million stages)
    ],
)
def test_column_stages_cover_each_column_once_within_their_budget(shapes: list, n_rows: int) -> None:
    from gradcheck_cli.numerics.batching import STAGE_BYTES
    from gradcheck_cli.numerics.jacobian_layout import Layout

    inputs = [torch.zeros(s, dtype=DT) for s in shapes]
    starts = [0]
    for t in inputs:
        starts.append(starts[-1] + t.numel())
    jac = Jacobians(None, vjp, [], [], [], Layout(inputs, [0], starts, [n_rows]), 1e-6, None, 1 << 28)
    for col0, col1 in [(0, starts[-1]), (1, starts[-1] - 1)]:
        stages = list(jac._column_stages(col0, col1))
        columns = [starts[i] + j for stage in stages for i, j0, j1 in stage for j in range(j0, j1)]
        assert columns == list(range(col0, col1))
        for stage in stages:
            n = sum(j1 - j0 for _, j0, j1 in stage)
            moved = sum(inputs[i].numel() for i, _, _ in stage)
            assert n <= COL_STAGE and (n == 1 or 16 * n * (moved + n_rows) <= STAGE_BYTES)
    if len(shapes) == 12:
        assert len(list(jac._column_stages(0, starts[-1]))) == 1  # all 192 columns in one vmapped forward


class Mul(Function):
    @staticmethod
    def forward(ctx: Any, x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
        ctx.save_for_backward(x, y)
        return x * y

    @staticmethod
    def backward(ctx: Any, g: torch.Tensor) -> tuple:
        x, y = ctx.saved_tensors
        return g * y, g * x


def test_one_tensor_passed_twice_is_moved_in_both_places_in_one_stage() -> None:
    """Both arguments are the same tensor: perturbing one element moves both, as a single call does."""
    x = randn(3, 4)
    values = [x.clone()] * 2
    layout = make_layout(values, (values[0],), [0])
    for batched in (None, body(Mul)):
        jac = Jacobians(lambda v: Mul.apply(*v), vjp, [], [], values, layout, 1e-6, batched, 1 << 28)
        columns = jac.columns(0, layout.n_cols)
        if batched is not None:
            assert jac.batched_cols is True  # the batch moved both places: it gave the single calls' numbers
        torch.testing.assert_close(columns[:12], torch.diag(2 * x.reshape(-1)), rtol=1e-6, atol=1e-8)
        torch.testing.assert_close(columns[12:], columns[:12], rtol=0, atol=0)


def test_probes_move_one_tensor_passed_twice_in_both_places(monkeypatch: pytest.MonkeyPatch) -> None:
    from gradcheck_cli.numerics import probes
    from gradcheck_cli.numerics.streams import Stream, Streams, signed_uniform

    x = randn(3, 4)
    values = [x.clone()] * 2
    gen = Streams(0).generator(Stream.PROBES)
    vs, us = signed_uniform((3, 12), gen), [signed_uniform((3, 12), gen) for _ in values]
    call = lambda v: Mul.apply(*v)  # noqa: E731
    single = probes._numerical(call, None, values, values, us, 1e-6, [0], vs)
    singles = []
    perturbed = probes._perturbed
    monkeypatch.setattr(probes, "_perturbed", lambda *a: singles.append(1) or perturbed(*a))
    batched = probes._numerical(call, body(Mul), values, values, us, 1e-6, [0], vs)
    assert len(singles) == 1  # the batch was used, checked by one single call
    torch.testing.assert_close(batched, single, rtol=1e-6, atol=1e-8)


class DropsThePerturbations(Function):
    """exp, declared vmap-able, whose vmap rule computes the first batch row for every row (a batch
    that drops the perturbations: each row moves the outputs by only eps), with a backward that
    returns no gradient."""

    @staticmethod
    def forward(x: torch.Tensor) -> torch.Tensor:
        return x.exp()

    @staticmethod
    def setup_context(ctx: Any, inputs: tuple, output: torch.Tensor) -> None:
        pass

    @staticmethod
    def backward(ctx: Any, g: torch.Tensor) -> None:
        return None  # BUG: exp's gradient is exp(x) g

    @staticmethod
    def vmap(info: Any, in_dims: tuple, x: torch.Tensor) -> tuple:
        first = x.select(in_dims[0], 0) if in_dims[0] is not None else x
        return first.exp().unsqueeze(0).expand(info.batch_size, *first.shape), 0


def test_probes_see_a_batch_that_drops_the_perturbations() -> None:
    """Its outputs at x are right, its probes would all read 0 and agree with the missing
    gradient: the check of the batch compares a difference quotient with single calls, so the
    probes use single calls, fail, and the element-wise comparison gives the verdict."""
    from gradcheck_cli import FAST_PROBES

    for seed in range(3):
        result = check(DropsThePerturbations, [randn(64).requires_grad_()], probes=FAST_PROBES, seed=seed).checks[0]
        assert result.status.value == "fail" and result.mode == "elementwise", (seed, result.message)


class ThreadsSeen(Function):
    """``2 x``, noting how many CPU threads torch had in each forward and backward."""

    seen: list = []

    @staticmethod
    def forward(ctx: Any, x: torch.Tensor) -> torch.Tensor:
        ThreadsSeen.seen.append(torch.get_num_threads())
        return 2 * x

    @staticmethod
    def backward(ctx: Any, g: torch.Tensor) -> torch.Tensor:
        ThreadsSeen.seen.append(torch.get_num_threads())
        return 2 * g


@pytest.mark.parametrize(
    "numel, probes, threads",
    [
        (64, 3, 1),  # --fast on small tensors: one thread for the whole check
        (40000, 3, 2),  # above torch's grain: the threads it has
        (64, 0, 2),  # the element-wise check: untouched
    ],
    ids=["fast small", "fast large", "element-wise"],
)
def test_fast_checks_of_small_tensors_run_on_one_thread(numel: int, probes: int, threads: int) -> None:
    before = torch.get_num_threads()
    torch.set_num_threads(2)
    try:
        ThreadsSeen.seen = []
        assert check(ThreadsSeen, [randn(numel).requires_grad_()], probes=probes).status.value == "pass"
        assert set(ThreadsSeen.seen) == {threads} and torch.get_num_threads() == 2  # and put back
    finally:
        torch.set_num_threads(before)


def test_a_small_jacobian_is_taken_whole_and_a_large_one_compressed(monkeypatch):
    """Rows that fit one batched backward and columns at most four batched forwards: no grouped rows,
    no column groups (their fixed costs are more than the calls they save); the same rows as compressed."""
    from gradcheck_cli import check
    from gradcheck_cli.examples.linear import LinearFunction
    from gradcheck_cli.numerics import jacobians as jac_module
    from gradcheck_cli.numerics.compressed import Groups
    from gradcheck_cli.numerics.row_groups import RowGroups
    from gradcheck_cli.results import to_dict

    seen: list[str] = []
    for cls, name in ((RowGroups, "store"), (Groups, "evaluate"), (Jacobians, "sparse_rows")):
        original = getattr(cls, name)
        monkeypatch.setattr(cls, name, lambda self, *a, _o=original, _n=name, **k: seen.append(_n) or _o(self, *a, **k))
    g = torch.Generator().manual_seed(0)

    def args(n: int) -> tuple[torch.Tensor, ...]:
        return tuple(torch.randn(*s, dtype=torch.float64, generator=g).requires_grad_() for s in ((n, n), (n, n), (n,)))

    from gradcheck_cli.examples.relu import ReLU

    small = (torch.randn(8, 8, dtype=torch.float64, generator=g).requires_grad_(),)  # 64 x 64 entries
    whole = to_dict(check(ReLU, small))
    assert seen == []
    check(LinearFunction, args(12))  # 300 input elements: 600 perturbations, three batched forwards
    assert "store" not in seen and "evaluate" not in seen
    check(LinearFunction, args(24))  # 1,176 input elements: 2,352 perturbations, more than four batched calls
    assert "store" in seen and "evaluate" in seen
    monkeypatch.setattr(jac_module, "SMALL", 0)
    seen.clear()
    compressed = to_dict(check(ReLU, small))
    assert "evaluate" in seen
    assert report_rows(whole) == report_rows(compressed)  # times differ


@pytest.mark.parametrize("own_step", [True, False], ids=["torch's last step", "torch.func.vmap"])
def test_vmapped_rows_are_torch_func_vmaps(own_step: bool, monkeypatch: pytest.MonkeyPatch) -> None:
    """The vmapped forward gives torch.func.vmap's rows (through its own last step where torch has it
    as expected, else through torch.func.vmap), realified and flat, for a tensor passed twice, one
    argument left unbatched and outputs of several dtypes."""
    from gradcheck_cli.numerics import batching

    if not own_step:
        monkeypatch.setattr(batching, "_FLAT_VMAP", None)
    x, y, w = randn(3, 4), randn(4, seed=1), torch.complex(randn(4, seed=2), randn(4, seed=3))

    def forward(values: list) -> tuple:
        a, b, c, d = values
        return (a * b).sum(-1), 2, (a + c).float(), d * b

    values = [x, y, x, w]
    batches: dict = {}
    for v in (x, y):
        batching.copies(batches, v, 5)
        batches[id(v)][1].add_(torch.arange(5, dtype=torch.float64).view(5, 1))  # row r moved by r
    got = batching.vmapped(forward, values, batches, [0, 2, 3])
    rows = [
        torch.cat(
            [
                o.reshape(-1) if not o.is_complex() else torch.view_as_real(o).reshape(-1)
                for o in (out[0], out[2].double(), out[3])
            ]
        )
        for out in (forward([x + r, y + r, x + r, w]) for r in range(5))
    ]
    assert torch.allclose(got, torch.stack(rows))


def test_agreed_entries_fold_as_update_entries_does_and_infinite_ones_are_refused():
    """``ArgumentComparison.fold_agreed`` then ``flush`` (a compressed group's accepted entries: no bad ones, no index
    tensors) gives the statistics ``update_entries`` gives; an entry that is not finite is left to it (the
    block's ``fallback``, which here folds nothing)."""
    from gradcheck_cli.numerics import ArgumentComparison

    g = torch.Generator().manual_seed(0)
    c = torch.tensor([0, 0, 1, 3, 3, 3])
    r = torch.tensor([1, 4, 2, 0, 1, 5])
    av = torch.randn(6, dtype=torch.float64, generator=g)
    nv = av * (1 + 1e-5 * torch.randn(6, dtype=torch.float64, generator=g))
    plain, agreed = ArgumentComparison(8, atol=1e-5, rtol=1e-3), ArgumentComparison(8, atol=1e-5, rtol=1e-3)
    plain.update_entries(c, r, av, nv, (4, 6), 2, torch.zeros(6, dtype=torch.float64), spans=[3], extras=False)
    fell_back: list[object] = []
    agreed.fold_agreed(av, nv, (4, 6), 2, lambda k: (int(c[k]), int(r[k])), fell_back.append, spans=[3])
    agreed.flush()
    assert not fell_back
    fields = (
        "max_abs",
        "max_rel",
        "worst_excess",
        "worst_row",
        "worst_col",
        "analytical",
        "numerical",
        "nonfinite",
        "sum_an",
        "sum_nn",
        "sum_aa",
    )
    assert [getattr(agreed, f) for f in fields] == [getattr(plain, f) for f in fields]
    assert torch.equal(agreed.bad, plain.bad) and not bool(agreed.bad.any())
    infinite = nv.clone()
    infinite[2] = math.inf
    refused = ArgumentComparison(8, atol=1e-5, rtol=1e-3)
    refused.fold_agreed(av, infinite, (4, 6), 2, lambda k: (int(c[k]), int(r[k])), fell_back.append)
    refused.flush()
    assert fell_back == [refused]
    assert refused.sum_nn == 0 and refused.worst_excess == -1.0  # nothing folded


def _strategy(fwd: Callable, shapes: list[tuple[int, ...]], twice: bool = False, memory_bytes: int = 2**30) -> Any:
    """The strategy ``compare`` ran for ``fwd`` at arguments of ``shapes`` (one tensor passed twice: ``twice``)."""
    from gradcheck_cli.numerics.jacobians import compare

    g = torch.Generator().manual_seed(0)
    xs = [torch.randn(*s, dtype=DT, generator=g).requires_grad_() for s in shapes]
    xs = [xs[0], xs[0]] if twice else xs
    outputs = fwd(xs)
    plain = [x.detach().clone() for x in xs[: 1 if twice else len(xs)]]
    plain = [plain[0], plain[0]] if twice else plain
    found = compare(fwd, outputs, [0], xs, plain, plain, eps=1e-6, atol=1e-5, rtol=1e-3, memory_bytes=memory_bytes)
    layout, entries = found  # still the (layout, entries) pair
    assert layout.n_cols == sum(x.numel() for x in xs) and len(entries) == len(xs)
    return found.strategy


def test_compare_names_the_strategy_it_chose(monkeypatch: pytest.MonkeyPatch) -> None:
    """``choose_strategy`` as the sizes and the structure decide it: a small Jacobian is taken whole (its dense
    rows in blocks where the memory holds less), an elementwise one compressed from one backward call, a
    matrix product from the diagonals, a tensor passed twice with its columns one by one (not independent)."""
    from gradcheck_cli.numerics import jacobians as jac_module
    from gradcheck_cli.numerics.jacobians import Strategy

    def sin(v: list[torch.Tensor]) -> tuple[torch.Tensor, ...]:
        return (v[0].sin(),)

    def mul(v: list[torch.Tensor]) -> tuple[torch.Tensor, ...]:
        return (v[0] * v[1],)

    def mm(v: list[torch.Tensor]) -> tuple[torch.Tensor, ...]:
        return (v[0] @ v[1],)

    assert _strategy(sin, [(8, 8)]) is Strategy.DENSE
    assert _strategy(sin, [(8, 8)], memory_bytes=40) is Strategy.DENSE_BLOCKS  # a column's rows at a time
    assert _strategy(mm, [(6, 6), (6, 6)]) is Strategy.DENSE  # small: never compressed
    monkeypatch.setattr(jac_module, "SMALL", 0)
    assert _strategy(sin, [(8, 8)]) is Strategy.COMPRESSED_AT_ONCE
    assert _strategy(mm, [(12, 12), (12, 12)]) is Strategy.COMPRESSED
    assert _strategy(mul, [(8, 8)], twice=True) is Strategy.SPARSE
