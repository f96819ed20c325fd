"""The ``reference`` check: the target against a reference implementation, for kernels (low
precision, real sizes) and for intended, non-derivative gradients (``reference_backward``).

One forward and one backward per side, for one shared signed random grad_output per output, so it
runs at kernel sizes where finite differences cannot. Compared: every forward output and every
argument's gradient (module parameters included), each by the rule of ``tolerance.reference``:

- ``relative`` (flash-attention's): ``max|target - ref| <= factor * baseline + atol``. ``ref`` is the
  reference run on copies of the inputs in ``reference_dtype``; ``baseline`` is the reference's own
  max error when run on the target's inputs as they are (in the target's dtype), and at least one
  rounding unit of the target's dtype at ``ref``'s largest magnitude (an exact low-precision
  reference asks for no exactness that the dtype does not have).
- ``allclose``: ``|target - ref| <= atol + rtol * |ref|`` elementwise, per-dtype defaults
  (torch.testing.assert_close's).

The default is ``relative`` where the target runs in a lower precision than the reference, else
``allclose`` (a baseline of a float64 target against a float64 reference is 0).
"""
from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any, Optional

import torch

from ..binding import Bound
from ..errors import BindError, UserCodeError, guarded
from ..numerics import as_tuple, is_float_tensor, unravel, vjp
from ..numerics.maps import per_element
from ..oracle import Oracle
from ..results import CheckResult, ErrorKind, InputReport, Pattern, Status
from ..rng import Stream, generator
from ..spec import ReferenceRule
from ..target import Target
from .base import CheckContext, call_forward, differentiable, fresh_leaves, probe_like
from .diagnosis import Diagnosis, ratio_text
from .rows import dtype_name, locate
from .verdict import begin, conclude, skip

ALLCLOSE = {torch.float64: (1e-7, 1e-7), torch.float32: (1.3e-6, 1e-5), torch.float16: (1e-3, 1e-3),
            torch.bfloat16: (1.6e-2, 1e-2)}  # dtype -> (rtol, atol) of rule allclose: torch.testing.assert_close's
# rtol; in half precision an atol of a few units at magnitude 1, as kernel suites (Liger) use: a kernel
# rounds its intermediates, so its error near a zero of the result is that of the values around it


@dataclass
class Side:
    """One side's outputs, its leaves of the checked arguments, and their gradients."""

    outputs: tuple[Any, ...]
    leaves: list[torch.Tensor]
    grads: list[torch.Tensor] = field(default_factory=list)


def run(ctx: CheckContext) -> CheckResult:
    """``reference``: outputs and gradients of ``ctx.target`` against ``ctx.oracle``'s."""
    bound, oracle = ctx.bound, ctx.oracle
    start, rows, checked, result = begin(bound, "reference", None)
    if oracle is None:
        if ctx.named:
            raise BindError("checks", "the reference check needs a reference: give the spec `reference: pkg.mod:fn` "
                                      "(a plain PyTorch implementation with the same signature) or "
                                      "`reference_backward: pkg.mod:fn` (the intended gradients), or --reference")
        return skip(result, "no `reference:` or `reference_backward:` given", start)
    target = _side(ctx.target, bound, bound.values, checked, "forward")
    positions = differentiable(target.outputs)
    gen = generator(ctx.options.seed, Stream.REFERENCE)
    probes = {p: probe_like(target.outputs[p], gen) for p in positions}
    target.grads = _gradients(target, probes, "backward")
    rule = _rule(ctx.tolerance.reference, bound, checked, target.outputs, oracle.dtype)
    high = _reference(oracle, bound, checked, probes, target.outputs, oracle.dtype)
    low = _reference(oracle, bound, checked, probes, target.outputs, None) if rule.rule == "relative" else None
    result.mode = rule.rule
    for k, i in enumerate(checked):
        _compare(rows[i], target.grads[k], high.grads[k], low.grads[k] if low else None, rule, "gradient")
    notes: list[str] = []
    if oracle.forward is not None:
        rows += [_output_row(p, target.outputs, high.outputs, low.outputs if low else None, rule)
                 for p in range(len(target.outputs))]
    else:
        notes.append("forward's outputs not compared (no `reference:`, only `reference_backward:`)")
    return conclude(result, start, [], _wrong, lambda right: _passed(right, rule, oracle), name_right=False,
                    nothing="nothing to compare: no argument requires grad and no output", notes=notes)


