"""The ``backward`` check: backward's contract, then the Jacobian entry by entry, then determinism."""
from __future__ import annotations

import math
import time
from dataclasses import dataclass, replace
from typing import Any

import torch

from ..diagnosis import conjugate, describe, systematic
from ..loader import Bound, Target
from ..numerics import Entry, Layout, as_tuple, compare, is_float_tensor, probe_generator, real_numel, unravel, vjp
from ..numerics import kinks, probes
from ..plan import MEMORY_BYTES
from ..results import CheckResult, InputReport, Status
from ..spec import Tolerance
from . import UserCodeError, call_forward, contract, guarded
from .devices import memory_problem

REFERENCE = {torch.float32: torch.float64, torch.float16: torch.float64, torch.bfloat16: torch.float64,
             torch.complex64: torch.complex128}  # the dtype finite differences are taken in
SYSTEMATIC = {torch.float16: 1e-2, torch.bfloat16: 5e-2}  # |ratio - 1| worth a warning; 1e-4 otherwise
LOW_TOLERANCE = {torch.float32: (1e-4, 1e-3, 1e-3), torch.complex64: (1e-4, 1e-3, 1e-3),
                 torch.float16: (1e-2, 1e-2, 1e-2), torch.bfloat16: (5e-2, 5e-2, 5e-2)}
# (atol, rtol) unless the spec sets them; eps for finite differences in the low dtype itself


@dataclass
class Options:
    tolerance: Tolerance
    seed: int = 0
    memory_bytes: int = MEMORY_BYTES
    probes: int = 0  # > 0: decide with this many signed random probes, element by element only if one fails
    repeat: int = 3  # backward calls with the same grad_output that must agree


def run(target: Target, bound: Bound, opts: Options) -> CheckResult:
    """Check backward of ``target`` called with ``bound`` arguments. User errors raise UserCodeError."""
    start = time.perf_counter()
    tol = opts.tolerance
    gen = probe_generator(opts.seed, 1)
    reports = _skeleton(bound)
    checked = _checked_positions(bound, reports)
    result = CheckResult("backward", Status.PASS, mode="elementwise", inputs=reports)
    found = (contract.inspect(target, bound, gen, tol.nondet_tol, opts.repeat) if target.is_function
             else contract.Findings())
    result.warnings += found.warnings
    if found.fatal:
        for i in checked:
            reports[i].status, reports[i].reason = Status.SKIP, "backward's contract is broken (see below)"
        return _finish(result, found, [], start)

    if found.graph:  # the contract's forward, reused: backward's raw calls left its graph as it was
        leaves, outputs = found.graph
    else:
        leaves = contract.fresh_leaves(bound.values)
        outputs = as_tuple(call_forward(target, bound, leaves))
    device = next((str(v.device) for v in bound.values if isinstance(v, torch.Tensor)), "cpu")
    refusal = memory_problem(bound, outputs, device)
    if refusal:
        raise UserCodeError("out_of_memory", refusal)
    positions = [p for p, o in enumerate(outputs) if is_float_tensor(o) and o.requires_grad]
    if not positions:
        positions = [p for p, o in enumerate(outputs) if is_float_tensor(o)]
        result.warnings.append("no output requires grad: checking that the outputs do not depend on the inputs")
    forward = lambda vals: call_forward(target, bound, vals)  # noqa: E731
    # what vmap may batch: a generated vmap rule runs forward itself under vmap, so forward is called
    # directly (apply's vmap machinery costs more than the forward of a 128 x 128 Linear layer)
    batched = forward if not target.is_function or target.own_vmap else target.body
    plain, tol, notes = _reference(forward, contract.fresh_leaves(bound.values, grad=False), bound, checked, tol)
    result.warnings += notes
    backward = lambda *args: guarded("backward", "backward", vjp, *args)  # noqa: E731
    grad_inputs, plain_inputs = [leaves[i] for i in checked], [plain[i] for i in checked]
    # backward's contract call is one probe, as autograd passes its values on; a tensor passed twice
    # gets the sum of its two gradients from autograd, so not there
    tensors = [v for v in bound.values if isinstance(v, torch.Tensor)]
    given = ((found.probe[0], [found.probe[1][i] for i in checked])
             if found.probe and len({id(t) for t in tensors}) == len(tensors) else None)
    todo = (_probe(result, checked, bound, (forward, batched, backward, given), outputs, positions, grad_inputs,
                   plain, plain_inputs, replace(opts, tolerance=tol)) if opts.probes else list(range(len(checked))))
    if todo:  # element by element: every argument, or under --fast those whose probes failed
        layout, entries = compare(forward, outputs, positions, [grad_inputs[k] for k in todo], plain,
                                  [plain_inputs[k] for k in todo], eps=tol.eps, atol=tol.atol, rtol=tol.rtol,
                                  memory_bytes=opts.memory_bytes, grad=backward, seed=opts.seed, batched=batched)
        for k, entry in zip(todo, entries):
            i = checked[k]
            _fill(reports[i], entry, layout, bound.values[i], outputs)
            _reexamine(reports[i], entry, forward, plain, plain_inputs[k], positions, tol)
    nondeterministic = [] if found.repeated else _determinism(  # the contract compared its repeated calls
        outputs, positions, grad_inputs, [bound.names[i] for i in checked], gen, tol.nondet_tol, opts.repeat)
    return _finish(result, found, nondeterministic, start)


