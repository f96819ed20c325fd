"""The ``batched`` check: backward, and forward where a Function supports it, under vmap.

As ``torch.autograd.gradcheck(check_batched_grad=True)`` does, one backward with a batch of
``BATCH`` signed random grad_outputs (``is_grads_batched``, what torch.func.jacrev and
vmap-of-grad rely on) must equal that many separate backward calls. A Function that declares
vmap support (``generate_vmap_rule = True`` or a ``vmap`` staticmethod) is also run under
``torch.func.vmap`` over a batch of inputs, against a loop of forwards, and under vmap of its
whole vjp (batched inputs and grad_outputs), against a loop of backward calls.

When vmap refuses backward's own code (it writes batched values in place into a tensor it created
itself, calls ``.item()``, branches on a tensor, reads its memory, uses ``out=``, ...), backward may be
right one grad_output at a time, yet batched gradients through it fail (torch.func.vmap and jacrev
refuse it too): a warning under ``checks: all``, a failure when ``batched`` is named (the hazard and
what to write instead in the same words). Refused in forward or in a ``vmap`` rule the Function
declares, and wrong batched values, are failures everywhere. When torch lacks a batching rule for an operation
used correctly, that is torch's limit, not the Function's: the batch of grad_outputs that
``is_grads_batched`` (torch's older vmap, the one torch.autograd.gradcheck uses) cannot run goes through
torch.func.vmap over backward instead, and where neither can batch it the check skips naming the op.
"""

from __future__ import annotations

import re
import traceback
import warnings
from dataclasses import dataclass, field
from typing import Any, Optional

import torch

from ..core.tolerance import same
from ..numerics import as_tuple, engine, vjp
from ..numerics.streams import signed_uniform
from ..results import CheckResult, ErrorKind, InputReport, Status
from ..sandbox.errors import UserCodeError, guarded, user_frame
from ..subject.binding import Bound
from ..subject.custom_op import OpTarget
from ..subject.target import Target
from .parts.argument_rows import agreement, fill, zeros_if_none
from .parts.base import CheckContext, call_forward, fresh_leaves, graph_forward, probe_like
from .parts.verdict import begin, conclude, skip, unsupported

STREAM = 20  # the random stream of batched's stack of grad_outputs (a seed replays it)

BATCH = 3  # batch elements per vmapped call
MAX_DIMS = 64  # torch's limit on a tensor's dimensions
JITTER = 0.01  # batch members 1.. of the inputs: the input times (1 + JITTER * noise)
METHODS = ("forward", "backward", "setup_context", "vmap", "jvp")  # a Function's methods, to say which one failed
IN_PLACE = ("being vmapped over but `self` not", "doesn't match the broadcast shape")  # torch's words for it
BUFFER = (
    "writes batched values in place into a tensor it created itself (e.g. `out = torch.zeros_like(x); "
    "out += grad` or `out[idx] = grad`)"
)
BUFFER_FIX = (
    "that tensor has no batch dimension; compute the result out of place, or create the buffer from the "
    "batched value (torch.zeros_like(grad), grad.new_zeros(...))"
)
BATCHED_USES = (
    "batched gradients through it fail (torch.autograd.functional.jacobian(vectorize=True), "
    "torch.func.vmap over backward, torch.autograd.gradcheck(check_batched_grad=True))"
)
UNDER_ALL = " (a warning under `checks: all`; naming batched makes it a fail)"
NAMED = "; batched was named explicitly, so that fails (`checks: all` makes it a warning)"


# What vmap's refusals mean, in the user's terms: (fragments of torch's message, explanation).
REFUSALS = [
    (
        ("aten::item", ".item()", "_local_scalar_dense"),
        "calls .item() (or float()/int() of a tensor): under vmap a tensor holds a whole batch of values, so "
        "there is no single Python number; keep the value a tensor",
    ),
    (
        ("is_nonzero", "data-dependent control flow"),
        "uses a tensor's value in Python control flow (`if t:`, `while`, `and`/`or`, bool(t)): under vmap every "
        "batch element may need a different branch; compute both and pick with torch.where",
    ),
    (IN_PLACE, f"{BUFFER}: {BUFFER_FIX}"),
    (
        ("doesn't have storage", "data pointer"),
        "reads a tensor's memory directly (.tolist(), .numpy(), a C/C++ extension): a batched tensor has no "
        "storage of its own; use torch operations",
    ),
    (
        ("doesn't correspond to a device",),
        "builds a tensor from a batched one with torch.tensor(...) or .new_tensor(...): use clone() or torch "
        "operations",
    ),
    (
        (".out;", "_out;"),
        "writes into a preallocated tensor with out=...: use the out-of-place form (e.g. `torch.mul(a, b)`)",
    ),
    (
        ("setup_context staticmethod",),
        "calls an autograd.Function that does not support vmap: give it `generate_vmap_rule = True` with "
        "forward(...) without ctx and a setup_context staticmethod, or a `vmap` staticmethod",
    ),
    (("randomness",), "draws random numbers: vmap refuses that unless told how (torch.func.vmap(..., randomness=...))"),
]