def _side(fn: Target, bound: Bound, values: Sequence[Any], checked: list[int], what: str) -> Side:
    """``fn``'s outputs on fresh leaves of ``values`` (gradients to come)."""
    leaves = fresh_leaves(list(values))
    outputs = as_tuple(call_forward(fn, bound, leaves, what=what))
    return Side(outputs, [leaves[i] for i in checked])


def _gradients(side: Side, probes: dict[int, torch.Tensor], what: str) -> list[torch.Tensor]:
    """The checked arguments' gradients for grad_outputs ``probes`` (output position -> probe),
    zeros where unused."""
    live = [(side.outputs[p], g.to(side.outputs[p].dtype)) for p, g in probes.items()
            if is_float_tensor(side.outputs[p]) and side.outputs[p].requires_grad]
    if not live or not side.leaves:
        return [torch.zeros_like(x) for x in side.leaves]
    grads = guarded(ErrorKind.BACKWARD, what, vjp, [o for o, _ in live], side.leaves, [g for _, g in live])
    return [torch.zeros_like(x) if g is None else g for g, x in zip(grads, side.leaves)]


def _reference(oracle: Oracle, bound: Bound, checked: list[int], probes: dict[int, torch.Tensor],
               like: tuple[Any, ...], dtype: Optional[torch.dtype]) -> Side:
    """The reference side on the inputs in ``dtype`` (None: as they are, the target's dtype): the
    reference's outputs (if it has a forward), and the gradients from ``reference_backward`` where
    given, else through the reference's graph."""
    values = _upcast(bound.values, dtype) if dtype else fresh_leaves(bound.values)
    probes = dict(zip(probes, _upcast(list(probes.values()), dtype))) if dtype else probes
    fn = oracle.forward if dtype else oracle.low
    written = str(dtype or "the target's dtype").replace("torch.", "")
    if fn is not None:
        side = _side(fn, bound, values, checked, f"reference {oracle.forward_path} (in {written})")
        _same_structure(side.outputs, like, oracle.forward_path or "")
    else:
        side = Side((), [values[i] for i in checked])
    if oracle.backward is None:
        cut = [p for p in probes if is_float_tensor(side.outputs[p]) and not side.outputs[p].requires_grad]
        if cut and side.leaves:
            raise UserCodeError(ErrorKind.FORWARD, (
                f"output {cut[0]} of the reference {oracle.forward_path} does not require grad, so it gives no "
                "gradient to compare with (a .detach(), torch.no_grad() or a non-differentiable op inside?); "
                "make it differentiable, or give the intended gradients with `reference_backward:`"))
        side.grads = _gradients(side, probes, f"backward of the reference {oracle.forward_path} (in {written})")
        return side
    zeros = _upcast([torch.zeros_like(o.detach()) if is_float_tensor(o) else None for o in like], dtype) if dtype \
        else [torch.zeros_like(o.detach()) if is_float_tensor(o) else None for o in like]
    grad_outputs = tuple(probes.get(p, z) for p, z in enumerate(zeros))
    side.grads = _intended(oracle, bound, values, checked, grad_outputs, f"reference_backward "
                           f"{oracle.backward_path} (in {written})")
    return side


def _intended(oracle: Oracle, bound: Bound, values: list[Any], checked: list[int],
              grad_outputs: tuple[Optional[torch.Tensor], ...], what: str) -> list[torch.Tensor]:
    """``reference_backward(inputs, grad_outputs)``: one gradient per argument (None: zeros), as a
    backward returns them; grad_outputs has one entry per output (zeros where none flows, None for
    a non-floating output)."""
    assert oracle.backward is not None
    plain = tuple(v.detach() if isinstance(v, torch.Tensor) else v for v in values)
    out = guarded(ErrorKind.BACKWARD, what, oracle.backward, plain, grad_outputs)
    grads = [out] if isinstance(out, torch.Tensor) else list(out) if isinstance(out, (tuple, list)) else None
    if grads is None or len(grads) != len(values):
        got = (f"{len(grads)} value{'s' * (len(grads) != 1)}" if grads is not None
               else f"a {type(out).__name__}")
        raise BindError("reference_backward", f"{oracle.backward_path} returned {got} for {len(values)} "
                        f"argument{'s' * (len(values) != 1)} ({', '.join(bound.names)}): return one gradient per "
                        "argument, in order (None where there is none), as a backward does")
    result: list[torch.Tensor] = []
    for i in checked:
        g, v = grads[i], values[i]
        if g is None:
            result.append(torch.zeros_like(v))
        elif not isinstance(g, torch.Tensor) or g.shape != v.shape:
            shape = list(g.shape) if isinstance(g, torch.Tensor) else type(g).__name__
            raise UserCodeError(ErrorKind.BACKWARD, f"{what} returned {shape} for '{bound.names[i]}', which has "
                                                    f"shape {list(v.shape)}")
        else:
            result.append(g.detach())
    return result