def _probe(result: CheckResult, checked: list[int], bound: Bound, calls: tuple[Any, Any, Any, Any], outputs: tuple,
           positions: list[int], grad_inputs: list[torch.Tensor], plain: list[Any],
           plain_inputs: list[torch.Tensor], opts: Options) -> list[int]:
    """The fast decision: the rows of the arguments whose probes all passed are filled; returned are
    the others (indices into ``checked``), to compare element by element. ``calls``: forward, the
    forward that vmap may batch (or None), backward, and (grad_outputs, gradients of the checked
    arguments) of one backward call already made (or None)."""
    tol = opts.tolerance
    forward, batched, backward, given = calls
    at_x = all(p.dtype == g.dtype for p, g in zip(plain_inputs, grad_inputs))  # not taken in another dtype
    stats = probes.decide(forward, outputs, positions, grad_inputs, plain, plain_inputs, eps=tol.eps,
                          atol=tol.atol, rtol=tol.rtol, probes=opts.probes, seed=opts.seed, grad=backward,
                          batched=batched, given=given, at_x=at_x)
    failed = [k for k, s in enumerate(stats) if s.failed]
    if failed:
        names = ", ".join(repr(bound.names[checked[k]]) for k in failed)
        result.warnings.append(f"a random probe failed for {names}: checked element by element to explain it")
    result.mode = "probe" if not failed else "elementwise" if len(failed) == len(stats) else "probe+elementwise"
    for i, s in zip(checked, stats):
        if not s.failed:
            row = result.inputs[i]
            row.max_abs_err, row.atol, row.rtol = s.max_abs, tol.atol, tol.rtol
            row.analytical, row.numerical = s.analytical, s.numerical
            row.reason = f"{s.probes} random probes v^T J u agree"
    return failed


def _skeleton(bound: Bound) -> list[InputReport]:
    """One row per argument, before anything is compared."""
    rows = []
    for name, index, v in zip(bound.names, bound.indices, bound.values):
        if isinstance(v, torch.Tensor):
            row = InputReport(index, name, list(v.shape), str(v.dtype)[6:], Status.PASS, numel=v.numel())
        else:
            row = InputReport(index, name, [], type(v).__name__, Status.SKIP,  # shape [] = not a tensor
                              reason=f"not a tensor ({_short(v)})")
        rows.append(row)
    return rows


def _checked_positions(bound: Bound, reports: list[InputReport]) -> list[int]:
    """Arguments whose gradient is compared; mark the others as not checked, with the reason."""
    checked: list[int] = []
    seen: dict[int, int] = {}
    for i, v in enumerate(bound.values):
        if not isinstance(v, torch.Tensor):
            continue
        if id(v) in seen:
            reports[i].status = Status.SKIP
            reports[i].reason = f"same tensor as '{bound.names[seen[id(v)]]}' (checked there)"
        elif not v.requires_grad:
            reports[i].status = Status.SKIP
            reports[i].reason = "requires_grad is false" if is_float_tensor(v) else "not a floating-point tensor"
        else:
            seen[id(v)] = i
            checked.append(i)
    return checked