# torch's words for an operation it cannot batch (a limit of torch, not of the Function).
NO_RULE = re.compile(r"Batching rule not implemented for (aten::\w+(?:\.\w+)?)")
DYNAMIC = re.compile(r"output dynamic shape\. Attempted to vmap over (aten::\w+)")
MASKED = re.compile(r"Attempted to vmap over `mask` in torch\.(\w+)")
SPARSE = re.compile(r"'Sparse\w*' backend|unsupported for Sparse tensors")


def _unwrapped(exc: BaseException) -> BaseException:
    return exc.__cause__ if isinstance(exc, UserCodeError) and exc.__cause__ is not None else exc


def is_defect(exc: BaseException) -> bool:
    """Whether vmap refused something in the Function's code that the user can change (REFUSALS)."""
    text = str(_unwrapped(exc))
    return any(k in text for keys, _ in REFUSALS for k in keys)


def limit(exc: BaseException) -> Optional[str]:
    """What torch cannot batch, when its error says the missing piece is torch's (no batching rule
    for an operation, an output whose shape depends on the values, sparse tensors); else None."""
    if is_defect(exc):
        return None
    text = str(_unwrapped(exc))
    if m := NO_RULE.search(text):
        return f"torch has no batching rule for {m.group(1)}"
    if m := DYNAMIC.search(text):
        return f"torch cannot batch {m.group(1)} (its output's shape depends on the values)"
    if m := MASKED.search(text):
        return f"torch cannot batch torch.{m.group(1)} with a batched mask (its output's shape depends on the values)"
    if "indexing with a boolean mask" in text:
        return "torch cannot batch indexing with a batched boolean mask (its output's shape depends on the values)"
    if SPARSE.search(text):
        return "torch's vmap cannot batch operations on sparse tensors"
    return None


def untold(who: str, stage: str, exc: BaseException, outcome: str = "") -> str:
    """A vmap failure that is not a known refusal of the user's code: the limit of torch it names (or
    what torch said, where single calls did not fail), then ``stage`` and its ``outcome``."""
    inner = _unwrapped(exc)
    where = user_frame(inner)
    limit_of = limit(exc)
    if limit_of:
        at = f" (used by {who} at {where})" if where else ""
        return f"{limit_of}{at}: {stage} {outcome or 'cannot be checked here (a limit of torch, not of the code)'}"
    text = str(inner).strip().splitlines()
    said = f"torch: {type(inner).__name__}: {(text[0] if text else '')[:200]}"
    at = f" at {where}" if where else ""
    return (
        f"{stage} {outcome or 'cannot be checked here'}: it raised{at} where single calls did not, and the "
        f"error does not say whether the code or torch's batching is at fault ({said})"
    )


def _method(who: str, exc: BaseException) -> str:
    """Which of the Function's methods raised ``exc`` (the last one in its traceback, and in that of the
    error a UserCodeError wraps), else ``who``."""
    frames = traceback.extract_tb(exc.__traceback__)
    if isinstance(exc, UserCodeError) and exc.__cause__ is not None:
        frames += traceback.extract_tb(exc.__cause__.__traceback__)
    methods = [f.name for f in frames if f.name in METHODS]
    return methods[-1] if methods else who


def _said(exc: BaseException) -> str:
    """What torch said, shortened."""
    text = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
    return f"torch: {type(exc).__name__}: {text[:200]}"


def refusal(who: str, stage: str, exc: BaseException) -> str:
    """A vmap failure during ``stage``, in the user's terms; ``who`` ran the code (unless the
    traceback says which of forward, backward, ... did). What call_forward labelled is judged
    by the error it wraps, with the traceback of both."""
    who = _method(who, exc)
    exc = _unwrapped(exc)
    why = next((w for keys, w in REFUSALS if any(k in str(exc) for k in keys)), None)
    where = user_frame(exc)
    at = f" at {where}" if where else ""
    return f"{stage} failed{at}: {who} {why} ({_said(exc)})" if why else f"{stage} failed{at}: {_said(exc)}"


