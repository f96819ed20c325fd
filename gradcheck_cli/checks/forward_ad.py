"""The ``forward_ad`` check: forward-mode AD (a Function's ``jvp``) against finite differences.

Like ``torch.autograd.gradcheck(check_forward_ad=True)``, column by column: for each real
element j of each checked argument, one forward with a dual number whose tangent is e_j gives
the column J e_j, and two perturbed forwards give the central difference column. Columns are
folded into ``numerics.ArgumentComparison`` in chunks (C x M, as ``numerics.compare`` does), so memory stays
O(chunk x outputs), never N x M. Plain callables are checked through forward AD of torch ops.
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from dataclasses import dataclass, replace
from functools import partial
from typing import Any, Callable, Optional

import torch
import torch.autograd.forward_ad as fwAD

from ..core.tolerance import Tolerance
from ..numerics import ArgumentComparison, as_tuple, central_difference, make_layout, real_flat, ties, unravel
from ..numerics.streams import signed_uniform
from ..results import CheckResult, ErrorKind, InputReport, Pattern, Status
from ..sandbox.errors import UserCodeError
from ..subject.custom_op import OpTarget
from ..subject.target import Target
from .parts import tied
from .parts.argument_rows import blank, fill_jacobian, take
from .parts.base import (
    CheckContext,
    call_forward,
    differentiable,
    fresh_leaves,
    half_precision,
    refuse_if_too_big,
    work_limit,
)
from .parts.second_look import EXPLAINED, PRECISION, look_again
from .parts.step import refuse_unusable
from .parts.upcast import reference
from .parts.verdict import begin, conclude, label, labels, reword, skip, unsupported

STREAM = 11  # the random stream of forward_ad's projection (a seed replays it)

CHECKED = "forward-mode AD (jvp) compared with finite differences along"


def no_jvp(target: Target) -> Optional[str]:
    """Why forward-mode AD cannot go through ``target`` at all (a Function without ``jvp``, a custom op
    without a forward-AD rule), with how to support it; None where it can."""
    if target.is_function and target.obj.jvp is torch.autograd.Function.jvp:
        return (
            f"{target.obj.__name__} defines no jvp(): forward-mode AD is not supported; to support it, "
            "define `@staticmethod def jvp(ctx, *tangents)` and save what it needs with "
            "ctx.save_for_forward(...)"
        )
    if isinstance(target, OpTarget) and not target.forward_ad_rule():
        return (
            f"the custom op {target.name} has no forward-AD rule: register_autograd gives "
            "it a backward only, so forward-mode AD (torch.func.jvp, torch.autograd.forward_ad) "
            "cannot go through it; to support it, implement the op in PyTorch ops "
            "(CompositeImplicitAutograd) or call it through an autograd.Function with a jvp"
        )
    return None


def run(ctx: CheckContext) -> CheckResult:
    """Check forward-mode AD of ``ctx.target`` column by column against central differences."""
    target, bound = ctx.target, ctx.bound
    start, reports, checked, result = begin(bound, "forward_ad", "elementwise")
    missing = no_jvp(target)
    if missing:
        return unsupported(result, missing, start, ctx.named)
    if not checked:
        return skip(result, "no argument requires grad: there is no tangent to push forward", start)
    half = half_precision(bound, checked, "the derivative")
    if half:
        return skip(result, half, start, row_reason="half precision")
    outputs = as_tuple(call_forward(target, bound, fresh_leaves(bound.values)))
    refuse_if_too_big(ctx, outputs)
    positions = differentiable(outputs)
    if not positions:
        return skip(
            result,
            "no output is differentiable (none is a floating-point tensor that requires grad): "
            "there is no tangent to compare",
            start,
        )
    plain = fresh_leaves(bound.values, grad=False)
    forward = lambda vals: call_forward(target, bound, vals)  # noqa: E731
    upcast, tols, notes = reference(
        forward, plain, bound.names, checked, ctx.tolerance, "jvp", "the numerical tangent comes from forward"
    )
    assert upcast is not None  # half precision skipped above
    refuse_unusable(upcast, checked, bound.names, tols)
    result.warnings += notes
    budget = work_limit(ctx, "forward_ad", checked, outputs, positions)
    cols = Columns(jvp_call(ctx), forward, plain, upcast, checked, outputs, positions, budget)
    try:
        layout, entries = compare_columns(ctx, cols, checked, tols)
    except UserCodeError as exc:
        named = named_mistake(exc, target, bound, plain, checked)
        if named is None:
            raise
        status, message = named
        if status is Status.SKIP:  # a Function it calls has no jvp, torch has no formula: unsupported
            return unsupported(result, message, start, ctx.named, "jvp failed (see the message)")
        return skip(result, message, start, status, "jvp failed (see the message)")
    imprecise = judge_rows(
        ctx,
        cols,
        [reports[i] for i in checked],
        layout,
        entries,
        tols,
        lambda row: f"a term for '{row.name}' is missing from jvp's tangent, or jvp does not use its tangent argument",
        "jvp",
        result.warnings,
    )
    failing = [r for r in reports if r.status is Status.FAIL]
    if failing and all(r.name in imprecise for r in failing):  # no verdict: finite differences measure rounding
        return unsupported(
            result,
            "; ".join(f"'{r.name}': {r.diagnosis}" for r in failing),
            start,
            ctx.named,
            "not judged: finite differences measure rounding",
        )
    return conclude(result, start, [], _wrong, lambda right: f"{CHECKED} {labels(right)}: all within tolerance")


def _refill(
    row: InputReport,
    entry: ArgumentComparison,
    layout: Any,
    value: torch.Tensor,
    outputs: tuple[Any, ...],
    t: Tolerance,
    eps: float,
) -> None:
    """``row`` judged again at ``t`` (float32's tolerances at a larger step, where the Function computes in
    float32 inside): a pass with a warning, or a fail with those numbers."""
    fresh = blank(row)
    fill_jacobian(fresh, entry, layout, value, outputs)
    take(row, fresh)
    what = (
        f"the Function computes in float32 or lower precision inside, so finite differences at eps={eps:g} "
        f"measure rounding: judged at eps {t.eps:g} with float32 tolerances (atol {t.atol:g}, rtol {t.rtol:g})"
    )
    if row.status is Status.PASS:
        row.pattern, row.ratio = Pattern.PRECISION, None
        row.reason = f"{what}; a relative error below about {t.rtol:g} cannot be seen this way"
    else:
        row.diagnosis = f"{what}: {row.diagnosis or f'{row.mismatched} of {row.numel} elements out of tolerance'}"


def _wrong(row: InputReport) -> str:
    what = f"the tangent along '{row.name}' is wrong"
    return f"{what}: {row.diagnosis}" if row.diagnosis else what


@dataclass(frozen=True)
class Columns:
    """What a column-by-column comparison of forward-mode AD with finite differences runs: ``jvp`` (the
    function on dual numbers, what it raises labelled as the code that runs in forward mode) on ``plain``,
    ``forward`` (the same function) on ``moved`` (what finite differences move: float64 copies of
    low-precision values), the positions of the values compared, the ``outputs`` (from one call) and the
    positions of the differentiable ones, and the ``budget`` of ``base.work_limit``."""

    jvp: Callable[[list[Any]], Any]
    forward: Callable[[Sequence[Any]], Any]
    plain: list[Any]
    moved: list[Any]
    checked: list[int]
    outputs: tuple[Any, ...]
    positions: list[int]
    budget: Callable[[int, int], None]


def compare_columns(
    ctx: CheckContext, cols: Columns, which: list[int], tols: list[Tolerance]
) -> tuple[Any, list[ArgumentComparison]]:
    """Fold jvp columns and central difference columns into one ArgumentComparison per value at ``which`` (positions in
    ``cols.plain``; ``tols``: each one's tolerance); the budget is told the calls first (see
    ``numerics.compare``)."""
    opts = ctx.options
    plain, moved, positions = cols.plain, cols.moved, cols.positions
    inputs = [plain[i] for i in which]
    layout = make_layout(inputs, cols.outputs, positions)
    cols.budget(3 * layout.n_cols, 1)  # a dual-number forward and two perturbed forwards per column
    probe = signed_uniform((layout.n_rows,), ctx.streams.generator(STREAM))
    keep = opts.memory_bytes // 16 // max(1, len(inputs))  # mismatching columns kept whole, per argument
    entries = [
        ArgumentComparison(layout.col_starts[k + 1] - layout.col_starts[k], t.atol, t.rtol, keep_bytes=keep)
        for k, t in enumerate(tols)
    ]
    chunk = max(1, opts.memory_bytes // 8 // 8 // max(1, layout.n_rows))  # columns held at once (both sides)
    for i, t, entry in zip(which, tols, entries):
        for c0 in range(0, entry.real_numel, chunk):
            span = range(c0, min(entry.real_numel, c0 + chunk))
            a = torch.stack([jvp_column(cols.jvp, plain, plain[i], c, positions) for c in span])
            n = torch.stack([central_difference(cols.forward, moved, moved[i], c, t.eps, positions) for c in span])
            entry.update(a, n, c0, probe)
    return layout, entries


def judge_rows(
    ctx: CheckContext,
    cols: Columns,
    rows: list[InputReport],
    layout: Any,
    entries: list[ArgumentComparison],
    tols: list[Tolerance],
    all_zeros: Callable[[InputReport], str],
    derivative: str,
    warnings: list[str],
) -> list[str]:
    """Fill ``rows`` (one per position of ``cols.checked``) from ``compare_columns``'s entries, and look
    again at the mismatches (``second_look``): a kink, tie or domain edge explains them (a pass with a
    warning), or the Function computes in float32 inside (judged again at a larger step), or they stand.
    ``all_zeros(row)`` says why an analytical side may be all zeros, ``derivative`` what gives it. Returns
    the names of the rows that fail where finite differences measure rounding (no verdict)."""
    imprecise: list[str] = []
    plain, moved, outputs, positions = cols.plain, cols.moved, cols.outputs, cols.positions
    corners = ties.Held(ctx.options.memory_bytes)  # elements explained at a corner, judged together below
    for k, (i, entry, row) in enumerate(zip(cols.checked, entries, rows)):
        fill_jacobian(row, entry, layout, plain[i], outputs)
        reword(entry, row, all_zeros(row), derivative)
        if row.status is Status.FAIL and row.mismatched:
            mark = len(corners.items)
            look = look_again(
                row,
                entry,
                cols.forward,
                moved,
                moved[i],
                positions,
                tols[k],
                partial(jvp_column, cols.jvp, plain, plain[i], positions=positions),
                derivative,
                corners=(corners, k),
            )
            if look.kind != EXPLAINED:
                corners.since(mark)  # a wrong element decides, or rounding: no corner story
            if look.kind == PRECISION and look.eps:
                t = replace(tols[k].at_least(torch.float32), eps=look.eps)
                again, (fresh,) = compare_columns(ctx, cols, [i], [t])
                _refill(row, fresh, again, plain[i], outputs, t, tols[k].eps)
            elif look.kind == EXPLAINED:
                row.status, row.mismatched, row.diagnosis, row.ratio = Status.PASS, 0, None, None
                row.pattern, row.at_kinks, row.reason = Pattern.KINK, look.count, look.text
            elif look.kind == PRECISION:
                row.pattern, row.ratio, row.diagnosis = Pattern.PRECISION, None, look.text
                imprecise.append(row.name)
            elif look.text:
                row.diagnosis = "; ".join(d for d in [row.diagnosis, look.text] if d)
    if corners.items:  # the loosest tolerance of the arguments at a corner: a tie is far outside any
        t = max((tols[c.argument] for c in corners.items), key=lambda t: (t.atol, t.rtol))
        tied.judge(rows, corners.items, cols.forward, moved, positions, t, f"the derivatives {derivative} gives")
    for row in rows:
        if row.status is Status.PASS and (row.at_kinks or row.pattern is Pattern.PRECISION):
            warnings.append(f"{label(row)}: {row.reason}")
    return imprecise


def jvp_call(ctx: CheckContext) -> Callable[[list[Any]], Any]:
    """Forward on dual numbers (through call_forward: a random forward draws the same numbers as in
    the finite differences); what it raises is labelled as jvp's."""
    what = "jvp" if ctx.target.is_function else "forward-mode AD through the function"
    return lambda vals: call_forward(ctx.target, ctx.bound, vals, ErrorKind.JVP, what)