def _reference(forward: Any, plain: list[Any], bound: Bound, checked: list[int],
               tol: Tolerance) -> tuple[list[Any], Tolerance, list[str]]:
    """Finite differences of a low-precision Function are taken in double precision (its forward
    run on float64/complex128 copies), with tolerances for the low dtype unless the spec set its
    own. If forward fails in double precision, they are taken in the low dtype with a larger step."""
    low = [i for i in checked if bound.values[i].dtype in REFERENCE]
    if not low:
        return plain, tol, []
    names = ", ".join(repr(bound.names[i]) for i in low)
    dtypes = ", ".join(sorted({str(bound.values[i].dtype)[6:] for i in low}))
    subject = f"{names} {'is' if len(low) == 1 else 'are'} {dtypes}"
    refs = " / ".join(sorted({str(REFERENCE[bound.values[i].dtype])[6:] for i in low}))
    copies: dict[int, torch.Tensor] = {}
    upcast = [copies.setdefault(id(v), v.to(REFERENCE[v.dtype])) if isinstance(v, torch.Tensor)
              and v.dtype in REFERENCE else v for v in plain]
    atol, rtol, eps = (max(t) for t in zip(*(LOW_TOLERANCE[bound.values[i].dtype] for i in low)))
    adapted = {k: v for k, v in (("atol", atol), ("rtol", rtol)) if k not in tol.given}
    try:
        forward(upcast)
    except UserCodeError as exc:
        tol = replace(tol, **adapted, **({"eps": eps} if "eps" not in tol.given else {}))
        return plain, tol, [f"{subject}, and forward fails in {refs} ({exc}): finite differences are "
                            f"taken in {dtypes} with eps {tol.eps:g} and atol {tol.atol:g}, rtol {tol.rtol:g}; "
                            "they are unreliable there, so check in float64 if you can"]
    tol = replace(tol, **adapted)
    return upcast, tol, [f"{subject}: the numerical gradient comes from forward run in {refs} (the "
                         f"reference), with tolerances for {dtypes}: atol {tol.atol:g}, rtol {tol.rtol:g}"]


def _fill(row: InputReport, entry: Entry, layout: Layout, value: torch.Tensor, outputs: tuple) -> None:
    """Turn accumulated statistics into the argument's row."""
    per_elem = 2 if value.is_complex() else 1
    bad = entry.bad.view(-1, per_elem).any(1) if per_elem == 2 else entry.bad
    row.mismatched = int(bad.sum())
    row.atol, row.rtol = entry.atol, entry.rtol
    if row.numel == 0:
        return
    row.max_abs_err = entry.max_abs
    row.max_rel_err = entry.max_rel
    if entry.worst_excess >= 0 and layout.n_rows:
        elem, part = divmod(entry.worst_col, per_elem)
        row.worst_index = unravel(elem, value.shape)
        out_no, real_idx, pos = layout.row_location(entry.worst_row)
        out = outputs[pos]
        out_elem, out_part = divmod(real_idx, 2 if out.is_complex() else 1)
        where = f"output {pos}" + (f" {unravel(out_elem, out.shape)}" if out.dim() else "")
        row.worst_output = where + (" (imaginary part)" if out.is_complex() and out_part else "")
        if per_elem == 2:
            row.worst_output += f", input {'imaginary' if part else 'real'} part"
        if math.isfinite(entry.analytical) and math.isfinite(entry.numerical):
            row.analytical, row.numerical = entry.analytical, entry.numerical
    row.diagnosis = describe(entry, row.mismatched, row.numel, tuple(value.shape))
    if row.mismatched and (value.is_complex() or any(outputs[p].is_complex() for p in layout.outputs)):
        imag_rows = torch.cat([torch.arange(real_numel(outputs[p])) % 2 == 1 if outputs[p].is_complex() else
                               torch.zeros(real_numel(outputs[p]), dtype=torch.bool) for p in layout.outputs])
        if conjugate(entry, imag_rows, value.is_complex()):
            row.diagnosis = ("backward uses the conjugate convention: it returns grad_output * f'(z) where PyTorch "
                             "expects grad_output * conj(f'(z)) (the conjugate Wirtinger derivative); conjugate it")
    if row.mismatched:
        row.status = Status.FAIL
    else:
        row.diagnosis = systematic(entry, SYSTEMATIC.get(value.dtype, 1e-4))


