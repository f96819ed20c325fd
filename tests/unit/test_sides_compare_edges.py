"""The lean comparison (``checks.sides.compare``, base 86d652d) against a judge written here element
by element in Python floats (IEEE doubles), on pairs the differential fuzz (test_compare_fuzz.py) does not
draw: 0-d and empty tensors, references coarser than the target, values near float64's largest (differences
and bounds past its range), denormals, +inf against -inf, NaN in one component of a complex element, rules
with atol or rtol 0 or rtol past 1, chunks of 2 to 6 reals, and the relative rule on complex targets."""

from __future__ import annotations

import math
import random
from typing import Any, Optional, Union

import pytest
import torch
from unit.test_compare_fuzz import same, slow

from gradcheck_cli.checks.parts import sides
from gradcheck_cli.core.tolerance import ReferenceRule, by_dtype
from gradcheck_cli.results import ErrorKind, InputReport, Status
from gradcheck_cli.sandbox.errors import UserCodeError

SPECIAL = [0.0, -0.0, 1.0, -1.0, math.nan, math.inf, -math.inf, 1e308, -1e308, 1.7e308, -1.7e308, 5e-324]
SPECIAL += [-5e-324, 2.2e-308, 65504.0, 3.4e38, -3.4e38, 1e-40, 1e-7, 1e-5]
REALS = [torch.bfloat16, torch.float16, torch.float32, torch.float64]
COMPLEX = [torch.complex64, torch.complex128]


def reals(t: torch.Tensor) -> list[float]:
    t = t.detach().resolve_conj()
    return (torch.view_as_real(t) if t.is_complex() else t).reshape(-1).to(torch.float64).tolist()


def real_of(dtype: torch.dtype) -> torch.dtype:
    return dtype.to_real() if dtype.is_complex else dtype


def judge(a: torch.Tensor, n: torch.Tensor, own: Optional[torch.Tensor], rule: ReferenceRule) -> Union[str, int]:
    """The number of elements outside the bound, element by element (a complex one: either part), or why the
    relative rule has no bar ("unbarred": the reference's own run not finite where it is; "overflow": its
    own error times the factor past float64's range)."""
    per = 2 if a.is_complex() else 1
    A, N = reals(a), reals(n)
    if rule.rule == "relative":
        assert own is not None
        error, largest = 0.0, 0.0
        for o, x in zip(reals(own), N):
            if math.isfinite(x):
                if not math.isfinite(o):
                    return "unbarred"
                error, largest = max(error, abs(o - x)), max(largest, abs(x))
        bar = max(error, torch.finfo(real_of(a.dtype)).eps * largest)
        if not math.isfinite(rule.factor * bar):
            return "overflow"
        atol, rtol = rule.factor * bar + (rule.atol or 0.0), 0.0
    else:
        coarser = max(real_of(a.dtype), real_of(n.dtype), key=lambda d: torch.finfo(d).eps)
        close = by_dtype(coarser).close
        atol = rule.atol if rule.atol is not None else close.atol
        rtol = rule.rtol if rule.rtol is not None else close.rtol
    bad = 0
    for i in range(0, len(A), per):
        wrong = False
        for x, y in zip(A[i : i + per], N[i : i + per]):
            if math.isfinite(x) and math.isfinite(y):
                wrong |= abs(x - y) > atol + rtol * abs(y)  # inf > inf is False: within
            else:
                wrong |= not (x == y or (math.isnan(x) and math.isnan(y)))
        bad += wrong
    return bad


def compared(
    a: torch.Tensor, n: torch.Tensor, own: Optional[torch.Tensor], rule: ReferenceRule
) -> Union[InputReport, UserCodeError]:
    row = InputReport(0, "x", list(a.shape), str(a.dtype)[6:], Status.PASS, numel=a.numel())
    try:
        sides.compare(row, a, n, own, rule, "gradient")
    except UserCodeError as exc:
        return exc
    return row


def agrees(got: Union[InputReport, UserCodeError], want: Union[str, int]) -> None:
    if isinstance(want, str):
        assert isinstance(got, UserCodeError) and got.kind is ErrorKind.REFERENCE, (got, want)
        return
    assert isinstance(got, InputReport), got
    assert (got.status, got.mismatched) == (Status.FAIL if want else Status.PASS, want)


def t(values: list[Any], dtype: torch.dtype = torch.float64) -> torch.Tensor:
    return torch.tensor(values, dtype=dtype)


ALLCLOSE = ReferenceRule("allclose", 2.0, None, None)


# ------------------------------------------------------------------------------------- hand-picked pairs


def test_a_nan_beside_a_pair_whose_difference_and_bound_overflow_fails():
    # |-1e308 - 1e308| and 2 |1e308| are both inf: their excess inf - inf was NaN, the first argmax took it as
    # the worst element, and NaN > 0 is false: the NaN against 1.0 beside it passed
    rule = ReferenceRule("allclose", 2.0, None, 2.0)
    a, n = t([-1e308, math.nan]), t([1e308, 1.0])
    assert judge(a, n, None, rule) == 1
    row = compared(a, n, None, rule)
    agrees(row, 1)
    assert isinstance(row, InputReport) and row.worst_index == [1] and math.isnan(row.analytical)


