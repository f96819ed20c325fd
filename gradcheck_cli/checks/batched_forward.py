"""The ``batched_forward`` check: forward-mode AD with a batch of tangents at once (vmap over jvp) against
one tangent at a time.

As ``torch.autograd.gradcheck(check_batched_forward_grad=True)`` does, forward runs on dual numbers whose
tangent is a whole batch, through torch's vmap over forward-mode AD (the one gradcheck and
``torch.autograd.functional.jacobian(..., strategy="forward-mode", vectorize=True)`` use), and must give
what the same dual-number forward gives with each tangent alone. The tangents are the one-hot e_j of each
checked argument's real elements, up to CHUNK in one batch: a batch gives that many columns of the Jacobian
at once and single calls give the same columns (``forward_ad``'s), so a difference is named by the
argument's element and the output's element.

The batching policy is the ``batched`` check's: vmap refusing jvp's own code (``.item()``, a tensor's value
in Python control flow, an in-place write into a tensor jvp created itself, ...) is a hazard, right one
tangent at a time but not batched: a warning under ``checks: all``, a fail when the check is named; an
operation torch cannot batch is torch's limit (a skip naming it); batched values that differ from single
calls fail everywhere.
"""

from __future__ import annotations

import warnings
from typing import Any, Callable, Optional

import torch
import torch.autograd.forward_ad as fwAD
from torch._vmap_internals import _vmap

from ..core.tolerance import same
from ..numerics import ArgumentComparison, as_tuple, make_layout
from ..numerics.streams import signed_uniform
from ..results import CheckResult, InputReport, Status
from ..sandbox.errors import UserCodeError
from .batched import hazard, is_defect, refusal, untold
from .forward_ad import jvp_call, jvp_column, named_mistake, no_jvp
from .parts.argument_rows import fill, output_at
from .parts.base import CheckContext, call_forward, differentiable, fresh_leaves, refuse_if_too_big, work_limit
from .parts.verdict import begin, conclude, labels, skip, unsupported

STREAM = 22  # the random stream of batched_forward's projection of the outputs (a seed replays it)

CHUNK = 16  # tangents in one batch, at most
STAGE = "forward-mode AD with a batch of tangents (vmap over jvp)"
USES = (
    "batched forward-mode gradients through it fail (torch.autograd.functional.jacobian(strategy="
    '"forward-mode", vectorize=True), torch.autograd.gradcheck(check_batched_forward_grad=True))'
)
UNDER_ALL = " (a warning under `checks: all`; naming batched_forward makes it a fail)"
NAMED = "; batched_forward was named explicitly, so that fails (`checks: all` makes it a warning)"


