"""A float64 check of a forward that computes in float32 inside is judged again at float32's level (issue 34).

Three situations from real code, written as our own Functions: a fused SwiGLU with clamping that
casts its input to float32 (`y.to(torch.float32)`), a router whose matmul runs in float32 on
float64 inputs, and attention with a key padding mask whose softmax (and product with v) runs in
float32. Their backwards are exact float64 formulas; the labels come from autograd of the same
formula in float64 (``truth``), as torch.autograd.gradcheck at eps=1e-6 cannot judge them (it
fails the correct ones). At eps=1e-6 finite differences measure float32 rounding; the check sees
that (pattern ``precision``) and judges each such argument again at eps 1e-3 or 1e-2 with
float32 tolerances: the correct Functions pass with a warning that says what was not checked, the
1.01x and 1.1x wrong ones fail with the numbers there, and --strict fails the correct ones, saying
that they agree there but are not counted as a pass.
"""

from __future__ import annotations

import math
import re
from typing import Any, Callable

import pytest
import torch
import torch.nn.functional as F

from gradcheck_cli import check
from gradcheck_cli.results import Pattern, Status

LIMIT = 7.0  # SwiGLU's clamp
FACTORS = (1.01, 1.1)


def swiglu(x: torch.Tensor) -> torch.Tensor:
    a, b = x.chunk(2, -1)
    return F.silu(a.clamp(max=LIMIT)) * b.clamp(-LIMIT, LIMIT)


def router(x: torch.Tensor, w: torch.Tensor) -> torch.Tensor:
    return torch.softmax(x @ w, -1)


def attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    s = (q @ k.transpose(-1, -2)) / math.sqrt(q.shape[-1])
    return torch.softmax(s.masked_fill(~mask[..., None, :], float("-inf")), -1) @ v


def make_swiglu(factor: float = 1.0) -> type:
    class SwiGLU(torch.autograd.Function):
        """swiglu in float32 inside (the float64 input cast down, the result cast back)."""

        @staticmethod
        def forward(ctx: Any, x: torch.Tensor) -> torch.Tensor:
            ctx.save_for_backward(x)
            return swiglu(x.to(torch.float32)).to(x.dtype)

        @staticmethod
        def backward(ctx: Any, g: torch.Tensor) -> torch.Tensor:
            (x,) = ctx.saved_tensors
            a, b = x.chunk(2, -1)
            ac, bc = a.clamp(max=LIMIT), b.clamp(-LIMIT, LIMIT)
            s = torch.sigmoid(ac)
            ga = g * bc * s * (1 + ac * (1 - s)) * (a <= LIMIT)
            gb = g * ac * s * ((b >= -LIMIT) & (b <= LIMIT))
            return factor * torch.cat([ga, gb], -1)

    return SwiGLU