def hazard(who: str, exc: BaseException, method: str = "backward", uses: str = BATCHED_USES) -> Optional[str]:
    """The hazard, in words, when vmap refused ``exc`` in the own code of ``method`` (backward; jvp for
    batched_forward) (REFUSALS: it writes batched values in place into a tensor it created itself, calls
    .item(), branches on a tensor's value, reads its memory, ...): right one grad_output (tangent) at a time,
    but batched ``uses`` through it fail; else None."""
    inner = _unwrapped(exc)
    if _method(who, exc) != method:
        return None
    why = next((w for keys, w in REFUSALS if any(k in str(inner) for k in keys)), None)
    if why is None:
        return None
    where = user_frame(inner)
    at = f", at {where}" if where else ""
    if any(k in str(inner) for k in IN_PLACE):
        return f"{method} {BUFFER}{at}: {uses}, since {BUFFER_FIX} ({_said(inner)})"
    what, _, fix = why.partition(": ")
    return f"{method} {what}{at}: {uses}, since {fix} ({_said(inner)})"


@dataclass
class Stacks:
    """Per checked argument, the batched results and the looped ones, with a label per leading index."""

    got: dict[int, list[torch.Tensor]] = field(default_factory=dict)
    want: dict[int, list[torch.Tensor]] = field(default_factory=dict)
    labels: list[str] = field(default_factory=list)
    problems: list[str] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)
    hazards: list[str] = field(default_factory=list)  # what backward's own code does that vmap refuses (hazard)
    agreed: list[str] = field(default_factory=list)  # what was compared, for the message
    limits: list[str] = field(default_factory=list)  # what torch could not batch: not judged, not wrong

    def refuse(self, who: str, stage: str, exc: BaseException) -> None:
        """vmap refused the code during ``stage``: a hazard (in backward's code) or a problem (refusal)."""
        said = hazard(who, exc)
        if said:
            self.hazards.append(said)
        else:
            self.problems.append(refusal(who, stage, exc))

    def add(self, stage: str, checked: list[int], got: list[torch.Tensor], want: list[torch.Tensor]) -> None:
        for i, g, w in zip(checked, got, want):
            self.got.setdefault(i, []).append(g)
            self.want.setdefault(i, []).append(w)
        self.labels += [f"batch element {b} of {BATCH}, {stage}" for b in range(BATCH)]


def run(ctx: CheckContext) -> CheckResult:
    """The ``batched`` check of ``ctx.target`` on ``ctx.bound``."""
    target, bound, opts = ctx.target, ctx.bound, ctx.options
    start, _, checked, result = begin(bound, "batched", "vmap")
    leaves, outputs, positions = graph_forward(target, bound)
    if not checked or not positions:
        return skip(
            result,
            "no argument requires grad: nothing to batch"
            if not checked
            else "no output requires grad: there is no backward to batch",
            start,
        )
    deepest = max((t.dim() for t in [leaves[i] for i in checked] + [outputs[p] for p in positions]), default=0)
    if deepest >= MAX_DIMS:  # torch's assert in its batching code, not a fault of the Function
        return unsupported(
            result,
            f"vmap adds a batch dimension, and a tensor of this case already has {deepest} "
            f"(torch allows at most {MAX_DIMS}): batched gradients cannot be checked here",
            start,
            ctx.named,
        )
    gen = ctx.streams.generator(STREAM)
    found = Stacks()
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", message="There is a performance drop")
        _batched_grad_outputs(leaves, outputs, positions, checked, gen, found)
        if target.declares_vmap:
            _vmapped_forward(target, bound, checked, positions, gen, found)
        elif target.is_function:
            found.notes.append(
                f"forward not vmapped: {target.obj.__name__} declares no vmap support (add "
                "`generate_vmap_rule = True` with setup_context, or a `vmap` staticmethod, to use "
                "it under torch.func.vmap)"
            )
    if isinstance(target, OpTarget) and not target.declares_vmap:
        result.warnings.append(
            f"vmap has no batching rule for {target.name}: under torch.func.vmap torch runs it once "
            "per batch element (its fallback: right, but slow; torch's 'performance drop' warning "
            "for it is not printed); register one with @torch.library.register_vmap"
        )
    return _finish(result, start, bound, checked, found, opts.tolerance.nondet_tol, ctx.named)


