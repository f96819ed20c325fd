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
from typing import Any, Optional

import torch

from ..core.tolerance import ReferenceRule
from ..numerics import is_float_tensor, unravel
from ..results import CheckResult, ErrorKind, InputReport, Pattern
from ..sandbox.errors import BindError, UserCodeError, guarded
from ..subject.binding import Bound
from ..subject.oracle import Oracle
from .parts.base import CheckContext, differentiable, fresh_leaves, probe_like
from .parts.sides import Side, compare, eps, gradients, output_row, side
from .parts.verdict import begin, conclude, skip

STREAM = 30  # the random stream of the reference check's grad_outputs (a seed replays it)

REF = ErrorKind.REFERENCE  # the reference's errors: it cannot judge the target


def run(ctx: CheckContext) -> CheckResult:
    """``reference``: outputs and gradients of ``ctx.target`` against ``ctx.oracle``'s."""
    bound, oracle = ctx.bound, ctx.oracle
    start, rows, checked, result = begin(bound, "reference", None)
    if oracle is None:
        if ctx.named:
            raise BindError(
                "checks",
                "the reference check needs a reference: give the spec `reference: pkg.mod:fn` "
                "(a plain PyTorch implementation with the same signature) or "
                "`reference_backward: pkg.mod:fn` (the intended gradients), or --reference",
            )
        return skip(result, "no `reference:` or `reference_backward:` given", start)
    target = side(ctx.target, bound, bound.values, checked, "forward", eight_bit=True)  # no step through it
    positions = differentiable(target.outputs)
    gen = ctx.streams.generator(STREAM)
    probes = {p: _probe(target.outputs[p], gen) for p in positions}
    target.grads = gradients(target, probes, "backward")
    rule = _rule(ctx.tolerance.reference, bound, checked, target.outputs, oracle.dtype)
    high = _reference(oracle, bound, checked, probes, target.outputs, oracle.dtype)
    low = _reference(oracle, bound, checked, probes, target.outputs, None) if rule.rule == "relative" else None
    result.mode = rule.rule
    for k, i in enumerate(checked):
        compare(rows[i], target.grads[k], high.grads[k], low.grads[k] if low else None, rule, "gradient")
    notes: list[str] = []
    if oracle.forward is not None:
        rows += [
            output_row(p, target.outputs, high.outputs, low.outputs if low else None, rule)
            for p in range(len(target.outputs))
        ]
    else:
        notes.append("forward's outputs not compared (no `reference:`, only `reference_backward:`)")
    if any(r.pattern is Pattern.NONFINITE for r in rows):  # a non-finite value the other side does not share
        _finite(high, target, oracle, [bound.names[i] for i in checked])
    return conclude(
        result,
        start,
        [],
        _wrong,
        lambda right: _passed(right, rule, oracle),
        name_right=False,
        nothing="nothing to compare: no argument requires grad and no output",
        notes=notes,
    )


def _probe(t: torch.Tensor, gen: torch.Generator) -> torch.Tensor:
    """A signed random grad_output like ``t``: on a GPU ``drawn_there``'s (no output-sized tensor drawn on
    the host and copied over), else ``probe_like``'s."""
    if t.device.type == "cuda" and not t.is_complex():
        return drawn_there(t, gen)
    return probe_like(t, gen)


def drawn_there(t: torch.Tensor, gen: torch.Generator) -> torch.Tensor:
    """A probe like ``t`` (real), drawn on ``t``'s device from a generator of that device seeded from
    ``gen``: the distribution of ``probe_like``'s values (uniform on (-1, 1) in 2^16 steps), not the same draw."""
    seed = int(torch.randint(2**62, (1,), generator=gen))
    device_gen = torch.Generator(t.device).manual_seed(seed)
    bits = torch.randint(-(2**15), 2**15, t.shape, generator=device_gen, device=t.device, dtype=torch.int32)
    return centred(bits, t.dtype)


