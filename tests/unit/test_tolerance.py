"""The one tolerance module: its comparison is torch's, its table is the one every check reads,
and each argument is judged by its own dtype's limits."""

from __future__ import annotations

import io
import re
import tokenize
from pathlib import Path

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from gradcheck_cli.core.tolerance import PRECISIONS, Tolerance, by_dtype, limit, same, within

PACKAGE = Path(__file__).resolve().parents[2] / "gradcheck_cli"
floats = st.one_of(st.just(float("nan")), st.floats(min_value=-1e6, max_value=1e6), st.sampled_from([0.0, -0.0, 1.0]))


@settings(max_examples=300, deadline=None)
@given(
    st.lists(st.tuples(floats, floats), min_size=1, max_size=20),
    st.sampled_from([0.0, 1e-8, 1e-5, 1e-2]),
    st.sampled_from([0.0, 1e-5, 1e-3, 0.5]),
)
def test_within_is_torch_isclose_and_nan_is_within_nothing(pairs, atol, rtol):
    a = torch.tensor([p[0] for p in pairs], dtype=torch.float64)
    n = torch.tensor([p[1] for p in pairs], dtype=torch.float64)
    assert torch.equal(within(a, n, atol, rtol), torch.isclose(a, n, rtol=rtol, atol=atol, equal_nan=False))


def test_limit_is_the_same_number_for_a_float_and_a_tensor_and_leaves_its_argument_unless_in_place():
    n = torch.tensor([0.0, 3.0, -0.0, 1e300], dtype=torch.float64)
    kept = n.clone()
    out = limit(n.abs(), 1e-5, 1e-3)
    assert [limit(abs(float(v)), 1e-5, 1e-3) for v in kept] == out.tolist()
    assert torch.equal(n, kept)
    m = n.abs()
    assert limit(m, 1e-5, 1e-3, in_place=True) is m


def test_the_table_holds_torchs_own_defaults():
    # two computations of the same values: torch.allclose's defaults; rule allclose: assert_close's rtol
    assert (by_dtype(torch.float64).same.atol, by_dtype(torch.float64).same.rtol) == (1e-8, 1e-5)
    for dtype, rtol in (
        (torch.float64, 1e-7),
        (torch.float32, 1.3e-6),
        (torch.float16, 1e-3),
        (torch.bfloat16, 1.6e-2),
    ):
        assert by_dtype(dtype).close.rtol == rtol
    default = Tolerance()
    assert (default.eps, default.atol, default.rtol) == (1e-6, 1e-5, 1e-3)  # torch.autograd.gradcheck's
    assert by_dtype(torch.complex64) == by_dtype(torch.float32) and by_dtype(torch.complex128) == by_dtype(
        torch.float64
    )
    assert set(PRECISIONS) == {"float64", "float32", "float16", "bfloat16", "complex128", "complex64"}


def test_an_argument_is_judged_by_its_own_dtype_and_the_spec_keys_win():
    tol = Tolerance()
    assert tol.at_least(torch.float64) == tol  # float64 beside float32 keeps float64's limits
    low = tol.at_least(torch.float32)
    assert (low.atol, low.rtol, low.eps) == (1e-4, 1e-3, 1e-6)  # the step only where asked
    assert tol.at_least(torch.bfloat16, eps=True).eps == 5e-2
    given = Tolerance(atol=1e-7, rtol=1e-6, given=("atol", "rtol"))
    assert (given.at_least(torch.float16).atol, given.at_least(torch.float16).rtol) == (1e-7, 1e-6)
    assert same(torch.float16, nondet_tol=1e-3).atol == 1e-3 and same(torch.float16).atol == 1e-5


def _code(path: Path) -> str:
    """The module's code without comments and strings (docstrings may say the formula), one space between tokens."""
    tokens = tokenize.generate_tokens(io.StringIO(path.read_text()).readline)
    return " ".join(t.string for t in tokens if t.type in (tokenize.NAME, tokenize.OP, tokenize.NUMBER))


def test_no_module_writes_the_comparison_or_a_dtype_table_of_its_own():
    """``atol + rtol |n|`` and the per-dtype limits are written once, in tolerance.py."""
    comparison = re.compile(
        r"atol \+ [\w. ]*?rtol \*|\* [\w. ]*?rtol \+ [\w. ]*?atol\b|rtol \* [\w.() ]+? \+ [\w. ]*?atol\b|"
        r"\. mul_? \( [\w. ]*?rtol \) \. add_? \( [\w. ]*?atol \)"
    )
    table = re.compile(r"torch \. (float16|bfloat16|float32) : \(")
    found = []
    for path in PACKAGE.rglob("*.py"):
        if path.name != "tolerance.py":
            code = _code(path)
            found += [f"{path.name}: {m.group(0)}" for m in comparison.finditer(code)]
            found += [f"{path.name}: a dtype table" for _ in table.finditer(code)]
    assert not found, found


@pytest.mark.parametrize("dtype", [torch.float32, torch.float16, torch.bfloat16])
def test_a_float64_argument_beside_a_low_one_keeps_its_own_tolerance(dtype):
    import gradcheck_cli

    def f(x, y):
        return x.double() * 2 + y * 3

    x = torch.randn(4, dtype=dtype, requires_grad=True)
    y = torch.randn(4, dtype=torch.float64, requires_grad=True)
    result = gradcheck_cli.check(f, (x, y))
    rows = {r.name: r for r in result.checks[0].inputs}
    limits = by_dtype(dtype).gradient
    assert (rows["x"].atol, rows["x"].rtol) == (limits.atol, limits.rtol)
    assert (rows["y"].atol, rows["y"].rtol) == (1e-5, 1e-3)
