"""The lean comparison of the reference and compile checks (``checks.sides.compare``: promoted arithmetic, the
worst element from one argmax, mismatches counted only where the worst is outside the bound) against the
slow element-by-element path written out here in float64 over whole tensors: the same row, field for field,
on random pairs with values at the bound, non-finite values, complex elements and any chunk size. And the
relative rule's bar: never infinite or NaN (an infinite bar passed any target)."""

from __future__ import annotations

import math
import random
from dataclasses import dataclass
from typing import Any, Optional

import pytest
import torch

from gradcheck_cli import check
from gradcheck_cli.checks.parts import sides
from gradcheck_cli.core.tolerance import ReferenceRule, by_dtype
from gradcheck_cli.results import ErrorKind, InputReport, Status
from gradcheck_cli.sandbox.errors import UserCodeError

INDEX_CAP = sides.INDEX_CAP
DTYPES = [torch.bfloat16, torch.float16, torch.float32, torch.float64, torch.complex64, torch.complex128]


def reals(t: torch.Tensor) -> torch.Tensor:
    """``t``'s reals in float64, flat (a complex element as two)."""
    t = t.detach().resolve_conj()
    return (torch.view_as_real(t) if t.is_complex() else t).reshape(-1).to(torch.float64)


@dataclass
class Slow:
    """What the row must say, computed element by element in float64 over whole tensors."""

    status: Status
    mismatched: int
    max_abs: float
    max_rel: Optional[float]
    worst: list[int]
    at_a: float
    at_n: float
    baseline: Optional[float]
    first: list[list[int]]


def unravel(k: int, shape: tuple[int, ...]) -> list[int]:
    out = []
    for d in reversed(shape):
        out.insert(0, k % d)
        k //= d
    return out