def _real(t: torch.Tensor) -> torch.Tensor:
    return torch.view_as_real(t) if t.is_complex() else t


def _flat(tensors: list[Optional[torch.Tensor]], like: list[torch.Tensor]) -> torch.Tensor:
    """Realified float64 concatenation on the CPU; a missing tangent (None) is zeros of its output's size."""
    parts = [
        real_flat((t if t is not None else torch.zeros_like(o)).detach().contiguous()).to("cpu", torch.float64)
        for t, o in zip(tensors, like)
    ]
    return torch.cat(parts) if parts else torch.zeros(0, dtype=torch.float64)


def jvp_column(
    jvp: Callable[[list[Any]], Any], values: list[Any], t: torch.Tensor, col: int, positions: list[int]
) -> torch.Tensor:
    """J e_col: one forward on a dual number whose tangent is 1 at real element ``col`` of ``t``."""
    tangent = torch.zeros_like(t)
    _real(tangent)[tuple(unravel(col, _real(t).shape))] = 1
    with fwAD.dual_level():
        dual = fwAD.make_dual(t, tangent)
        outs = as_tuple(jvp([dual if v is t else v for v in values]))  # aliases (same_as) get the same dual
        primals = [fwAD.unpack_dual(outs[p]) for p in positions]
        return _flat([d.tangent for d in primals], [d.primal for d in primals])


