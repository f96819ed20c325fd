"""The ``backward`` check: backward's contract, then the Jacobian entry by entry, then determinism."""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from copy import copy
from dataclasses import dataclass, replace
from functools import partial
from typing import Any, Callable, Optional

import torch

from ..core.tolerance import Tolerance
from ..numerics import (
    ArgumentComparison,
    as_tuple,
    compare,
    is_float_tensor,
    kinks,
    precision,
    probes,
    real_numel,
    ties,
    unravel,
    vjp,
)
from ..numerics.jacobians import Spent, projection
from ..numerics.realify import Vjp
from ..numerics.streams import Stream, Streams, signed_uniform
from ..results import CheckResult, ErrorKind, InputReport, Pattern, Status
from ..sandbox.errors import UserCodeError, guarded
from ..subject.binding import Bound
from .parts import contract, tied
from .parts.argument_rows import blank, fill_jacobian, take
from .parts.base import (
    HALF,
    CheckContext,
    Options,
    call_forward,
    fresh_leaves,
    probe_like,
    refuse_if_too_big,
    work_limit,
)
from .parts.diagnosis import diagnose, ratio_text
from .parts.step import refuse_outside_domain, refuse_unusable
from .parts.upcast import by_tolerance, reference
from .parts.verdict import begin, conclude, skip

NO_VERDICT = "forward's precision: no verdict"
# what outputs that change in coarse steps are: the two cases finite differences cannot tell apart on one input
STEPS_ARE = (
    "forward computes in {grid} or lower precision inside, or it is a step function such as a quantiser, whose "
    "finite differences are exact zeros between its steps: a straight-through estimator's backward is not its "
    "derivative, and `reference_backward:` declares the gradient it intends"
)  # the reason of a row finite differences cannot judge
GRID_DTYPES = {"float32": torch.float32, "float16": torch.float16, "bfloat16": torch.bfloat16}  # precision.GRIDS
Columns = Callable[[list[int], dict[int, torch.Tensor]], Iterator[tuple[int, torch.Tensor]]]  # see _reexamine
STRICT_MARGIN = 10  # --strict fails a constant factor off 1 by this many times the finite differences' own error


@dataclass(frozen=True)
class Again:
    """How an argument's row is judged again: ``judge(row, t)`` compares it element by element at the
    tolerance ``t`` (the row refilled); ``step(cols, eps, atol, rtol)`` chooses the step to judge it at
    from the finite differences at the real elements ``cols`` (``precision.judged_step``);
    ``decide(steps, atol, rtol)`` judges every element at those steps by each step's error bound
    (``precision.decide``)."""

    judge: Callable[[InputReport, Tolerance], None]
    step: Callable[[Sequence[int], float, float, float], Optional[precision.Judged]]
    decide: Callable[[Sequence[float], float, float], precision.Decision]


@dataclass(frozen=True)
class Calls:
    """Backward's calls and the values they are made at, built once in ``_check`` and passed whole to what
    compares, probes and looks again (``_probe``, ``_reexamine``, ``_again``, ``_strict``, ...)."""

    forward: Callable[[Sequence[Any]], Any]  # the target's forward on a list of argument values (``call_forward``)
    batched: Callable[[Sequence[Any]], Any]  # the forward that vmap may batch (forward itself, or the Function's body)
    backward: Vjp  # backward, ``vjp``'s signature, its errors the user's (``guarded``, ErrorKind.BACKWARD)
    outputs: tuple[Any, ...]  # forward's outputs, in the graph of the checked arguments' leaves
    positions: list[int]  # the outputs compared: the float ones that require grad (else every float one)
    plain: list[Any]  # the argument values finite differences move (float64 copies of a low-precision Function's)
    plain_inputs: list[torch.Tensor]  # the checked arguments' copies inside ``plain``, in ``checked``'s order

    def columns(self, leaf: torch.Tensor, memory_bytes: int) -> Columns:
        """The analytical columns of ``leaf`` (a checked argument's leaf), a batch at a time
        (``kinks.analytical_columns``)."""
        return partial(
            kinks.analytical_columns, self.backward, self.outputs, self.positions, leaf, memory_bytes=memory_bytes
        )


@dataclass(frozen=True)
class Settings:
    """The spec's keys this check owns (``x-check: backward`` in the schema)."""

    repeat: int = 3  # backward calls with the same grad_output that must agree (determinism)

    @classmethod
    def of(cls, ctx: CheckContext) -> Settings:
        given = ctx.settings.get("repeat")
        return cls() if given is None else cls(repeat=given)