@pytest.mark.parametrize("chunk", [2, 4, 1 << 22])
def test_an_infinity_of_either_sign_beside_an_overflowing_pair_fails(chunk, monkeypatch):
    monkeypatch.setattr(sides, "CHUNK", chunk)
    rule = ReferenceRule("allclose", 2.0, 0.0, 3.0)
    a, n = t([-1.5e308, 2.0, 1.0, -math.inf]), t([1.5e308, 2.0, 1.0, math.inf])
    agrees(compared(a, n, None, rule), judge(a, n, None, rule))
    assert judge(a, n, None, rule) == 1


def test_a_relative_bar_past_float64s_range_is_an_error_not_a_pass():
    # the reference's own error 2e308 (in float64, its own dtype here) is inf: a bar of inf passed any target
    rule = ReferenceRule("relative", 2.0, None, None)
    n, own = t([-1e308, 1.0, 2.0]), t([1e308, 1.0, 2.0])
    a = t([0.0, 100.0, -7.0])  # wrong everywhere
    assert judge(a, n, own, rule) == "overflow"
    got = compared(a, n, own, rule)
    agrees(got, "overflow")
    assert isinstance(got, UserCodeError)
    assert "past float64's range" in str(got) and "`rule: allclose`" in str(got) and "'x'" in str(got)


def test_a_relative_bar_whose_factor_overflows_is_an_error_too():
    rule = ReferenceRule("relative", 4.0, None, None)
    n, own = t([-1e307, 1.0]), t([1e308, 1.0])  # own error 1.1e308, finite; 4x it is not
    agrees(compared(t([0.0, 5.0]), n, own, rule), "overflow")


def test_the_unbarred_message_of_a_complex_target_names_its_element_and_dtypes():
    # the real index was taken for the element's (2x too far), the real dtypes for the complex ones
    g = torch.Generator().manual_seed(0)
    n = torch.randn(4, 4, generator=g, dtype=torch.complex128)
    own = n.to(torch.complex64)
    own[3, 2] = complex(1.0, math.inf)
    got = compared(n.to(torch.complex64), n, own, ReferenceRule("relative", 2.0, None, None))
    assert isinstance(got, UserCodeError) and got.kind is ErrorKind.REFERENCE
    message = str(got)
    assert "at [3, 2]" in message, message
    assert "run in complex64 (the target's dtype)" in message and "run in complex128 it gives" in message
    assert "(1 such values)" in message


@pytest.mark.parametrize(
    "a, n, rule, want",
    [
        (t(1.0), t(1.0), ALLCLOSE, 0),  # 0-d
        (t(1.0), t(1.5), ALLCLOSE, 1),
        (t([]), t([]), ALLCLOSE, 0),
        (t([math.inf, -math.inf]), t([-math.inf, -math.inf]), ALLCLOSE, 1),  # +inf against -inf
        (t([math.inf, math.nan]), t([math.inf, math.nan]), ALLCLOSE, 0),  # equal non-finite values agree
        (t([5e-324, 1e-310]), t([0.0, 1e-310]), ReferenceRule("allclose", 2.0, 0.0, 0.0), 1),  # denormals
        (t([5e-324, 1e-310]), t([5e-324, 1e-310]), ReferenceRule("allclose", 2.0, 0.0, 0.0), 0),
        (t([1.0 + 2e-16]), t([1.0]), ReferenceRule("allclose", 2.0, 0.0, 0.0), 1),  # atol and rtol 0: exact
        (t([1.0, 2.0]), t([1.0, 2.0], torch.float16), ALLCLOSE, 0),  # a reference coarser than the target
        (t([1.0, 2.01]), t([1.0, 2.0], torch.float16), ALLCLOSE, 1),
        (t([complex(math.nan, 1.0)], torch.complex128), t([complex(2.0, 1.0)], torch.complex128), ALLCLOSE, 1),
        (t([complex(math.nan, 1.0)], torch.complex64), t([complex(math.nan, 1.0)], torch.complex128), ALLCLOSE, 0),
        (t([complex(1.0, math.inf)], torch.complex64), t([complex(1.0, -math.inf)], torch.complex128), ALLCLOSE, 1),
    ],
)
def test_edge_pairs_are_judged_element_by_element(a, n, rule, want):
    assert judge(a, n, None, rule) == want
    agrees(compared(a, n, None, rule), want)


@pytest.mark.parametrize("chunk", [2, 4, 6])
def test_a_complex_element_split_by_no_chunk(chunk, monkeypatch):
    # CHUNK reals at a time, rounded up to even: a complex element's parts are never in two chunks
    monkeypatch.setattr(sides, "CHUNK", chunk)
    n = torch.arange(7, dtype=torch.float64).to(torch.complex128) * (1 + 1j)
    a = n.clone()
    a[3] = complex(3.0, math.nan)
    a[5] = complex(5.5, 5.0)
    got = compared(a, n, None, ALLCLOSE)
    agrees(got, 2)
    assert isinstance(got, InputReport) and got.mismatched_indices == [[3], [5]]