def _batched_grad_outputs(
    leaves: list[Any],
    outputs: tuple[Any, ...],
    positions: list[int],
    checked: list[int],
    gen: torch.Generator,
    found: Stacks,
) -> None:
    """One backward with BATCH grad_outputs at once against BATCH separate backward calls."""
    live, inputs = [outputs[p] for p in positions], [leaves[i] for i in checked]
    stacks = [torch.stack([probe_like(o, gen) for _ in range(BATCH)]) for o in live]
    loop = [
        zeros_if_none(
            guarded(ErrorKind.BACKWARD, "backward", vjp, live, inputs, [s[b].clone() for s in stacks]), inputs
        )
        for b in range(BATCH)
    ]
    stage = "backward with a batch of grad_outputs (vmap over backward)"
    sent = [s.clone() for s in stacks]
    how = "one backward"
    try:
        got = engine.grad(live, inputs, sent, retain_graph=True, allow_unused=True, is_grads_batched=True)
    except Exception as exc:  # noqa: BLE001 - whatever vmap refuses is the finding
        if is_defect(exc):
            found.refuse("backward", stage, exc)
            return
        # is_grads_batched runs torch's older vmap, which lacks many batching rules: torch.func.vmap may have them
        sent = [s.clone() for s in stacks]
        try:
            got = tuple(_func_vmapped_grad(live, inputs, sent))
        except Exception as again:  # noqa: BLE001
            if is_defect(again):
                found.refuse("backward", stage.replace("(vmap", "(torch.func.vmap"), again)
            else:
                found.limits.append(untold("backward", stage, again))
            return
        found.notes.append(
            untold(
                "backward",
                "is_grads_batched (the vmap torch.autograd.gradcheck uses)",
                exc,
                "cannot run it, so the batch went through torch.func.vmap over backward instead",
            )
        )
        how = "torch.func.vmap over backward"
    if any(not torch.equal(a, b) for a, b in zip(sent, stacks)):
        found.problems.append(
            "backward modified grad_output in place: under vmap the whole batch of grad_outputs "
            "is changed; clone it before changing it (`grad_output = grad_output.clone()`)"
        )
    want = [torch.stack(shards) for shards in zip(*loop)]
    found.add("batched grad_outputs", checked, zeros_if_none(got, inputs, (BATCH,)), want)
    found.agreed.append(f"{how} with {BATCH} grad_outputs = {BATCH} backward calls")


def _func_vmapped_grad(live: list[Any], inputs: list[Any], stacks: list[torch.Tensor]) -> list[torch.Tensor]:
    """The batch of grad_outputs through torch.func.vmap over torch.autograd.grad of the graph built."""

    def one(*grads: torch.Tensor) -> tuple[torch.Tensor, ...]:
        got = torch.autograd.grad(live, inputs, grads, retain_graph=True, allow_unused=True)
        return tuple(zeros_if_none(got, inputs))

    return list(torch.func.vmap(one)(*stacks))


def _vmapped_forward(
    target: Target, bound: Bound, checked: list[int], positions: list[int], gen: torch.Generator, found: Stacks
) -> None:
    """torch.func.vmap over forward, and over forward + backward (the whole vjp), against loops."""
    plain = fresh_leaves(bound.values, grad=False)
    groups = {i: [j for j, v in enumerate(bound.values) if v is bound.values[i]] for i in checked}

    def place(tensors: Any) -> list[Any]:
        vals = list(plain)
        for i, t in zip(checked, tensors):
            for j in groups[i]:
                vals[j] = t
        return vals

    def forward(*tensors: torch.Tensor) -> tuple[Any, ...]:
        return as_tuple(call_forward(target, bound, place(tensors)))

    batch = [_jittered(plain[i], gen) for i in checked]
    members = [[t[b].clone().requires_grad_() for t in batch] for b in range(BATCH)]
    try:
        looped = [as_tuple(call_forward(target, bound, place(m))) for m in members]
    except UserCodeError as exc:  # the jittered inputs left forward's domain: not vmap's fault
        found.notes.append(f"forward not vmapped: it raised on the inputs scaled by 1 +- {JITTER:g} ({exc})")
        return
    try:
        forward_vmapped = torch.func.vmap(forward)(*batch)
    except Exception as exc:  # noqa: BLE001 - whatever vmap refuses is the finding
        _refused(found, "forward", "torch.func.vmap over forward", exc)
        return
    hint = _out_dims_hint(target)
    for p, (g, *w) in enumerate(zip(as_tuple(forward_vmapped), *looped)):
        if not isinstance(g, torch.Tensor):
            continue
        want = torch.stack([x.detach() for x in w])
        if g.shape != want.shape:
            found.problems.append(
                f"vmap over forward returned output {p} with shape {list(g.shape[1:])} per batch "
                f"element, but forward returns {list(want.shape[1:])}{hint}"
            )
            return
        entry = agreement(g, want, same(g.dtype))
        if int(entry.bad.sum()):
            found.problems.append(
                f"vmap over forward differs from a loop of forwards for output {p} (max abs err "
                f"{entry.max_abs:.3g}, batch element {entry.worst_row}){hint}"
            )
            return
    found.agreed.append(f"vmap over forward = {BATCH} forwards")
    if found.problems or found.hazards:  # backward already failed under vmap: vmapping it again says nothing new
        return
    cots = [torch.stack([probe_like(looped[0][p], gen) for _ in range(BATCH)]) for p in positions]

    def whole_vjp(*args: torch.Tensor) -> tuple[Any, ...]:
        tensors, cot = args[: len(checked)], args[len(checked) :]
        pull = torch.func.vjp(lambda *t: tuple(forward(*t)[p] for p in positions), *tensors)[1]
        return pull(tuple(cot))

    try:
        got = torch.func.vmap(whole_vjp)(*batch, *cots)
    except Exception as exc:  # noqa: BLE001
        _refused(found, "forward or backward", "torch.func.vmap over forward and backward", exc)
        return
    calls = [
        zeros_if_none(
            guarded(ErrorKind.BACKWARD, "backward", vjp, [out[p] for p in positions], m, [c[b] for c in cots]), m
        )
        for b, (m, out) in enumerate(zip(members, looped))
    ]
    found.add("vmap over forward and backward", checked, list(got), [torch.stack(s) for s in zip(*calls)])
    found.agreed.append(f"vmap over forward and backward = {BATCH} forward and backward calls")