def _reexamine(row: InputReport, entry: Entry, forward: Any, plain: list[Any], x: torch.Tensor,
               positions: list[int], tol: Tolerance) -> None:
    """Look again at the mismatching elements kept whole: one at a kink, a tie or a domain edge,
    where backward gives a one-sided derivative, is not a wrong gradient."""
    if not row.mismatched or not entry.bad_columns:
        return
    per = 2 if x.is_complex() else 1
    verdicts = {}
    for col, a_col, _ in entry.bad_columns:
        element = col // per
        verdict = kinks.examine(forward, plain, x, col, tol.eps, positions, a_col, atol=tol.atol, rtol=tol.rtol,
                                index_text=f"{row.name}{unravel(element, x.shape)}")
        if element not in verdicts or verdicts[element].explained:  # explained when all its parts are
            verdicts[element] = verdict
    explained = [v for v in verdicts.values() if v.explained]
    wrong_at_kinks = [v.text for v in verdicts.values() if v.kind != "smooth" and not v.explained]
    row.at_kinks = len(explained)
    if explained and len(explained) == row.mismatched:  # every mismatch was examined and explained
        row.status, row.mismatched, row.diagnosis = Status.PASS, 0, None
        row.reason = (f"{len(explained)} element{'s' * (len(explained) != 1)} at a kink, tie or domain edge, "
                      f"where backward gives a one-sided derivative: {explained[0].text}; "
                      f"{kinks.resample_hint(row.name)}")
        return
    if explained:
        row.mismatched -= len(explained)
        row.diagnosis = describe(entry, row.mismatched, row.numel, tuple(x.shape))
    notes = wrong_at_kinks[:1] + [f"{len(explained)} more mismatching at a kink, tie or domain edge, where backward "
                                  "gives a one-sided derivative (not counted)"] * bool(explained)
    row.diagnosis = "; ".join([d for d in [row.diagnosis, *notes] if d])


def _determinism(outputs: tuple, positions: list[int], inputs: list[torch.Tensor], names: list[str],
                 gen: torch.Generator, nondet_tol: float, repeat: int) -> list[str]:
    """Backward ``repeat`` times with the same signed random grad_output must agree within nondet_tol."""
    live = [outputs[p] for p in positions if outputs[p].requires_grad]
    if not live or not inputs:
        return []
    probes = [contract.probe_like(o, gen) for o in live]
    runs = [guarded("backward", "backward", vjp, live, inputs, [p.clone() for p in probes]) for _ in range(repeat)]
    problems = []
    for name, first, *rest in zip(names, *runs):
        if first is None or any(g is None for g in rest):
            continue
        spread = max(contract.max_difference(first, g) for g in rest)
        if not spread <= nondet_tol:
            problems.append(f"backward is not deterministic for '{name}': {repeat} calls with the same grad_output "
                            f"differ by up to {spread:.3g}; {contract.nondet_hint(spread)}")
    return problems


def _finish(result: CheckResult, found: contract.Findings, more: list[str], start: float) -> CheckResult:
    """Status and message of the check from the rows and the contract findings."""
    for i in found.bad_args:
        result.inputs[i].status = Status.FAIL
        result.inputs[i].reason = result.inputs[i].reason or "backward's contract is broken (see below)"
    failures = found.failures + more
    for r in result.inputs:
        if r.status is Status.PASS and (r.at_kinks or r.diagnosis):
            result.warnings.append(f"'{r.name}': {r.diagnosis or r.reason}")
    wrong = [r for r in result.inputs if r.status is Status.FAIL]
    right = [r for r in result.inputs if r.status is Status.PASS]
    parts = list(failures)
    for r in wrong:
        if r.diagnosis:
            parts.append(f"gradient of '{r.name}': {r.diagnosis}")
        elif r.mismatched:
            parts.append(f"gradient of '{r.name}' is wrong")
    if failures or wrong:
        result.status = Status.FAIL
        if right and wrong:
            parts.append(f"{', '.join(repr(r.name) for r in right)} {'is' if len(right) == 1 else 'are'} right")
    elif not right:
        result.status = Status.SKIP
        parts.append("no argument requires grad: nothing to compare")
    else:
        parts.append(f"{len(right)} argument{'s' * (len(right) != 1)} checked, all within tolerance")
    result.message = "; ".join(parts)
    result.duration_s = time.perf_counter() - start
    return result


def _short(value: Any, limit: int = 30) -> str:
    text = repr(value)
    return text if len(text) <= limit else text[: limit - 3] + "..."