def _complex_of(dtype: torch.dtype) -> torch.dtype:
    return {torch.float64: torch.complex128, torch.float32: torch.complex64}.get(dtype, torch.complex64)


def _upcast(values: Sequence[Any], dtype: torch.dtype) -> list[Any]:
    """Copies of the floating tensors in ``dtype`` (complex ones in its complex kind), aliasing and
    requires_grad kept; other values as they are."""
    copies: dict[int, Any] = {}
    out = []
    for v in values:
        if is_float_tensor(v):
            if id(v) not in copies:
                cast = v.detach().to(_complex_of(dtype) if v.is_complex() else dtype, copy=True)
                copies[id(v)] = cast.requires_grad_(v.requires_grad)
            out.append(copies[id(v)])
        else:
            out.append(v)
    return out


def _same_structure(got: tuple[Any, ...], want: tuple[Any, ...], path: str) -> None:
    """The reference returns as many outputs as the target, each tensor of the same shape."""
    if len(got) != len(want):
        raise UserCodeError(ErrorKind.FORWARD, f"the reference {path} returned {len(got)} output"
                                               f"{'s' * (len(got) != 1)}, the target {len(want)}: they must match")
    for p, (g, w) in enumerate(zip(got, want)):
        if isinstance(w, torch.Tensor) and (not isinstance(g, torch.Tensor) or g.shape != w.shape):
            shape = list(g.shape) if isinstance(g, torch.Tensor) else type(g).__name__
            raise UserCodeError(ErrorKind.FORWARD, f"output {p} of the reference {path} is {shape}, the target's "
                                                   f"is {list(w.shape)}: they must match")


def _rule(given: ReferenceRule, bound: Bound, checked: list[int], outputs: tuple[Any, ...],
          dtype: torch.dtype) -> ReferenceRule:
    """The rule with its default: relative where the target runs in a lower precision than the reference."""
    if given.rule is not None:
        return given
    tensors = [bound.values[i] for i in checked] + [o for o in outputs if is_float_tensor(o)]
    lower = any(_eps(t.dtype) > _eps(dtype) for t in tensors)
    return ReferenceRule("relative" if lower else "allclose", given.factor, given.atol, given.rtol)


def _eps(dtype: torch.dtype) -> float:
    return torch.finfo(dtype).eps