# ---------------------------------------------------------------------------------------- random pairs


def draw(seed: int) -> tuple[torch.Tensor, torch.Tensor, Optional[torch.Tensor], ReferenceRule, int]:
    """A pair with special values on either side (near float64's largest, denormals, infinities of both signs,
    NaN), any dtype of the target, a reference in float64 or coarser, either rule, a chunk of 2 to 6 reals."""
    r = random.Random(seed)
    g = torch.Generator().manual_seed(seed)
    dtype = r.choice(REALS + COMPLEX)
    shape = r.choice([(), (1,), (3,), (2, 3), (5,), (4, 4), (0,), (7,)])
    wide = r.choice([torch.float64, torch.float64, torch.float32, torch.float16, torch.bfloat16])
    if dtype.is_complex:
        wide = wide.to_complex() if wide in (torch.float32, torch.float64) else torch.complex128
    scale = r.choice([1e-3, 1.0, 1e3, 1e300, 1e-310, 1e30])
    values = torch.randn(shape + ((2,) if dtype.is_complex else ()), generator=g, dtype=torch.float64) * scale
    for _ in range(r.choice([0, 1, 2, 4])):
        if values.numel():
            values.view(-1)[r.randrange(values.numel())] = r.choice(SPECIAL)
    target = values.clone()
    flat = target.view(-1)
    for _ in range(r.choice([0, 1, 2, 5])):
        if flat.numel():
            i = r.randrange(flat.numel())
            what = r.choice(["special", "factor", "nudge", "negate"])
            if what == "special":
                flat[i] = r.choice(SPECIAL)
            elif what == "factor":
                flat[i] *= r.choice([1.001, 1.01, 2.0, 0.0])
            elif what == "nudge":
                flat[i] += r.choice([1e-7, 1e-5, 1e-3, 1e-2]) * r.choice([1, -1])
            else:
                flat[i] = -flat[i]

    def made(v: torch.Tensor, d: torch.dtype) -> torch.Tensor:
        return torch.view_as_complex(v.to(real_of(d)).contiguous()) if d.is_complex else v.to(d)

    own, rule = None, ReferenceRule("allclose", 2.0, r.choice([None, 0.0, 1e-3]), r.choice([None, 0.0, 1e-2, 2.0]))
    if r.random() < 0.4:
        mine = values.clone()
        if r.random() < 0.5 and mine.numel():
            mine.view(-1)[r.randrange(mine.numel())] = r.choice(SPECIAL + [float(mine.view(-1)[0]) * 1.01])
        own, rule = made(mine, dtype), ReferenceRule("relative", r.choice([1.0, 2.0]), r.choice([None, 0.0, 1e-4]))
    return made(target, dtype), made(values, wide), own, rule, r.choice([2, 3, 4, 6, 1 << 22])


@pytest.mark.parametrize("seed", range(300))
def test_random_edge_pairs_are_judged_element_by_element(seed, monkeypatch):
    a, n, own, rule, chunk = draw(seed)
    monkeypatch.setattr(sides, "CHUNK", chunk)
    agrees(compared(a, n, own, rule), judge(a, n, own, rule))


@pytest.mark.parametrize("seed", range(300))
def test_random_edge_pairs_make_the_slow_paths_row_field_for_field(seed, monkeypatch):
    # the report's fields (worst element, values there, errors, first mismatches) as test_compare_fuzz's slow path
    # makes them, where the relative rule has a bar
    a, n, own, rule, chunk = draw(seed)
    monkeypatch.setattr(sides, "CHUNK", chunk)
    if isinstance(judge(a, n, own, rule), str):
        return
    want, got = slow(a, n, own, rule), compared(a, n, own, rule)
    assert isinstance(got, InputReport)
    fields = [(got.status, want.status), (got.mismatched, want.mismatched), (got.baseline_err, want.baseline)]
    if a.numel():
        fields += [(got.max_abs_err, want.max_abs), (got.max_rel_err, want.max_rel), (got.worst_index, want.worst)]
        fields += [(got.analytical, want.at_a), (got.numerical, want.at_n)]
        fields += [([list(i) for i in got.mismatched_indices or []], want.first)]
    assert all(same(x, y) for x, y in fields), fields


def test_the_random_pairs_hold_every_kind():
    seen: set[Any] = set()
    for seed in range(300):
        a, n, own, rule, _ = draw(seed)
        want = judge(a, n, own, rule)
        seen |= {a.dtype, rule.rule, want if isinstance(want, str) else "fail" if want else "pass"}
        seen.add("0-d" if a.dim() == 0 else "empty" if not a.numel() else "nd")
        seen.add("coarser" if torch.finfo(real_of(n.dtype)).eps > torch.finfo(real_of(a.dtype)).eps else "finer")
    kinds = {"relative", "allclose", "pass", "fail", "unbarred", "0-d", "empty", "coarser"}
    assert set(REALS + COMPLEX) | kinds <= seen, seen