def _refused(found: Stacks, who: str, stage: str, exc: BaseException) -> None:
    """A failure of the user's code when vmap refused it, else what torch could not batch."""
    if is_defect(exc):
        found.refuse(who, stage, exc)
    else:
        found.limits.append(untold(who, stage, exc))


def _jittered(value: torch.Tensor, gen: torch.Generator) -> torch.Tensor:
    """BATCH members: the input itself, then copies scaled elementwise by 1 + JITTER * noise."""
    real = value.real.dtype if value.is_complex() else value.dtype
    noise = [signed_uniform(value.shape, gen) for _ in range(BATCH - 1)]
    return torch.stack([value] + [value * (1 + JITTER * z).to(device=value.device, dtype=real) for z in noise])


def _out_dims_hint(target: Target) -> str:
    if not target.own_vmap:
        return ""
    return (
        ": the `vmap` staticmethod must return out_dims that say where the batch dimension of each "
        "output is (0 after moving it to the front), and compute every batch element like forward"
    )


def _finish(
    result: CheckResult, start: float, bound: Bound, checked: list[int], found: Stacks, nondet_tol: float, named: bool
) -> CheckResult:
    """Rows from the stacks, status and message from the rows, the problems and the hazards (a failure when
    the check was ``named``, else a warning)."""
    for i in checked:
        row = result.inputs[i]
        if i not in found.got:
            row.status, row.reason = Status.SKIP, "not compared: vmap failed (see the message)"
            continue
        got, want = torch.cat(found.got[i]), torch.cat(found.want[i])
        fill(
            row,
            agreement(got, want, same(bound.values[i].dtype, nondet_tol)),
            bound.values[i],
            lambda r: found.labels[r],
        )
        row.reason = f"{len(found.labels)} batched results against as many separate calls"

    def wrong(r: InputReport) -> str:
        return (
            f"the gradient of '{r.name}' differs when batched (max abs err {r.max_abs_err:.3g}, "
            f"{r.worst_output}): backward must treat each grad_output on its own (no state kept "
            "between calls, no in-place changes)"
        )

    def passed(right: list[InputReport]) -> str:
        return (
            f"{', '.join(repr(r.name) for r in right)} agree{'s' * (len(right) == 1)} under vmap: "
            f"{', '.join(found.agreed)}"
        )

    compared = bool(found.got)
    hazards = list(dict.fromkeys(found.hazards))
    problems = [h + NAMED for h in hazards] + found.problems if named else found.problems
    warned = [] if named else [h + UNDER_ALL for h in hazards]
    if not named:
        result.warnings += hazards
    alone = not compared and not problems  # the hazards are then all the message says (a skip)
    return conclude(
        result,
        start,
        problems,
        wrong,
        passed,
        name_right=False,
        nothing="; ".join(warned + found.limits) or None,
        notes=([] if alone else warned) + found.notes + (found.limits if compared else []),
    )