def _compare(row: InputReport, got: torch.Tensor, want: torch.Tensor, own: Optional[torch.Tensor],
             rule: ReferenceRule, what: str) -> None:
    """Fill ``row`` with the target's ``got`` against the reference's ``want`` (and, for rule
    relative, the reference's own ``own`` in the target's dtype). Elementwise, in float64 on the CPU
    (complex as pairs of reals); equal non-finite values agree."""
    a, n = _real64(got), _real64(want)
    real = _real_dtype(got)
    if rule.rule == "relative":
        assert own is not None
        baseline = _max_abs(_real64(own) - n)
        row.baseline_err, row.factor = max(baseline, _eps(real) * _max_abs(n)), rule.factor
        row.atol, row.rtol = rule.atol or 0.0, None
        atol, rtol = rule.factor * row.baseline_err + row.atol, 0.0
    else:
        coarser = max(real, _real_dtype(want), key=_eps)  # a reference in a lower precision sets the defaults
        rtol, atol = ALLCLOSE.get(coarser, ALLCLOSE[torch.float32])
        row.rtol = rtol = rule.rtol if rule.rtol is not None else rtol
        row.atol = atol = rule.atol if rule.atol is not None else atol
    diff = torch.sub(a, n).abs_()
    broken = torch.zeros(0, dtype=torch.bool)
    if a.numel() and not math.isfinite(float(diff.max())):  # rare: the non-finite values apart
        finite = torch.isfinite(a) & torch.isfinite(n)
        broken = ~finite & ~((a == n) | (a.isnan() & n.isnan()))  # NaN against NaN, inf against inf agree
        a, n = torch.where(finite, a, 0.0), torch.where(finite, n, 0.0)
        diff = torch.sub(a, n).abs_()
    scale = n.abs()
    tol: Any = scale * rtol + atol if rtol else atol  # the relative rule's bound is one number
    bad = diff > tol
    if broken.numel():
        bad |= broken
    per = 2 if got.is_complex() else 1
    row.mismatched = int(bad.view(-1, per).any(1).sum()) if per == 2 else int(torch.count_nonzero(bad))
    if not a.numel():
        return
    row.max_abs_err = float(diff.max())
    big = scale > atol  # relative error only where the reference is not ~0
    rel = diff.div(scale).masked_fill_(~big, 0.0)
    row.max_rel_err = float(rel.max()) if bool(big.any()) else None
    excess = diff - tol
    if broken.numel():
        excess.masked_fill_(broken, math.inf)
    k = int(torch.argmax(excess))
    row.worst_index = unravel(k // per, tuple(got.shape))
    row.analytical, row.numerical = float(a[k]), float(n[k])
    if row.mismatched:
        row.status = Status.FAIL
        shape, complex_ = tuple(got.shape), got.is_complex()
        sides = ("the gradients for one random grad_output" if what == "gradient" else "the outputs") + \
            ": the target's, the reference's"
        error = diff.masked_fill(broken, math.inf) if broken.numel() else diff
        locate(row, per_element(bad, complex_), per_element(error, complex_), shape,
               None if complex_ else (a, n, sides))
        tol_t = tol if isinstance(tol, torch.Tensor) else torch.full_like(diff, tol)
        _pattern(a, n, tol_t, int(broken.sum()), row.mismatched, row.numel, what).put(row)
        if row.pattern in (Pattern.SOME_ELEMENTS, Pattern.NO_PATTERN):
            row.diagnosis = "; ".join(filter(None, [row.diagnosis, _coarser(rel[big], real)]))


def _coarser(rel: torch.Tensor, dtype: torch.dtype) -> Optional[str]:
    """Relative errors typical of rounding to a lower precision than ``dtype``: say which (a target that
    computes in bfloat16 inside, given float64)."""
    if not rel.numel():
        return None
    typical = float(rel.median())  # rounding to a dtype makes a median relative error of about eps / 4
    lower = [d for d in (torch.float32, torch.float16, torch.bfloat16) if _eps(d) > _eps(dtype)]
    if not lower or not typical > 0:
        return None
    low = min(lower, key=lambda d: abs(math.log(typical / (_eps(d) / 4))))
    if abs(math.log(typical / (_eps(low) / 4))) > math.log(4):
        return None
    name = str(low).replace("torch.", "")
    return (f"its typical relative error {typical:.1g} is {name}'s rounding: does it compute in {name} inside? "
            f"Check it in {name} (`dtype: {name}`), where the reference's own error sets the bar")


def _real_dtype(t: torch.Tensor) -> torch.dtype:
    return t.real.dtype if t.is_complex() else t.dtype


def _real64(t: torch.Tensor) -> torch.Tensor:
    """``t`` flattened as float64 on the CPU, a complex element as two reals."""
    t = t.detach().resolve_conj().cpu()
    return (torch.view_as_real(t) if t.is_complex() else t).reshape(-1).to(torch.float64)


def _max_abs(t: torch.Tensor) -> float:
    return float(t.abs().max()) if t.numel() else 0.0


def _pattern(a: torch.Tensor, n: torch.Tensor, tol: torch.Tensor, nonfinite: int, mismatched: int, numel: int,
             what: str) -> Diagnosis:
    """What a mismatch of ``a`` (the target's ``what``) against ``n`` (the reference's) shows:
    non-finite values, all zeros, a constant factor up to what the rule allows, a few elements, or nothing."""
    mine, theirs = f"the target's {what}", "the reference's"
    if nonfinite:
        return Diagnosis(Pattern.NONFINITE, f"{nonfinite} values are NaN or infinite on one side only")
    aa, nn, an = float(a @ a), float(n @ n), float(a @ n)
    if aa == 0 and nn > 0:
        culprit = ("backward returns zeros or None for it (a missing return, a detached result, or the wrong "
                   "position in the returned tuple?)" if what == "gradient" else "forward returns zeros")
        return Diagnosis(Pattern.ZERO_ANALYTICAL, f"{mine} is all zeros, {theirs} is not: {culprit}")
    if nn == 0 and aa > 0:
        return Diagnosis(Pattern.ZERO_NUMERICAL, f"{theirs} {what} is all zeros, {mine} is not")
    # to 10 digits: the sums' order, and so their last bits, follow torch's thread count, and a report is
    # the same for any number of workers
    r = float(f"{an / nn:.10g}") if nn else 0.0
    if r and bool(((a - r * n).abs() <= tol * max(1.0, abs(r))).all()):
        if abs(r + 1) < 1e-2:
            return Diagnosis(Pattern.SIGN_FLIP, f"sign flipped: {mine} = -{theirs}", r)
        return Diagnosis(Pattern.CONSTANT_RATIO, f"{mine} is {ratio_text(r, 1e-2)} {theirs}", r)
    if mismatched < numel:
        return Diagnosis(Pattern.SOME_ELEMENTS, f"{mismatched} of {numel} elements differ from {theirs}, "
                                                "the others match")
    return Diagnosis(Pattern.NO_PATTERN, f"differs from {theirs} everywhere, with no constant ratio or sign flip")


def _output_row(p: int, got: tuple[Any, ...], want: tuple[Any, ...], own: Optional[tuple[Any, ...]],
                rule: ReferenceRule) -> InputReport:
    """Forward output ``p`` of the target against the reference's."""
    o = got[p]
    name = "output" if len(got) == 1 else f"output[{p}]"
    if not is_float_tensor(o):
        return InputReport(p, name, list(getattr(o, "shape", [])), dtype_name(o) if isinstance(o, torch.Tensor)
                           else type(o).__name__, Status.SKIP, reason="not a floating-point output (not compared)",
                           role="output")
    row = InputReport(p, name, list(o.shape), dtype_name(o), Status.PASS, numel=o.numel(), role="output")
    _compare(row, o, want[p], own[p] if own else None, rule, "output")
    return row


def _wrong(row: InputReport) -> Optional[str]:
    what = "output" if row.role == "output" else "gradient"
    subject = row.name if row.role == "output" else f"{what} of '{row.name}'"
    words = row.diagnosis or "differs from the reference's"
    if row.factor is not None and row.baseline_err is not None and row.max_abs_err is not None:
        times = row.max_abs_err / row.baseline_err if row.baseline_err else math.inf
        words += (f" (max error {row.max_abs_err:.3g}, {times:.3g}x the reference's own {row.baseline_err:.3g} in "
                  f"{row.dtype}; at most {row.factor:g}x allowed)")
    return f"{subject}: {words}"


def _passed(right: list[InputReport], rule: ReferenceRule, oracle: Oracle) -> str:
    grads = sum(r.role != "output" for r in right)
    outs = len(right) - grads
    parts = [f"{n} {w}{'s' * (n != 1)}" for n, w in ((grads, "gradient"), (outs, "output")) if n]
    verb = "agrees" if len(right) == 1 else "agree"
    side = oracle.forward_path or oracle.backward_path
    how = (f"within {rule.factor:g}x the reference's own error in the target's dtype" if rule.rule == "relative"
           else "within atol/rtol")
    worst = [r.max_abs_err / r.baseline_err for r in right if r.baseline_err and r.max_abs_err is not None]
    return (f"{' and '.join(parts)} {verb} with {side} ({rule.rule}: {how}"
            + (f"; worst {max(worst):.2g}x)" if worst else ")"))



# shared with the compile check, which compares compiled against eager as this check compares against a reference
compare, gradients, output_row, side = _compare, _gradients, _output_row, _side