def run(ctx: CheckContext) -> CheckResult:
    """The ``batched_forward`` check of ``ctx.target`` on ``ctx.bound``."""
    target, bound = ctx.target, ctx.bound
    start, reports, checked, result = begin(bound, "batched_forward", "vmap")
    missing = no_jvp(target)
    if missing:
        return unsupported(result, missing, start, ctx.named)
    if not checked:
        return skip(result, "no argument requires grad: there is no tangent to batch", start)
    outputs = as_tuple(call_forward(target, bound, fresh_leaves(bound.values)))
    refuse_if_too_big(ctx, outputs)
    positions = differentiable(outputs)
    if not positions:
        return skip(
            result,
            "no output is differentiable (none is a floating-point tensor that requires grad): "
            "there is no tangent to batch",
            start,
        )
    plain = fresh_leaves(bound.values, grad=False)
    layout = make_layout([plain[i] for i in checked], outputs, positions)
    work_limit(ctx, "batched_forward", checked, outputs, positions)(layout.n_cols + -(-layout.n_cols // CHUNK), 1)
    limits = same(_widest(outputs, positions), ctx.tolerance.nondet_tol)  # two computations of the same tangents
    probe = signed_uniform((layout.n_rows,), ctx.streams.generator(STREAM))
    jvp = jvp_call(ctx)
    hazards: list[str] = []
    problems: list[str] = []
    untold_: list[str] = []
    compared = 0
    for k, i in enumerate(checked):
        row, value = reports[i], plain[i]
        entry = ArgumentComparison(layout.col_starts[k + 1] - layout.col_starts[k], limits.atol, limits.rtol)
        refused: Optional[BaseException] = None
        try:
            for c0 in range(0, entry.real_numel, CHUNK):
                span = range(c0, min(entry.real_numel, c0 + CHUNK))
                alone = torch.stack([jvp_column(jvp, plain, value, c, positions) for c in span])
                try:
                    batch = _batched(jvp, plain, value, span, positions)
                except Exception as exc:  # noqa: BLE001 - whatever vmap refuses is the finding
                    refused = exc
                    break
                entry.update(batch, alone, c0, probe)
        except UserCodeError as exc:  # single calls failed: forward-mode AD itself (forward_ad's words)
            named = named_mistake(exc, target, bound, plain, checked)
            if named is None:
                raise
            status, message = named
            if status is Status.SKIP:  # a Function it calls has no jvp, torch has no formula: unsupported
                return unsupported(result, message, start, ctx.named, "jvp failed (see the message)")
            return skip(result, message, start, status, "jvp failed (see the message)")
        if refused is not None:
            row.status, row.reason = Status.SKIP, "not compared: vmap failed (see the message)"
            if not is_defect(refused):
                untold_.append(untold("jvp", STAGE, refused))
            elif said := hazard("jvp", refused, "jvp", USES):
                hazards.append(said)
            else:
                problems.append(refusal("jvp", STAGE, refused))
            continue
        fill(row, entry, value, output_at(layout, outputs), parts=True)
        row.reason = f"{entry.real_numel} tangents along it, {CHUNK} at a time under vmap, against single calls"
        compared += 1
    return _finish(ctx, result, start, hazards, problems, list(dict.fromkeys(untold_)), compared)


def _batched(
    jvp: Callable[[list[Any]], Any], values: list[Any], t: torch.Tensor, span: range, positions: list[int]
) -> torch.Tensor:
    """The columns J e_c for c in ``span`` from one forward on a dual number whose tangent is the batch of
    one-hot e_c (torch's vmap over forward-mode AD): [len(span), realified outputs] float64 on the CPU."""
    tangents = torch.zeros((len(span),) + tuple(t.shape), dtype=t.dtype, device=t.device)
    flat = (torch.view_as_real(tangents) if t.is_complex() else tangents).view(len(span), -1)
    flat[torch.arange(len(span), device=t.device), torch.tensor(list(span), device=t.device)] = 1

    def one(tangent: torch.Tensor) -> tuple[torch.Tensor, ...]:
        with fwAD.dual_level():
            dual = fwAD.make_dual(t, tangent)
            outs = as_tuple(jvp([dual if v is t else v for v in values]))  # aliases (same_as) get the same dual
            found = [fwAD.unpack_dual(outs[p]) for p in positions]
            # a missing tangent is zeros; unbatched, vmap repeats it for each batch member
            return tuple(d.tangent if d.tangent is not None else torch.zeros_like(d.primal) for d in found)

    with warnings.catch_warnings():  # torch's note that it loops where it has no batching rule: right, only slower
        warnings.filterwarnings("ignore", message="There is a performance drop")
        got = _vmap(one)(tangents)
    parts = [(torch.view_as_real(g) if g.is_complex() else g).reshape(len(span), -1) for g in as_tuple(got)]
    return torch.cat(parts, dim=1).to("cpu", torch.float64)


def _widest(outputs: tuple[Any, ...], positions: list[int]) -> torch.dtype:
    """The least precise real dtype among the differentiable outputs (the tangents compared are theirs)."""
    dtypes = [outputs[p].real.dtype if outputs[p].is_complex() else outputs[p].dtype for p in positions]
    return max(dtypes, key=lambda d: torch.finfo(d).eps)


def _finish(
    ctx: CheckContext,
    result: CheckResult,
    start: float,
    hazards: list[str],
    problems: list[str],
    limits: list[str],
    compared: int,
) -> CheckResult:
    """Status and message from the rows, the problems and the hazards (a failure when the check was named,
    else a warning), as the batched check words them."""
    hazards = list(dict.fromkeys(hazards))
    if ctx.named:
        problems = [h + NAMED for h in hazards] + problems
        warned: list[str] = []
    else:
        result.warnings += hazards
        warned = [h + UNDER_ALL for h in hazards]

    def wrong(r: InputReport) -> str:
        at = f"{r.name}{r.worst_index}" if r.worst_index is not None else repr(r.name)
        values = (
            f"; batched {r.analytical:.6g}, alone {r.numerical:.6g}"
            if r.analytical is not None and r.numerical is not None
            else ""
        )
        return (
            f"the tangent along '{r.name}' differs when batched (max abs err {r.max_abs_err:.3g}, one-hot tangent "
            f"at {at}, {r.worst_output}{values}): jvp must give each tangent of a batch what it gives that tangent "
            "alone (no code path of its own under vmap, such as an `except` around .item(); no state kept between "
            "calls; no mixing of the batch's entries)"
        )

    def passed(right: list[InputReport]) -> str:
        return (
            f"{labels(right)} agree{'s' * (len(right) == 1)} under vmap: {STAGE} = one tangent at a time, "
            f"for every element's tangent, {CHUNK} at a time"
        )

    alone = not compared and not problems  # the hazards and limits are then all the message says (a skip)
    return conclude(
        result,
        start,
        problems,
        wrong,
        passed,
        name_right=False,
        nothing="; ".join(warned + limits) or None,
        notes=([] if alone else warned) + (limits if compared else []),
    )