def run(ctx: CheckContext) -> CheckResult:
    """Check backward of ``ctx.target`` called with ``ctx.bound``. User errors raise UserCodeError."""
    if not ctx.options.probes:
        return _check(ctx)
    # --fast on small arguments: milliseconds of small operations, on one thread
    with probes.one_thread_below_grain(sum(v.numel() for v in ctx.bound.values if isinstance(v, torch.Tensor))):
        return _check(ctx)


def _check(ctx: CheckContext) -> CheckResult:
    """``run``, on the threads it has."""
    target, bound, opts = ctx.target, ctx.bound, ctx.options
    tol = opts.tolerance
    gen = ctx.streams.generator(Stream.BACKWARD)
    start, reports, checked, result = begin(bound, "backward", "elementwise")
    repeat = Settings.of(ctx).repeat
    found = contract.inspect(target, bound, gen, tol.nondet_tol, repeat) if target.is_function else contract.Findings()
    result.warnings += found.warnings
    if found.fatal:
        for i in checked:
            reports[i].status, reports[i].reason = Status.SKIP, "backward's contract is broken (see below)"
        return _finish(result, found, [], start)

    if found.graph:  # the contract's forward, reused: backward's raw calls left its graph as it was
        leaves, outputs = found.graph
    else:
        leaves = fresh_leaves(bound.values)
        outputs = as_tuple(call_forward(target, bound, leaves))
    refuse_if_too_big(ctx, outputs)
    positions = [p for p, o in enumerate(outputs) if is_float_tensor(o) and o.requires_grad]
    if not positions:
        positions = [p for p, o in enumerate(outputs) if is_float_tensor(o)]
        result.warnings.append("no output requires grad: checking that the outputs do not depend on the inputs")

    def forward(vals: Sequence[Any]) -> Any:
        return call_forward(target, bound, vals)

    # what vmap may batch: a generated vmap rule runs forward itself under vmap, so forward is called
    # directly (apply's vmap machinery costs more than the forward of a 128 x 128 Linear layer)
    # (an in-place forward runs on copies, through apply)
    direct = not target.is_function or target.own_vmap or bool(bound.clone_inputs)
    batched: Callable[[Sequence[Any]], Any] = forward if direct else lambda vals: target.body(bound.arguments(vals))
    copies = found.copies if found.graph and found.copies is not None else fresh_leaves(bound.values, grad=False)
    plain, tols, notes = reference(forward, copies, bound.names, checked, tol)  # copies: what finite differences move
    if plain is None:  # half precision only: finite differences there measure rounding
        return _half_only(ctx, result, notes[0], start)
    refuse_unusable(plain, checked, bound.names, tols)
    result.warnings += notes
    backward = lambda *args: guarded(ErrorKind.BACKWARD, "backward", vjp, *args)  # noqa: E731
    grad_inputs, plain_inputs = [leaves[i] for i in checked], [plain[i] for i in checked]
    calls = Calls(
        forward=forward,
        batched=batched,
        backward=backward,
        outputs=outputs,
        positions=positions,
        plain=plain,
        plain_inputs=plain_inputs,
    )
    # backward's contract call is one probe, as autograd passes its values on; a tensor passed twice
    # gets the sum of its two gradients from autograd, so not there
    tensors = [v for v in bound.values if isinstance(v, torch.Tensor)]
    given = (
        (found.probe[0], [found.probe[1][i] for i in checked])
        if found.probe and len({id(t) for t in tensors}) == len(tensors)
        else None
    )
    probing = backward if given is None else _through_node(found, calls, checked)
    loosest = max(tols, key=lambda t: (t.atol, t.rtol), default=tol)  # backward's linearity: every argument's
    contract.in_use(found, target, bound, (leaves, outputs), positions, checked, probing, given, ctx.streams, loosest)
    todo = (
        _probe(result, checked, bound, calls, probing, given, grad_inputs, opts, tols)
        if opts.probes
        else list(range(len(checked)))
    )
    # element by element: every argument, or under --fast those whose probes failed; one comparison per
    # tolerance, so that each argument is judged by its own dtype's
    spent = Spent(work_limit(ctx, "backward", [checked[k] for k in todo], outputs, positions, fast=True))
    for group in by_tolerance(todo, tols):
        corners = ties.Held(opts.memory_bytes)  # elements examined at a corner, judged together below
        t = tols[group[0]]
        layout, entries = compare(
            calls.forward,
            calls.outputs,
            calls.positions,
            [grad_inputs[k] for k in group],
            calls.plain,
            [calls.plain_inputs[k] for k in group],
            eps=t.eps,
            atol=t.atol,
            rtol=t.rtol,
            memory_bytes=opts.memory_bytes,
            grad=calls.backward,
            streams=ctx.streams,
            batched=calls.batched,
            budget=spent.next(),
            compress=opts.compress,
        )
        for k, entry in zip(group, entries):
            i = checked[k]
            fill_jacobian(reports[i], entry, layout, bound.values[i], calls.outputs)
            unjudged = _reexamine(
                reports[i],
                entry,
                calls,
                k,
                t,
                calls.columns(grad_inputs[k], opts.memory_bytes),
                _again(ctx, calls, grad_inputs[k], k, i),
                (corners, i),
            )
            if unjudged and ctx.oracle is not None:  # named or under `all` alike: the default check's verdict
                _not_judged(result, reports[i])
            if reports[i].pattern is Pattern.SYSTEMATIC and t.strict:
                _strict(reports[i], entry, calls, k, projection(layout, ctx.streams), t.eps, ctx.streams)
        tied.judge(reports, corners.items, calls.forward, calls.plain, calls.positions, t)
    nondeterministic = (
        []
        if found.repeated
        else _determinism(  # the contract compared its repeated calls
            calls, grad_inputs, [bound.names[i] for i in checked], gen, tol.nondet_tol, repeat
        )
    )
    return _finish(result, found, nondeterministic, start)