# --------------------------------------------------------------- the usual mistakes, in words

_COUNT = re.compile(r"jvp returned an invalid number of forward gradients \(expected (\d+) but got (\d+)\)")
_SIZE = re.compile(r"Tensor is of size (\[[^\]]*\]) while the given forward gradient is of size (\[[^\]]*\])")
_NONDIFF = re.compile(r"jvp returned a gradient at position (\d+), but\s+the corresponding forward output is not")
_NONE = "Expected both tensor and its forward grad to be floating point or complex"
_UNSUPPORTED = re.compile(r"Trying to use forward AD with (.*?) that does not support it")
_NO_JVP = "You must implement the jvp function"


def named_mistake(
    exc: UserCodeError, target: Target, bound: Any, values: list[Any], checked: list[int]
) -> Optional[tuple[Status, str]]:
    """A known error from forward-mode AD as (status, message in the user's terms), or None."""
    cause = exc.__cause__
    text = str(cause) if cause is not None else str(exc)
    at = f" at {exc.where}" if exc.where else ""
    if _NO_JVP in text:
        return Status.SKIP, (
            "forward-mode AD is not supported: an autograd.Function it calls defines no jvp()"
            f"{at}; define `@staticmethod def jvp(ctx, *tangents)` there"
        )
    m = _UNSUPPORTED.search(text)
    if m:
        return Status.SKIP, f"forward-mode AD is not supported: torch has no forward-mode formula for {m.group(1)}"
    m = _COUNT.search(text)
    if m:
        want, got = m.groups()
        return Status.FAIL, (
            f"jvp returned {got} tangents, but forward returns {want} output{'s' * (want != '1')}: "
            "return one tangent per output of forward, in order (None for an output that is "
            "not differentiable)"
        )
    m = _SIZE.search(text)
    if m:
        return Status.FAIL, (
            f"jvp returned a tangent of shape {m.group(2)} for an output of shape {m.group(1)}: "
            "each tangent has the shape of its output"
        )
    m = _NONDIFF.search(text)
    if m:
        return Status.FAIL, (
            f"jvp returned a tangent for output {m.group(1)}, which is not differentiable "
            "(an integer output or one marked non-differentiable): return None at that position"
        )
    if _NONE in text:
        return Status.FAIL, (
            "jvp returned None (or a non-floating-point tensor) as the tangent of a "
            "differentiable output: return a tangent tensor for every differentiable output"
        )
    if (
        target.is_function
        and isinstance(cause, (ValueError, IndexError))
        and _reads_empty_saved(target, bound, values, checked)
    ):
        return Status.FAIL, (
            "jvp reads ctx.saved_tensors, but forward saved its tensors with ctx.save_for_backward "
            "only; in jvp, ctx.saved_tensors holds only what ctx.save_for_forward(...) kept "
            f"(nothing here), so it failed with {type(cause).__name__}: {cause}{at}; also call "
            "ctx.save_for_forward(...) with the tensors jvp needs, in forward or setup_context"
        )
    return None