def centred(bits: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    """``(k + 0.5) / 2^15`` rounded to ``dtype``, for int32 ``bits`` k in [-2^15, 2^15): uniform on (-1, 1).

    k + 0.5 has at most 17 significant bits, so it is exact in float32; rounding it to ``dtype`` and then
    scaling by 2^-15 (exact: the smallest, 2^-16, is even a float16 subnormal's multiple) rounds the same
    value. Three passes of at most 4 bytes an element: a GPU draws a kernel-sized probe at memory speed."""
    halves = torch.add(bits, 0.5, out=torch.empty(bits.shape, dtype=torch.float32, device=bits.device))
    return halves.to(dtype).mul_(2**-15)


def _reference(
    oracle: Oracle,
    bound: Bound,
    checked: list[int],
    probes: dict[int, torch.Tensor],
    like: tuple[Any, ...],
    dtype: Optional[torch.dtype],
) -> Side:
    """The reference side on the inputs in ``dtype`` (None: as they are, the target's dtype): the
    reference's outputs (if it has a forward), and the gradients from ``reference_backward`` where
    given, else through the reference's graph."""
    values = _upcast(bound.values, dtype) if dtype else fresh_leaves(bound.values)
    probes = dict(zip(probes, _upcast(list(probes.values()), dtype))) if dtype else probes
    fn = oracle.forward if dtype else oracle.low
    written = str(dtype or "the target's dtype").replace("torch.", "")
    if fn is not None:
        what = f"reference {oracle.forward_path} (in {written})"
        ref = side(fn, bound, values, checked, what, REF, copied=True, eight_bit=True)
        _same_structure(ref.outputs, like, oracle.forward_path or "")
    else:
        ref = Side((), [values[i] for i in checked])
    if oracle.backward is None:
        cut = [p for p in probes if is_float_tensor(ref.outputs[p]) and not ref.outputs[p].requires_grad]
        if cut and ref.leaves:
            raise UserCodeError(
                REF,
                (
                    f"output {cut[0]} of the reference {oracle.forward_path} does not require grad, so it gives no "
                    "gradient to compare with (a .detach(), torch.no_grad() or a non-differentiable op inside?); "
                    "make it differentiable, or give the intended gradients with `reference_backward:`"
                ),
            )
        ref.grads = gradients(ref, probes, f"backward of the reference {oracle.forward_path} (in {written})", REF)
        return ref
    zeros = (
        _upcast([torch.zeros_like(o.detach()) if is_float_tensor(o) else None for o in like], dtype)
        if dtype
        else [torch.zeros_like(o.detach()) if is_float_tensor(o) else None for o in like]
    )
    grad_outputs = tuple(probes.get(p, z) for p, z in enumerate(zeros))
    ref.grads = _intended(
        oracle, bound, values, checked, grad_outputs, f"reference_backward {oracle.backward_path} (in {written})"
    )
    return ref


def _intended(
    oracle: Oracle,
    bound: Bound,
    values: list[Any],
    checked: list[int],
    grad_outputs: tuple[Optional[torch.Tensor], ...],
    what: str,
) -> list[torch.Tensor]:
    """``reference_backward(inputs, grad_outputs)``: one gradient per argument (None: zeros), as a
    backward returns them; grad_outputs has one entry per output (zeros where none flows, None for
    a non-floating output). A ``list:`` or ``dict:`` argument comes as a list or dict, and takes a
    list or dict of gradients."""
    assert oracle.backward is not None
    plain = tuple(bound.assemble([v.detach() if isinstance(v, torch.Tensor) else v for v in values]))
    out = guarded(REF, what, oracle.backward, plain, grad_outputs)
    grads = [out] if isinstance(out, torch.Tensor) else list(out) if isinstance(out, (tuple, list)) else None
    if grads is not None and len(grads) == len(plain):
        try:
            grads = bound.flatten(grads)
        except ValueError as exc:
            raise BindError(
                "reference_backward",
                f"the gradients {oracle.backward_path} returned: {exc}; return those "
                "of a list or dict argument as a list or dict like it",
            ) from None
    elif grads is not None and bound.places:
        grads = None  # a count that is not the call's
    values = bound.flatten(plain)
    if grads is None or len(grads) != len(values):
        got = (
            f"{len(out)} value{'s' * (len(out) != 1)}" if isinstance(out, (tuple, list)) else f"a {type(out).__name__}"
        )
        lists = " (a list or dict of gradients for a `list:` or `dict:` argument)" if bound.places else ""
        raise BindError(
            "reference_backward",
            f"{oracle.backward_path} returned {got} for {len(plain)} "
            f"argument{'s' * (len(plain) != 1)} ({', '.join(bound.names)}): return one gradient per "
            f"argument{lists}, in order (None where there is none), as a backward does",
        )
    result: list[torch.Tensor] = []
    for i in checked:
        g, v = grads[i], values[i]
        if g is None:
            result.append(torch.zeros_like(v))
        elif not isinstance(g, torch.Tensor) or g.shape != v.shape:
            shape = list(g.shape) if isinstance(g, torch.Tensor) else type(g).__name__
            raise UserCodeError(REF, f"{what} returned {shape} for '{bound.names[i]}', which has shape {list(v.shape)}")
        elif not g.is_floating_point() and not g.is_complex() or g.is_complex() != v.is_complex():
            raise UserCodeError(
                REF,
                f"{what} returned a {str(g.dtype)[6:]} gradient for '{bound.names[i]}', which is "
                f"{str(v.dtype)[6:]}: return a gradient of the argument's kind (floating or "
                "complex)",
            )
        else:
            result.append(g.detach())
    return result


def _complex_of(dtype: torch.dtype) -> torch.dtype:
    return {torch.float64: torch.complex128, torch.float32: torch.complex64}.get(dtype, torch.complex64)


def _upcast(values: Sequence[Any], dtype: torch.dtype) -> list[Any]:
    """Copies of the tensors, the floating ones in ``dtype`` (complex ones in its complex kind), the others
    in theirs (a reference that changes an argument in place changes its copy), aliasing and requires_grad
    kept; other values as they are."""
    copies: dict[int, Any] = {}
    out = []
    for v in values:
        if isinstance(v, torch.Tensor):
            if id(v) not in copies:
                kind = (_complex_of(dtype) if v.is_complex() else dtype) if is_float_tensor(v) else v.dtype
                copies[id(v)] = v.detach().to(kind, copy=True).requires_grad_(v.requires_grad)
            out.append(copies[id(v)])
        else:
            out.append(v)
    return out


def _same_structure(got: tuple[Any, ...], want: tuple[Any, ...], path: str) -> None:
    """The reference returns as many outputs as the target, each tensor of the same shape, and of the same
    kind (floating, complex) where the target's is floating or complex."""
    if len(got) != len(want):
        raise UserCodeError(
            REF,
            f"the reference {path} returned {len(got)} output{'s' * (len(got) != 1)}, the "
            f"target {len(want)}: they must match",
        )
    for p, (g, w) in enumerate(zip(got, want)):
        if isinstance(w, torch.Tensor) and (not isinstance(g, torch.Tensor) or g.shape != w.shape):
            shape = list(g.shape) if isinstance(g, torch.Tensor) else type(g).__name__
            raise UserCodeError(
                REF, f"output {p} of the reference {path} is {shape}, the target's is {list(w.shape)}: they must match"
            )
        if is_float_tensor(w) and (not is_float_tensor(g) or g.is_complex() != w.is_complex()):
            raise UserCodeError(
                REF,
                f"output {p} of the reference {path} is {str(g.dtype)[6:]}, the target's is "
                f"{str(w.dtype)[6:]}: a reference returns values of the same kind (floating or "
                "complex) to compare with",
            )


def _finite(ref: Side, target: Side, oracle: Oracle, names: list[str]) -> None:
    """A reference whose outputs or gradients are NaN or infinite where the target's are finite cannot
    judge it: an error about the reference (equal non-finite values agree, and the target's own
    non-finite values are its failure, found by the comparison). Asked only where a comparison found
    non-finite values on one side (pattern ``nonfinite``): a pair whose values are all finite costs no pass."""
    pairs = [
        (f"output {p} of the reference {oracle.forward_path}", r, t)
        for p, (r, t) in enumerate(zip(ref.outputs, target.outputs))
        if is_float_tensor(r) and is_float_tensor(t)
    ]
    path = oracle.backward_path or f"backward of the reference {oracle.forward_path}"
    pairs += [(f"the gradient of '{name}' from {path}", r, t) for name, r, t in zip(names, ref.grads, target.grads)]
    for what, r, t in pairs:
        bad = ~torch.isfinite(r.detach()) & torch.isfinite(t.detach()).to(r.device)
        if bool(bad.any()):
            at = unravel(int(bad.reshape(-1).nonzero()[0]), tuple(r.shape))
            raise UserCodeError(
                REF,
                f"{what} is NaN or infinite at {list(at)} where the target's is finite "
                f"({int(bad.sum())} of {r.numel()} values): a reference must be finite there to "
                "judge the target; check it on these inputs, or draw other inputs",
            )


def _rule(
    given: ReferenceRule, bound: Bound, checked: list[int], outputs: tuple[Any, ...], dtype: torch.dtype
) -> ReferenceRule:
    """The rule with its default: relative where the target runs in a lower precision than the reference."""
    if given.rule is not None:
        return given
    tensors = [bound.values[i] for i in checked] + [o for o in outputs if is_float_tensor(o)]
    lower = any(eps(t.dtype) > eps(dtype) for t in tensors)
    return ReferenceRule("relative" if lower else "allclose", given.factor, given.atol, given.rtol)


def _wrong(row: InputReport) -> Optional[str]:
    what = "output" if row.role == "output" else "gradient"
    subject = row.name if row.role == "output" else f"{what} of '{row.name}'"
    words = row.diagnosis or "differs from the reference's"
    if row.factor is not None and row.baseline_err is not None and row.max_abs_err is not None:
        times = row.max_abs_err / row.baseline_err if row.baseline_err else math.inf
        words += (
            f" (max error {row.max_abs_err:.3g}, {times:.3g}x the reference's own {row.baseline_err:.3g} in "
            f"{row.dtype}; at most {row.factor:g}x allowed)"
        )
    return f"{subject}: {words}"


def _passed(right: list[InputReport], rule: ReferenceRule, oracle: Oracle) -> str:
    grads = sum(r.role != "output" for r in right)
    outs = len(right) - grads
    parts = [f"{n} {w}{'s' * (n != 1)}" for n, w in ((grads, "gradient"), (outs, "output")) if n]
    verb = "agrees" if len(right) == 1 else "agree"
    side = oracle.forward_path or oracle.backward_path
    how = (
        f"within {rule.factor:g}x the reference's own error in the target's dtype"
        if rule.rule == "relative"
        else "within atol/rtol"
    )
    worst = [r.max_abs_err / r.baseline_err for r in right if r.baseline_err and r.max_abs_err is not None]
    return f"{' and '.join(parts)} {verb} with {side} ({rule.rule}: {how}" + (
        f"; worst {max(worst):.2g}x)" if worst else ")"
    )