def _through_node(found: contract.Findings, calls: Calls, checked: list[int]) -> Vjp:
    """The probes' backward (``vjp``'s signature) through the contract's graph node, where its raw return is
    what autograd gives (``Findings.again``): the engine's bookkeeping left out. Other calls: ``calls.backward``."""
    again = found.again
    outputs, positions, backward = calls.outputs, calls.positions, calls.backward

    def through(live: Sequence[Any], inputs: Sequence[Any], grad_outputs: Sequence[Any]) -> tuple[Any, ...]:
        if again is None or len(inputs) != len(checked) or [id(o) for o in live] != [id(outputs[p]) for p in positions]:
            return tuple(backward(live, inputs, grad_outputs))
        back = again(dict(zip(positions, grad_outputs)))
        return tuple(g.detach() if isinstance(g, torch.Tensor) else g for g in (back[i] for i in checked))

    return through


def _probe(
    result: CheckResult,
    checked: list[int],
    bound: Bound,
    calls: Calls,
    probing: Vjp,
    given: Optional[tuple[list[Any], list[Any]]],
    grad_inputs: list[torch.Tensor],
    opts: Options,
    tols: list[Tolerance],
) -> list[int]:
    """The fast decision: the rows of the arguments whose probes all passed are filled; returned are
    the others (indices into ``checked``), to compare element by element. ``calls``: forward, the
    forward that vmap may batch, and the values; ``probing``: the probes' backward (``calls.backward``,
    or the same through the contract's graph node: ``_through_node``); ``given``: (grad_outputs, gradients
    of the checked arguments) of one backward call already made (or None); ``tols``: each checked argument's
    tolerance (not necessarily ``opts``' own: see ``_reference``), the arguments of one tolerance probed together."""
    forward, batched, outputs, positions = calls.forward, calls.batched, calls.outputs, calls.positions
    plain, plain_inputs = calls.plain, calls.plain_inputs
    n_rows = sum(real_numel(outputs[p]) for p in positions)
    held = probes.footprint(opts.probes, n_rows, [real_numel(x) for x in plain_inputs])
    if held > opts.memory_bytes:
        raise UserCodeError(
            ErrorKind.TOO_LARGE,
            (
                f"the backward check was not started: {opts.probes:,} probes per argument hold about "
                f"{held / 2**20:,.0f} MB of directions and products here, beyond --max-memory "
                f"{opts.memory_bytes / 2**20:g} MB; use fewer probes (--fast's three decide; "
                "an argument whose probe fails is compared element by element anyway), or a larger --max-memory"
            ),
        )
    stats: list[probes.ProbeStats] = [probes.ProbeStats()] * len(checked)
    for group in by_tolerance(list(range(len(checked))), tols):
        t = tols[group[0]]
        mine = [grad_inputs[k] for k in group]
        at_x = all(plain_inputs[k].dtype == grad_inputs[k].dtype for k in group)  # not taken in another dtype
        decided = probes.decide(
            forward,
            outputs,
            positions,
            mine,
            plain,
            [plain_inputs[k] for k in group],
            eps=t.eps,
            atol=t.atol,
            rtol=t.rtol,
            probes=opts.probes,
            streams=bound.streams,
            grad=probing,
            batched=batched,
            given=None if given is None else (given[0], [given[1][k] for k in group]),
            at_x=at_x,
            memory_bytes=opts.memory_bytes,
        )
        for k, s in zip(group, decided):
            stats[k] = s
            if not s.failed:
                row = result.inputs[checked[k]]
                row.max_abs_err, row.atol, row.rtol = s.max_abs, t.atol, t.rtol
                row.analytical, row.numerical = s.analytical, s.numerical
                over = (
                    ""
                    if not s.combined
                    else f" over all {len(group)} arguments"
                    if len(group) == len(checked)
                    else f" over the {len(group)} arguments of this tolerance"
                )
                row.reason = (
                    f"{s.probes} random probes v^T J u agree ({opts.probes} directions u{over} x "
                    f"{probes.weightings(opts.probes)} weightings v)"
                )
    failed = [k for k, s in enumerate(stats) if s.failed]
    if failed:
        names = ", ".join(repr(bound.names[checked[k]]) for k in failed)
        result.warnings.append(f"a random probe failed for {names}: checked element by element to explain it")
    result.mode = "probe" if not failed else "elementwise" if len(failed) == len(stats) else "probe+elementwise"
    return failed