def _reads_empty_saved(target: Target, bound: Any, values: list[Any], checked: list[int]) -> bool:
    """Replay one jvp through a probing subclass: was ctx.saved_tensors empty in jvp, while forward
    had called ctx.save_for_backward? (torch gives no message of its own for this mistake.)"""
    cls: Any = target.obj
    seen: dict[str, Any] = {}
    hook = "setup_context" if cls.setup_context is not torch.autograd.Function.setup_context else "forward"
    original = getattr(cls, hook)

    def saving(*args: Any) -> Any:
        out = original(*args)
        seen["to_save"] = bool(getattr(args[0], "to_save", None))  # args[0] is ctx in both hooks
        return out

    def jvp(ctx: Any, *tangents: Any) -> Any:
        seen["saved_for_forward"] = len(ctx.saved_tensors)
        return cls.jvp(ctx, *tangents)

    probe: Any = type(cls.__name__, (cls,), {hook: staticmethod(saving), "jvp": staticmethod(jvp)})
    t = values[checked[0]]
    try:
        with fwAD.dual_level():
            dual = fwAD.make_dual(t, torch.zeros_like(t))
            probe.apply(*[dual if v is t else v for v in values])
    except Exception:  # noqa: BLE001 - the failure itself is expected; only what was seen matters
        pass
    return seen.get("saved_for_forward") == 0 and bool(seen.get("to_save"))