def make_router(factor: float = 1.0) -> type:
    class Router(torch.autograd.Function):
        """router with the matmul in float32."""

        @staticmethod
        def forward(ctx: Any, x: torch.Tensor, w: torch.Tensor) -> torch.Tensor:
            ctx.save_for_backward(x, w)
            return torch.softmax(x.float() @ w.float(), -1).to(x.dtype)

        @staticmethod
        def backward(ctx: Any, g: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
            x, w = ctx.saved_tensors
            p = router(x, w)
            gl = p * (g - (g * p).sum(-1, keepdim=True))
            return factor * gl @ w.T, factor * x.T @ gl

    return Router


def make_attention(factor: float = 1.0) -> type:
    class Attention(torch.autograd.Function):
        """attention with the masked softmax, and its product with v, in float32."""

        @staticmethod
        def forward(ctx: Any, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
            ctx.save_for_backward(q, k, v, mask)
            s = (q @ k.transpose(-1, -2)) / math.sqrt(q.shape[-1])
            p = torch.softmax(s.masked_fill(~mask[..., None, :], float("-inf")).float(), -1)
            return (p @ v.float()).to(q.dtype)

        @staticmethod
        def backward(ctx: Any, g: torch.Tensor) -> tuple[Any, ...]:
            q, k, v, mask = ctx.saved_tensors
            scale = 1 / math.sqrt(q.shape[-1])
            s = (q @ k.transpose(-1, -2)) * scale
            p = torch.softmax(s.masked_fill(~mask[..., None, :], float("-inf")), -1)
            gp = g @ v.transpose(-1, -2)
            gs = p * (gp - (gp * p).sum(-1, keepdim=True))
            return (
                factor * gs @ k * scale,
                factor * gs.transpose(-1, -2) @ q * scale,
                factor * p.transpose(-1, -2) @ g,
                None,
            )

    return Attention


def arguments(kind: str) -> list[Any]:
    gen = torch.Generator().manual_seed(0)

    def r(*shape: int) -> torch.Tensor:
        return torch.randn(*shape, generator=gen, dtype=torch.float64, requires_grad=True)

    if kind == "swiglu":
        return [r(3, 8)]
    if kind == "router":
        return [r(4, 6), r(6, 4)]
    mask = torch.tensor([[True, True, True, False], [True, True, False, False]])  # key padding
    return [r(2, 3, 4), r(2, 4, 4), r(2, 4, 4), mask]


SITUATIONS: dict[str, tuple[Callable[[float], type], Callable[..., torch.Tensor]]] = {
    "swiglu (float32 cast inside)": (make_swiglu, swiglu),
    "router (float32 matmul inside)": (make_router, router),
    "attention (float32 masked softmax inside)": (make_attention, attention),
}
KIND = {label: label.split()[0] for label in SITUATIONS}


def truth(label: str, factor: float) -> bool:
    """The label: backward equals autograd of the same formula in float64 (for one random grad_output)."""
    make, formula = SITUATIONS[label]
    args = arguments(KIND[label])
    leaves = [a for a in args if a.requires_grad]
    out = make(factor).apply(*args)
    g = torch.randn(out.shape, generator=torch.Generator().manual_seed(1), dtype=torch.float64)
    got = torch.autograd.grad(out, leaves, g)
    want = torch.autograd.grad(formula(*args), leaves, g)
    return all(torch.allclose(a, b, rtol=1e-9, atol=1e-12) for a, b in zip(got, want))


def backward_check(label: str, factor: float, **options: Any) -> Any:
    make, _ = SITUATIONS[label]
    result = check(make(factor), arguments(KIND[label]), **options)
    assert result.error is None, result.error
    (bw,) = result.checks
    return bw


@pytest.mark.slow
@pytest.mark.parametrize("label", SITUATIONS)
def test_a_correct_function_passes_at_float32_level_with_a_warning_that_says_what_was_not_checked(label):
    assert truth(label, 1.0)
    bw = backward_check(label, 1.0)
    assert bw.status is Status.PASS, bw.message
    rows = [r for r in bw.inputs if r.status is not Status.SKIP]
    assert all(r.status is Status.PASS and r.pattern is Pattern.PRECISION for r in rows), rows
    assert len(bw.warnings) == len(rows)
    for row, warning in zip(rows, bw.warnings):
        assert warning.startswith(
            f"'{row.name}': forward computes in float32 or lower precision inside, so finite "
            "differences at eps=1e-06 measure rounding: judged at eps "
        ), warning
        assert "with float32 tolerances (atol 0.0001, rtol 0.001)" in warning
        assert "a relative error below about 0.001 cannot be seen this way" in warning
        assert "give `reference: pkg.mod:fn` for a tighter check" in warning
        assert re.search(r"judged at eps (0\.001|0\.01) ", warning), warning
        assert (row.atol, row.rtol) == (1e-4, 1e-3)  # the row shows the tolerances it was judged by
        assert "kink" not in warning


@pytest.mark.slow
@pytest.mark.parametrize("factor", FACTORS)
@pytest.mark.parametrize("label", SITUATIONS)
def test_a_wrong_function_fails_with_the_float32_level_numbers(label, factor):
    assert not truth(label, factor)
    bw = backward_check(label, factor)
    assert bw.status is Status.FAIL, bw.message
    rows = [r for r in bw.inputs if r.status is not Status.SKIP]
    assert all(r.status is Status.FAIL for r in rows), rows
    for row in rows:
        assert row.diagnosis.startswith(
            "forward computes in float32 or lower precision inside, so finite "
            "differences at eps=1e-06 measure rounding: judged at eps"
        ), row.diagnosis
        assert (row.atol, row.rtol) == (1e-4, 1e-3)
        assert row.pattern is Pattern.CONSTANT_RATIO, row.diagnosis
        assert row.ratio == pytest.approx(factor, rel=2e-3)
        assert row.mismatched > 0 and row.max_rel_err > 1e-3


@pytest.mark.slow
@pytest.mark.parametrize("label", SITUATIONS)
def test_strict_keeps_a_precision_limited_check_from_passing(label):
    bw = backward_check(label, 1.0, strict=True)
    assert bw.status is Status.FAIL, bw.message
    rows = [r for r in bw.inputs if r.status is not Status.SKIP]
    assert all(r.status is Status.FAIL and r.pattern is Pattern.PRECISION for r in rows), rows
    for row in rows:
        assert "it agrees; --strict does not count a check limited by forward's precision as a pass" in row.diagnosis
        assert "wrong" not in row.diagnosis, row.diagnosis  # it is not called wrong (it was: 'wrong everywhere')
    assert not bw.warnings