def slow(a: torch.Tensor, n: torch.Tensor, own: Optional[torch.Tensor], rule: ReferenceRule) -> Any:
    per = 2 if a.is_complex() else 1
    real = a.real.dtype if a.is_complex() else a.dtype
    A, N = reals(a), reals(n)
    baseline = None
    if rule.rule == "relative":
        assert own is not None
        own_reals = reals(own)
        finite_n = torch.isfinite(N)
        if bool((finite_n & ~torch.isfinite(own_reals)).any()):
            return "unbarred"
        keep = finite_n
        error = float((own_reals - N)[keep].abs().max()) if bool(keep.any()) else 0.0
        largest = float(N[keep].abs().max()) if bool(keep.any()) else 0.0
        baseline = max(error, torch.finfo(real).eps * largest)
        atol, rtol = rule.factor * baseline + (rule.atol or 0.0), 0.0
    else:
        coarser = max(real, n.real.dtype if n.is_complex() else n.dtype, key=lambda d: torch.finfo(d).eps)
        close = by_dtype(coarser).close
        atol = rule.atol if rule.atol is not None else close.atol
        rtol = rule.rtol if rule.rtol is not None else close.rtol
    if not A.numel():
        return Slow(Status.PASS, 0, None, None, None, None, None, baseline, [])  # type: ignore[arg-type]
    apart = not math.isfinite(float((A - N).abs().max()))  # non-finite values set apart
    finite = torch.isfinite(A) & torch.isfinite(N)
    broken = ~finite & ~((A == N) | (A.isnan() & N.isnan())) if apart else torch.zeros_like(finite)
    A0, N0 = (torch.where(finite, A, 0.0), torch.where(finite, N, 0.0)) if apart else (A, N)
    diff = (A0 - N0).abs()
    tol = atol + rtol * N0.abs() if rtol else torch.full_like(diff, atol)
    bad = ((diff > tol) | broken).view(-1, per).any(1)
    big = N0.abs() > atol
    rel = diff / N0.abs()
    key = torch.where(broken, math.inf, diff - tol) if rtol or apart else diff
    k = int(torch.argmax(key))  # the first of the largest
    shape = tuple(a.shape)
    first = [unravel(int(i), shape) for i in bad.nonzero().view(-1)[:INDEX_CAP]]
    return Slow(
        Status.FAIL if bool(bad.any()) else Status.PASS,
        int(bad.sum()),
        float(diff.max()),
        float(rel[big].max()) if bool(big.any()) else None,
        unravel(k // per, shape),
        float(A[k]),
        float(N[k]),
        baseline,
        first,
    )


def same(x: Any, y: Any) -> bool:
    return (x is None and y is None) or (x is not None and y is not None and (x == y or x != x and y != y))


def case(seed: int) -> tuple[torch.Tensor, torch.Tensor, Optional[torch.Tensor], ReferenceRule, int]:
    """A random pair: the target's values ``a`` (any dtype), the reference's ``n`` (float64 or complex128),
    the reference's own in the target's dtype for the relative rule, a rule, a chunk size. Some elements
    sit at the bound, some are wrong by a factor, some are not finite."""
    r = random.Random(seed)
    g = torch.Generator().manual_seed(seed)
    dtype = r.choice(DTYPES)
    shape = tuple(r.choice([1, 2, 3, 7, 16, 33]) for _ in range(r.choice([0, 1, 1, 2, 2, 3])))
    if r.random() < 0.05:
        shape = (0, 3)
    wide = torch.complex128 if dtype.is_complex else torch.float64
    n = torch.randn(shape, generator=g, dtype=wide) * r.choice([1e-3, 1.0, 1e3])
    relative = not dtype.is_complex and dtype != torch.float64 and r.random() < 0.6
    rule = (
        ReferenceRule("relative", r.choice([1.0, 2.0, 4.0]), r.choice([None, 1e-4]), None)
        if relative
        else ReferenceRule("allclose", 2.0, r.choice([None, 1e-3, 0.0]), r.choice([None, 1e-2, 0.0]))
    )
    own = n.to(dtype) if relative else None
    if relative and r.random() < 0.5:  # the reference's own error: more than its rounding
        own = (n * (1 + 1e-3 * torch.randn(shape, generator=g, dtype=torch.float64))).to(dtype)
    a = n.to(dtype).clone()
    flat = a.view(-1) if a.numel() else a
    for _ in range(r.choice([0, 0, 1, 3, 10])):
        if not a.numel():
            break
        i = r.randrange(a.numel())
        what = r.choice(["factor", "nudge", "nan", "inf", "both nan", "ref inf", "own overflows"])
        if what == "factor":
            flat[i] = flat[i] * r.choice([1.01, 1.04, 1.5, -1.0, 0.0])
        elif what == "nudge":  # to about the bound: the slow path and the lean one must round alike
            flat[i] = flat[i] + r.choice([1, -1]) * r.choice([1e-3, 1e-2, 2e-2]) * (1 + abs(float(n.view(-1)[i].real)))
        elif what == "nan":
            flat[i] = math.nan
        elif what == "inf":
            flat[i] = r.choice([math.inf, -math.inf])
        elif what == "both nan":
            flat[i], n.view(-1)[i] = math.nan, math.nan
            if own is not None:
                own.view(-1)[i] = math.nan
        elif what == "ref inf":
            flat[i], n.view(-1)[i] = math.inf, math.inf
            if own is not None:
                own.view(-1)[i] = math.inf
        elif own is not None:  # the reference in the target's dtype overflows where in float64 it does not
            own.view(-1)[i] = -math.inf
    return a, n, own, rule, r.choice([2, 6, 64, 1000, 1 << 22])


@pytest.mark.parametrize("seed", range(400))
def test_the_row_is_the_slow_paths_field_for_field(seed, monkeypatch):
    a, n, own, rule, chunk = case(seed)
    monkeypatch.setattr(sides, "CHUNK", chunk)
    want = slow(a, n, own, rule)
    row = InputReport(0, "x", list(a.shape), "x", Status.PASS, numel=a.numel())
    if want == "unbarred":
        with pytest.raises(UserCodeError) as raised:
            sides.compare(row, a, n, own, rule, "gradient")
        assert raised.value.kind is ErrorKind.REFERENCE
        return
    sides.compare(row, a, n, own, rule, "gradient")
    assert row.status is want.status
    assert row.mismatched == want.mismatched
    assert same(row.baseline_err, want.baseline)
    if not a.numel():
        return
    assert same(row.max_abs_err, want.max_abs)
    assert same(row.max_rel_err, want.max_rel)
    assert list(row.worst_index) == want.worst
    assert same(row.analytical, want.at_a) and same(row.numerical, want.at_n)
    assert [list(i) for i in row.mismatched_indices or []] == want.first


def test_the_fuzz_draws_every_kind_of_pair():
    # the cases above are not all alike: passing and failing, both rules, every dtype, non-finite values,
    # values set apart, and unbarred references
    seen: set[Any] = set()
    for seed in range(400):
        a, n, own, rule, _ = case(seed)
        want = slow(a, n, own, rule)
        seen.add(a.dtype)
        seen.add(rule.rule)
        seen.add("unbarred" if want == "unbarred" else want.status)
        if a.numel() and not math.isfinite(float((reals(a) - reals(n)).abs().max())):
            seen.add("apart")
    assert set(DTYPES) | {"relative", "allclose", Status.PASS, Status.FAIL, "apart", "unbarred"} <= seen, seen


# ------------------------------------------------------------- the relative rule's bar is never infinite


class Scaled(torch.autograd.Function):
    """``1e30 x`` in bfloat16 (computed in float32): right, or wrong by ``OUT`` and ``GRAD``."""

    OUT, GRAD = 1.0, 1.0

    @classmethod
    def forward(cls, ctx: Any, x: torch.Tensor) -> torch.Tensor:
        return (x.float() * (1e30 * cls.OUT)).to(x.dtype)

    @classmethod
    def backward(cls, ctx: Any, g: torch.Tensor) -> torch.Tensor:
        return (g.float() * (1e30 * cls.GRAD)).to(g.dtype)


class WrongOutput(Scaled):
    OUT = 2.0


def overflowing(x: torch.Tensor) -> torch.Tensor:
    """``1e30 x`` as ``1e38 x / 1e8``: exact in float64, infinite in bfloat16 wherever |x| > 3.4."""
    return x * 1e38 / 1e8


@pytest.mark.parametrize("fn", [Scaled, WrongOutput])
def test_a_reference_that_overflows_in_the_targets_dtype_is_an_error_not_a_pass(fn):
    # its own error in bfloat16 is infinite where it overflows: a bar of inf passed a 2x wrong output before
    g = torch.Generator().manual_seed(0)
    x = (torch.rand(32, 32, generator=g, dtype=torch.float64) * 20 - 10).to(torch.bfloat16).requires_grad_()
    result = check(fn, [x], reference=overflowing)
    assert result.status is Status.ERROR and result.error.kind is ErrorKind.REFERENCE
    message = result.error.message
    assert "the reference run in bfloat16 (the target's dtype) gives" in message and "for the output at [" in message
    assert "rule: allclose" in message and "draw inputs" in message


def test_within_its_range_the_same_reference_judges_the_same_functions():
    g = torch.Generator().manual_seed(0)
    x = (torch.rand(32, 32, generator=g, dtype=torch.float64) * 4 - 2).to(torch.bfloat16).requires_grad_()
    assert check(Scaled, [x], reference=overflowing).status is Status.PASS
    wrong = check(WrongOutput, [x], reference=overflowing)
    assert wrong.status is Status.FAIL
    (ref,) = [c for c in wrong.checks if c.check == "reference"]
    assert [r.status for r in ref.inputs] == [Status.PASS, Status.FAIL]  # the gradient right, the output not


def test_a_reference_infinite_in_both_dtypes_sets_its_bar_from_its_finite_values():
    # infinite where the target is too: those agree, and the bar is the reference's own error elsewhere
    n = torch.randn(40, 40, generator=torch.Generator().manual_seed(1), dtype=torch.float64)
    n[0, 0], n[5, 7] = math.inf, -math.inf
    own = n.to(torch.bfloat16)
    rule = ReferenceRule("relative", 2.0, None, None)
    right = InputReport(0, "x", [40, 40], "bfloat16", Status.PASS, numel=1600)
    sides.compare(right, n.to(torch.bfloat16), n, own, rule, "gradient")
    assert right.status is Status.PASS and math.isfinite(right.baseline_err) and right.baseline_err > 0
    wrong = InputReport(0, "x", [40, 40], "bfloat16", Status.PASS, numel=1600)
    sides.compare(wrong, (1.04 * n).to(torch.bfloat16), n, own, rule, "gradient")
    assert wrong.status is Status.FAIL and wrong.mismatched > 0


def test_the_worst_element_of_a_nan_says_nan_not_zero():
    # the values at a non-finite worst element were the chunk's zeros: "0 vs 0" for a NaN against 1.3
    n = torch.ones(8, 8, dtype=torch.float64) * 1.3
    a = n.clone()
    a[2, 3] = math.nan
    row = InputReport(0, "x", [8, 8], "float64", Status.PASS, numel=64)
    sides.compare(row, a, n, None, ReferenceRule("allclose", 2.0, None, None), "gradient")
    assert row.status is Status.FAIL and row.worst_index == [2, 3]
    assert math.isnan(row.analytical) and row.numerical == 1.3


def test_the_non_finite_pattern_counts_elements_and_fits_infinities_of_both_signs():
    # a complex element NaN in both parts was "2 values", and +inf against -inf (infinite on both sides) was
    # "on one side only"
    n = torch.complex(torch.ones(4, 4, dtype=torch.float64), torch.ones(4, 4, dtype=torch.float64))
    a = n.clone()
    a[1, 2] = complex(math.nan, math.nan)
    row = InputReport(0, "z", [4, 4], "complex128", Status.PASS, numel=16)
    sides.compare(row, a, n, None, ReferenceRule("allclose", 2.0, None, None), "gradient")
    assert row.status is Status.FAIL and row.diagnosis.startswith("1 element is NaN or infinite on one side")
    r = torch.ones(4, dtype=torch.float64)
    r[0], b = math.inf, r.clone()
    b[0] = -math.inf
    row = InputReport(0, "x", [4], "float64", Status.PASS, numel=4)
    sides.compare(row, b, r, None, ReferenceRule("allclose", 2.0, None, None), "gradient")
    assert row.status is Status.FAIL and row.diagnosis == (
        "1 element is NaN or infinite on one side and not the same on the other"
    )