def _half_only(ctx: CheckContext, result: CheckResult, why: str, start: float) -> CheckResult:
    """A Function that runs only in half precision: finite differences cannot judge it. The reference
    check does, where the spec gives a reference (a skip here); else an error that says how to give one
    (a skip under `checks: all`)."""
    if ctx.oracle is not None:
        return skip(result, f"{why}; the reference check judges it", start, row_reason="half precision only")
    advice = (
        "; compare it with a plain PyTorch implementation instead: add `reference: pkg.mod:fn` (same "
        "signature; it runs on float64 copies of the same inputs) and `checks: [reference]` to the spec, "
        "or pass --reference pkg.mod:fn (docs/how-to/kernels.md: kernels and references)"
    )
    if not ctx.named:
        return skip(result, why + advice, start, row_reason="half precision only")
    raise UserCodeError(ErrorKind.SPEC, f"backward cannot be checked: {why}{advice}")


def _reexamine(
    row: InputReport,
    entry: ArgumentComparison,
    calls: Calls,
    k: int,
    tol: Tolerance,
    columns: Columns,
    again: Optional[Again] = None,
    corners: Optional[tuple[ties.Held, int]] = None,
) -> bool:
    """Look again at the mismatching elements: one at a kink, a tie or a domain edge, where backward
    gives a one-sided derivative, or one whose finite differences lose to cancellation, where backward
    agrees with the estimate at the steps where they settle, is not a wrong gradient. The columns the
    comparison kept come first, worst first, then the others, worst first, their analytical columns made
    a batch at a time (``columns``: see ``kinks.analytical_columns``), until one element is confirmed
    wrong: that decides the fail, and the rest are not examined; no mismatch is left unexamined on a pass.
    A row limited by forward's precision goes to ``_imprecise`` (judged again with ``again``). True where
    finite differences cannot judge the row at all (``_imprecise``: no verdict on backward). The elements
    explained at a corner go to ``corners`` (where kept, and the argument's number; not from a row limited by
    precision), to be judged together (``tied.judge``). ``k``: the argument's place in ``calls.plain_inputs``
    (its copy there is the one finite differences move)."""
    if not row.mismatched or not entry.bad_columns:
        return False
    forward, plain, x, positions = calls.forward, calls.plain, calls.plain_inputs[k], calls.positions
    per = 2 if x.is_complex() else 1
    kept = {col: a_col for col, a_col, _ in entry.bad_columns}
    err = entry.err
    bad = entry.bad.nonzero().view(-1).tolist()
    worst: dict[int, float] = {}  # element -> its worst column's error
    for col in bad:
        worst[col // per] = max(worst.get(col // per, -1.0), float(err[col]))
    first = {col // per for col in kept}
    elements = sorted(worst, key=lambda e: (e not in first, -worst[e]))  # kept first, then the worst first
    order = [col for e in elements for col in range(e * per, e * per + per) if entry.bad[col]]
    verdicts: dict[int, kinks.Verdict] = {}
    mark = len(corners[0].items) if corners is not None else 0
    decided = False  # an element confirmed wrong (or finite differences limited by precision): stop where it costs
    for col, a_col in columns(order, kept):
        element = col // per
        if decided and element not in first and element not in verdicts:
            break
        verdict = kinks.examine(
            forward,
            plain,
            x,
            col,
            tol.eps,
            positions,
            a_col,
            atol=tol.atol,
            rtol=tol.rtol,
            index_text=f"{row.name}{unravel(element, x.shape)}",
        )
        if element not in verdicts or verdicts[element].explained:  # explained when all its parts are
            verdicts[element] = verdict
        if corners is not None and verdict.explained and verdict.sides is not None:
            part = f" ({'imaginary' if col % 2 else 'real'} part)" if x.is_complex() else ""
            name = f"{row.name}{unravel(element, x.shape)}{part}"
            corners[0].add(ties.corner(x, col, name, a_col, verdict.sides, corners[1]))
        decided = decided or not verdict.explained or verdict.kind == "precision"
    if any(v.kind == "precision" for v in verdicts.values()):
        if corners is not None:
            corners[0].since(mark)  # finite differences limited by rounding: no corner story
        examined = [e * per + k for e, v in verdicts.items() if v.kind == "precision" for k in range(per)]
        return _imprecise(row, list(verdicts.values()), tol, again, precision.sampled(examined, real_numel(x)))
    refuse_outside_domain([v.kind for v in verdicts.values()], x.numel(), x, row.name, tol)
    explained = [v for v in verdicts.values() if v.explained]
    if row.mismatched_indices is not None:  # an explained element is not a mismatch
        gone = [unravel(e, x.shape) for e, v in verdicts.items() if v.explained]
        row.mismatched_indices = [ix for ix in row.mismatched_indices if ix not in gone]
    wrong_at_kinks = [v.text for v in verdicts.values() if v.kind != "smooth" and not v.explained]
    at_kinks = [v for v in explained if v.kind != "cancellation"]
    unreliable = [v for v in explained if v.kind == "cancellation"]
    row.at_kinks, row.unreliable = len(at_kinks), len(unreliable)
    if explained and len(explained) == row.mismatched:  # every mismatch was examined and explained
        row.status, row.mismatched, row.diagnosis, row.ratio = Status.PASS, 0, None, None
        row.pattern = Pattern.KINK if at_kinks else None
        row.reason = "; ".join(_explained_text(at_kinks, unreliable) + [kinks.resample_hint(row.name)] * bool(at_kinks))
        return False
    if explained:
        row.mismatched -= len(explained)
        diagnose(row, entry, tuple(x.shape))
    unexamined = len(worst) - len(verdicts)
    notes = (
        wrong_at_kinks[:1]
        + [f"{len(explained)} more mismatching {_where(at_kinks, unreliable)} (not counted)"] * bool(explained)
        + [
            f"{unexamined} of the {row.mismatched} not looked at again for kinks or cancellation (one element "
            "confirmed wrong decides the fail)"
        ]
        * bool(unexamined and explained)
    )
    row.diagnosis = "; ".join([d for d in [row.diagnosis, *notes] if d])
    return False


def _explained_text(at_kinks: list[kinks.Verdict], unreliable: list[kinks.Verdict]) -> list[str]:
    """What the explained elements of a row that passes are, with an example of each kind."""
    texts = []
    if at_kinks:
        texts.append(
            f"{len(at_kinks)} element{'s' * (len(at_kinks) != 1)} at a kink, tie or domain edge, where "
            f"backward gives a one-sided derivative: {at_kinks[0].text}"
        )
    if unreliable:
        texts.append(
            f"{len(unreliable)} element{'s' * (len(unreliable) != 1)} where finite differences lose to "
            f"cancellation (not a wrong gradient): {unreliable[0].text}"
        )
    return texts


def _where(at_kinks: list[kinks.Verdict], unreliable: list[kinks.Verdict]) -> str:
    """Where the explained elements of a failing row are, in words."""
    parts = ["at a kink, tie or domain edge, where backward gives a one-sided derivative"] * bool(at_kinks) + [
        "where finite differences lose to cancellation and backward agrees with them where they settle"
    ] * bool(unreliable)
    return " or ".join(parts)


def _imprecise(
    row: InputReport,
    verdicts: list[kinks.Verdict],
    tol: Tolerance,
    again: Optional[Again] = None,
    cols: Sequence[int] = (),
) -> bool:
    """A row whose finite differences are limited by forward's precision (it computes in float32,
    or is quantised: see ``numerics.precision``): never a kink story. With ``again`` the row is
    judged again at a step that resolves that precision, with its tolerances (``_rejudge``, the step's
    error bound estimated at the real elements ``cols``); not
    where forward computes in half precision inside (no step up to ``precision.MAX_EPS`` resolves
    a grid of 8 or 11 bits, and its inputs' rounding moves the points themselves). Else, every
    mismatch examined within that rounding, or a half-precision grid: pattern PRECISION and the eps
    that resolves it, no verdict on backward (True). Else the gradient is wrong anyway: its pattern
    stays, the precision noted (False)."""
    coarse = sorted((v for v in verdicts if v.kind == "precision"), key=lambda v: v.step)
    median = coarse[len(coarse) // 2]
    half = GRID_DTYPES.get(median.grid) in HALF
    if again is not None and not half:
        decided = _rejudge(row, coarse, tol, again, cols)
        if decided is not None:
            return not decided
    advised = None if half else precision.advice(median.step, tol.eps, tol.atol)
    if advised is None:
        fix = (
            "give `reference: pkg.mod:fn` (a plain PyTorch implementation, run in float64) and `checks: "
            "[reference]` (no larger step resolves it; docs/how-to/kernels.md: kernels and references)"
        )
    else:
        eps, atol = advised
        setting = f"eps: {_yaml_number(eps)}" + (f", atol: {_yaml_number(atol)}" if atol is not None else "")
        fix = (
            f"set `tolerance: {{{setting}}}` in the spec (from Python: check(..., {setting.replace(': ', '=')})), "
            "or give `reference:`"
        )
    row.at_kinks = 0
    wrong = [v for v in verdicts if not v.explained]  # beyond the rounding, or where it did not limit
    if not wrong or half:  # in half precision an element's samples may hide the grid: its "wrong" is rounding too
        row.pattern, row.ratio = Pattern.PRECISION, None
        row.diagnosis = (
            f"finite differences cannot check it at eps={tol.eps:g}: forward's outputs change in steps of about "
            f"{median.step:.2g} ({STEPS_ARE.format(grid=median.grid)}), so they measure those steps, not the "
            f"derivative (no verdict on backward); {fix}; e.g. {median.text}"
        )
        return True
    closer = f"forward's precision limits finite differences at eps={tol.eps:g} too: to check closer, {fix}"
    row.diagnosis = "; ".join(d for d in [row.diagnosis, wrong[0].text, closer] if d)
    return False


def _rejudge(
    row: InputReport, coarse: list[kinks.Verdict], tol: Tolerance, again: Again, cols: Sequence[int]
) -> Optional[bool]:
    """Judge ``row`` again, element by element, with the tolerances of the precision seen (``coarse``:
    its precision verdicts, by step; the spec's atol and rtol where it set them), at the step of
    ``precision.CANDIDATES`` whose error bound (truncation and rounding, from steps h and h/2) takes
    the smallest share of the tolerance at the elements ``cols``, each element by the bound of that
    step (``precision.decide``): within the tolerance less the bound everywhere is a pass, beyond it
    plus the bound anywhere a fail, and in between there is no verdict, never a pass. A pass is a pass
    with a warning that says what was and was not checked (under --strict a fail that says so); a
    fail gives the numbers there. True where judged, False where the finite differences cannot decide
    (the row says why); None where no step is left, or the user's code raises there, or the work is
    too large (the row is untouched)."""
    median = coarse[len(coarse) // 2]  # a few entries' values fit in fewer bits by chance: their step is overestimated
    grid = median.grid
    low = tol.at_least(GRID_DTYPES.get(grid, torch.float32))
    atol, rtol = low.atol, low.rtol
    try:
        chosen = again.step(cols, tol.eps, atol, rtol)
        if chosen is None:
            return None
        eps = chosen.eps
        decision = again.decide(chosen.steps, atol, rtol)
        trial = copy(row)
        again.judge(trial, replace(tol, eps=eps, atol=atol, rtol=rtol))
    except UserCodeError:  # forward raises at the larger step (a domain it checks), or the work is too large
        return None
    take(row, trial)
    given = "the spec's" if {"atol", "rtol"} & set(tol.given) else grid or "float32"
    inside = f"{grid} or lower precision" if grid else "low precision"
    what = (
        f"forward computes in {inside} inside, so finite differences at eps={tol.eps:g} "
        f"measure rounding: judged at eps {eps:g} with {given} tolerances (atol {atol:g}, rtol {rtol:g})"
    )
    how = (
        f"eps {eps:g} is the step whose error bound (from steps {eps:g} and {eps / 2:g}, and rounding: forward's "
        "own curvature) takes the least of the tolerance"
    )
    example = ""
    if decision.example is not None:
        col, a, n, bound, limit = decision.example
        per = 2 if row.dtype.startswith("complex") else 1
        example = (
            f"at {row.name}{unravel(col // per, tuple(row.shape))} backward gives {a:.6g} where finite differences "
            f"give {n:.6g} +- {bound:.2g}, their error bound (the tolerance is {limit:.2g})"
        )
    if decision.failed:  # beyond the tolerance and the bound: the comparison's own numbers stand
        if row.status is not Status.FAIL:
            row.status, row.mismatched = Status.FAIL, max(row.mismatched or 0, decision.failed)
        found = row.diagnosis or f"{row.mismatched} of {row.numel} elements out of tolerance"
        row.diagnosis = f"{what}: {found}; {example}; {how}"
        return True
    if decision.undecided:
        inner = row.diagnosis if row.pattern is Pattern.PRECISION and row.diagnosis else ""  # its advice stands
        row.status, row.pattern, row.ratio, row.at_kinks = Status.FAIL, Pattern.PRECISION, None, 0
        row.mismatched = decision.undecided
        row.diagnosis = (
            f"{what}: {inner}"
            if inner
            else (
                f"{what}; {how}: {decision.undecided} of {decision.undecided + decision.passed} elements lie within "
                "that bound of the tolerance's edge, so finite differences cannot decide (no verdict on backward: "
                f"it is not a pass); e.g. {example}; give `reference: pkg.mod:fn` (a plain PyTorch implementation, "
                "run in float64) and `checks: [reference]` for a tighter check"
            )
        )
        return False
    row.status, row.mismatched = Status.PASS, 0  # every element within the tolerance less its bound
    if tol.strict:  # agreeing at a step and tolerance the user did not choose
        setting = ", ".join(
            f"{k}: {_yaml_number(v)}"
            for k, v, was in (("eps", eps, tol.eps), ("atol", atol, tol.atol), ("rtol", rtol, tol.rtol))
            if v != was
        )
        row.status, row.pattern, row.ratio = Status.FAIL, Pattern.PRECISION, None
        row.diagnosis = (
            f"{what}, it agrees; --strict does not count a check limited by forward's precision as a "
            f"pass: set `tolerance: {{{setting}}}` in the spec to choose that check, or give "
            "`reference: pkg.mod:fn` for a tighter one"
        )
    else:
        row.pattern, row.ratio = Pattern.PRECISION, None  # a factor below rtol is float32 noise here
        row.diagnosis = "; ".join(
            [
                f"{what}; {how}, and every element is within the tolerance less that bound; a relative error "
                f"below about {rtol:g} cannot be seen this way; give `reference: pkg.mod:fn` for a tighter check",
                *([row.reason] if row.at_kinks and row.reason else []),
            ]
        )
    return True


def _again(ctx: CheckContext, calls: Calls, leaf: torch.Tensor, k: int, i: int) -> Again:
    """How argument ``i`` (``leaf`` its leaf in the graph of ``calls.outputs``, ``calls.plain_inputs[k]``
    its copy inside ``calls.plain`` that finite differences move) is judged again at another tolerance:
    compared element by element as ``_check`` does (same layout, memory bound and budget), its row refilled
    and reexamined; and the step to judge it at, from the finite differences at a few of its elements."""
    forward, batched, backward = calls.forward, calls.batched, calls.backward
    outputs, positions, plain, x = calls.outputs, calls.positions, calls.plain, calls.plain_inputs[k]
    opts = ctx.options

    def judge(row: InputReport, t: Tolerance) -> None:
        layout, (entry,) = compare(
            forward,
            outputs,
            positions,
            [leaf],
            plain,
            [x],
            eps=t.eps,
            atol=t.atol,
            rtol=t.rtol,
            memory_bytes=opts.memory_bytes,
            grad=backward,
            streams=ctx.streams,
            batched=batched,
            budget=work_limit(ctx, "backward", [i], outputs, positions, fast=True),
            compress=opts.compress,
        )
        fresh = blank(row)
        fill_jacobian(fresh, entry, layout, ctx.bound.values[i], outputs)
        _reexamine(fresh, entry, calls, k, t, calls.columns(leaf, opts.memory_bytes))  # no third judgement
        take(row, fresh)

    def step(cols: Sequence[int], eps: float, atol: float, rtol: float) -> Optional[precision.Judged]:
        return precision.judged_step(forward, plain, x, cols, positions, eps, atol, rtol)

    def decide(steps: Sequence[float], atol: float, rtol: float) -> precision.Decision:
        n = real_numel(x)
        work_limit(ctx, "backward", [i], outputs, positions, fast=True)(4 * n * len(steps), 1)
        columns = kinks.analytical_columns(backward, outputs, positions, leaf, range(n), {}, opts.memory_bytes)
        return precision.decide(forward, plain, x, columns, positions, steps, atol, rtol)

    return Again(judge, step, decide)


def _yaml_number(v: float) -> str:
    """A float as YAML reads it: 0.001 -> '0.001', 1e-05 -> '1.0e-5' (YAML needs the dot)."""
    text = f"{v:g}"
    return text if "e" not in text else f"{v:.1e}".replace("e-0", "e-").replace("e+0", "e+")


def _strict(
    row: InputReport, entry: ArgumentComparison, calls: Calls, k: int, w: torch.Tensor, eps: float, streams: Streams
) -> None:
    """--strict: a systematic factor r (within tolerance, constant everywhere) fails when |r - 1| is
    well beyond the finite differences' own error, estimated along one random direction u (from
    steps eps and eps/2, and the outputs' rounding), and the analytical u^T J^T w shows the same factor there.
    ``k``: the argument's place in ``calls.plain_inputs``."""
    assert row.ratio is not None  # a SYSTEMATIC row has its ratio
    x = calls.plain_inputs[k]
    # signs: each element moves by the full eps, as in a column of the Jacobian, so the truncation error is alike
    u = torch.sign(signed_uniform((real_numel(x),), streams.generator(Stream.STRICT)))
    d, err = precision.directional(calls.forward, calls.plain, x, u, eps, calls.positions, w)
    a = float(entry.proj_a @ u)
    own = err / abs(d) if d else float("inf")  # relative
    off = min(abs(row.ratio - 1), abs(a / d - 1) if d else 0.0)
    factor = ratio_text(row.ratio, entry.rtol)
    if off > STRICT_MARGIN * own:
        row.status = Status.FAIL
        row.diagnosis = (
            f"analytical is {factor} numerical everywhere: within tolerance, but the finite "
            f"differences' own error is only about {own:.1g} (from steps eps and eps/2, and rounding), "
            f"so that is a systematic factor (a constant slightly off?); strict fails it"
        )
    else:
        row.diagnosis = (
            f"within tolerance, analytical is {factor} numerical everywhere; the finite differences' own "
            f"error (about {own:.1g}) could explain that, so strict lets it pass"
        )


def _determinism(
    calls: Calls, inputs: list[torch.Tensor], names: list[str], gen: torch.Generator, nondet_tol: float, repeat: int
) -> list[str]:
    """Backward ``repeat`` times with the same signed random grad_output must agree within nondet_tol
    (at ``calls.outputs``' compared positions, with respect to ``inputs``)."""
    live = [calls.outputs[p] for p in calls.positions if calls.outputs[p].requires_grad]
    if not live or not inputs:
        return []
    probes = [probe_like(o, gen) for o in live]
    runs = [
        guarded(ErrorKind.BACKWARD, "backward", vjp, live, inputs, [p.clone() for p in probes]) for _ in range(repeat)
    ]
    problems = []
    for name, first, *rest in zip(names, *runs):
        if first is None or any(g is None for g in rest):
            continue
        spread = max(contract.max_difference(first, g) for g in rest)
        if not spread <= nondet_tol:
            problems.append(
                f"backward is not deterministic for '{name}': {repeat} calls with the same grad_output "
                f"differ by up to {spread:.3g}; {contract.nondet_hint(spread)}"
            )
    return problems


def _not_judged(result: CheckResult, row: InputReport) -> None:
    """A row finite differences cannot judge (forward's precision, at any step) where the reference check
    judges it: not checked, and why in the message. Without a reference it stays a fail that says what to
    do, named or under `checks: all` alike (`all` is never laxer than the default check, which this is)."""
    words = (
        f"{row.diagnosis.split('; ')[0]}; the reference check judges it"
        if row.diagnosis
        else "the reference check judges it"
    )
    result.warnings.append(f"'{row.name}' not checked: {words}")
    row.status, row.reason, row.mismatched = Status.SKIP, NO_VERDICT, 0


def wrong(r: InputReport) -> Optional[str]:
    """What the check's message says of a failing row (None: nothing beyond the problems already said)."""
    if r.diagnosis:
        return f"gradient of '{r.name}': {r.diagnosis}"
    return f"gradient of '{r.name}' is wrong" if r.mismatched else None


def within(right: list[InputReport]) -> str:
    """The check's message where every row compared is right."""
    return f"{len(right)} argument{'s' * (len(right) != 1)} checked, all within tolerance"


def _finish(result: CheckResult, found: contract.Findings, more: list[str], start: float) -> CheckResult:
    """Status and message of the check from the rows and the contract findings."""
    for i in found.bad_args:
        result.inputs[i].status = Status.FAIL
        result.inputs[i].reason = result.inputs[i].reason or "backward's contract is broken (see below)"
    for r in result.inputs:
        if r.status is Status.PASS and (r.at_kinks or r.unreliable or r.diagnosis):
            result.warnings.append(f"'{r.name}': {r.diagnosis or r.reason}")

    return conclude(
        result,
        start,
        found.failures + more,
        wrong,
        within,
        nothing=(
            "finite differences cannot judge it (forward's precision: see the warnings)"
            if any(r.reason == NO_VERDICT for r in result.inputs)
            else "no argument requires grad: nothing to compare"
        ),
    )
