"""A case under ``distributed:``: the arguments of every rank, the world started and ended, and the
backward check's result with a row per argument and rank: backward's contract as in one process (every rank
inspects its own, ``checks.contract``; what it finds is said in one process's words, with the ranks that
found it where there are several), then the gradients against finite differences of the global objective.
Other checks are skipped with the reason."""

from __future__ import annotations

import copy
import dataclasses
import os
import sys
import time
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any, Callable, Optional

import torch

from ..checks import backward
from ..checks.parts import broken, contract, verdict
from ..checks.parts.argument_rows import skeleton
from ..checks.parts.contract import World
from ..core.rng import seed_plus
from ..core.tolerance import Limits, Tolerance, same, within
from ..numerics.realify import vjp
from ..numerics.streams import Stream, Streams
from ..results import CaseResult, CheckResult, ErrorKind, InputReport, Status
from ..sandbox.errors import BindError, UserCodeError
from ..spec import Case, Container, TensorArg
from ..subject.binding import Bound
from ..subject.target import Target
from . import judge, launch, placements, rank

RANK_STRIDE = 7_777_777  # rank r's per_rank arguments are drawn with seed + r * RANK_STRIDE
ONLY_BACKWARD = "not run across ranks: under `distributed`, gradcheck-cli checks backward only"
BROKEN = "backward's contract is broken (see below)"  # a row's reason, as in one process


def unavailable(backend: str, device: str, size: int) -> str:
    """Why the world cannot run here ('' when it can)."""
    if not hasattr(os, "fork"):
        return (
            f"the ranks are forked processes, and {sys.platform} cannot fork: run distributed cases on Linux or macOS"
        )
    if not torch.distributed.is_available():
        return "torch.distributed is not available in this build of torch"
    if backend == "nccl":
        if not device.startswith("cuda"):
            return "backend nccl runs on CUDA devices (one GPU per rank): use `--device cuda`, or backend gloo"
        if not torch.distributed.is_nccl_available():
            return "backend nccl is not available in this build of torch"
        found = torch.cuda.device_count() if torch.cuda.is_available() else 0
        if found < size:
            return f"world_size {size} with nccl needs {size} GPUs (one per rank); this machine has {found}"
    elif not torch.distributed.is_gloo_available():
        return "backend gloo is not available in this build of torch"
    elif device.startswith("cuda"):
        return "backend gloo runs the ranks on the CPU: use backend nccl for `--device cuda`"
    return ""


def run(
    target: Target, case: Case, device: str, bind: Callable[[str, Streams], Bound], streams: Streams, result: CaseResult
) -> None:
    """Check ``case`` across ranks; append the checks' results to ``result`` (raises what makes it an error)."""
    config = case.distributed
    assert config is not None
    size = config.world_size
    backend = config.backend or ("nccl" if device.startswith("cuda") else "gloo")
    problem = unavailable(backend, device, size)
    if problem:
        result.checks = [CheckResult(name, Status.SKIP, message=problem) for name in case.checks]
        return
    _refuse(target, case)
    first = bind("cpu", streams)  # on the CPU: a CUDA context must not exist before the ranks are forked
    placed = [placements.Placement.of(e.placement if isinstance(e, TensorArg) else None) for e in first.entries] + [
        placements.Placement("replicate")
    ] * (len(first.values) - len(first.entries))
    own = any(p.kind == "per_rank" for p in placed)
    bounds = [first] + [
        bind("cpu", Streams(seed_plus(streams.seed, r * RANK_STRIDE))) if own else first for r in range(1, size)
    ]
    begun = verdict.begin(first, "backward", f"distributed: {size} rank{'s' * (size != 1)}, {backend}")
    if not begun.checked:
        raise BindError(
            "inputs",
            f"no argument is a tensor that requires grad, so there is no gradient to check, and {case.function} "
            "was not called: give it a floating-point tensor argument (`shape: [...]`)",
        )
    for i in begun.checked:
        _fits(first, i, placed[i], size)
    values = [
        [
            (b if placed[i].kind == "per_rank" else first).values[i]
            if not isinstance(first.values[i], torch.Tensor)
            else placements.local((b if placed[i].kind == "per_rank" else first).values[i], placed[i], r, size)
            for i in range(len(first.values))
        ]
        for r, b in enumerate(bounds)
    ]
    shapes = [tuple(first.values[i].shape) for i in begun.checked]
    tolerances = [case.tolerance.at_least(first.values[i].dtype, eps=True) for i in begun.checked]
    plan = rank.Plan(
        size=size,
        backend=backend,
        rendezvous="",  # launch.meeting's file, below
        timeout=config.timeout,
        device=device,
        call=lambda vs: target.call(first.arguments(vs), first.n_positional, first.kw_names),
        values=values,
        checked=list(begun.checked),
        moves=[placements.moves(placed[i], s, size) for i, s in zip(begun.checked, shapes)],
        eps=[t.eps for t in tolerances],
        outputs=case.outputs,
        streams=streams,
        contract=_inspection(target, case, first, streams) if target.is_function else None,
        in_use=_in_use(target, first, list(begun.checked), streams, tolerances),
    )
    _warm()
    try:
        with launch.meeting() as plan.rendezvous:
            answers = launch.run_world(size, lambda r, progress: rank.run(plan, r, progress), config.timeout)
    except launch.WorldFailure as exc:
        if exc.kind is ErrorKind.BACKWARD and (exc.error is None or exc.error.broken is None):
            result.checks = [
                _raised(begun, exc, plan) if name == "backward" else _skipped(first, name) for name in case.checks
            ]
            return
        if exc.error is None or exc.error.broken is None:
            raise UserCodeError(exc.kind, exc.message, exc.where, exc.frames) from None
        result.checks = [
            _broken(begun, exc, plan) if name == "backward" else _skipped(first, name) for name in case.checks
        ]
        return
    found = [a["contract"] for a in answers]
    if any(f["stopped"] for f in found):
        result.checks = [
            _refused(begun, found, plan) if name == "backward" else _skipped(first, name) for name in case.checks
        ]
        return
    _agree(answers, case)
    result.checks = [
        _judge(begun, answers, plan, placed, shapes, tolerances) if name == "backward" else _skipped(first, name)
        for name in case.checks
    ]


def _inspection(
    target: Target, case: Case, first: Bound, streams: Streams
) -> Callable[[list[Any], World], contract.Findings]:
    """Backward's contract on a rank's values, as the backward check inspects it in one process: the same
    grad_outputs (its random stream), calls and tolerance."""
    given = case.setting("repeat")
    repeat = backward.Settings().repeat if given is None else given

    def inspect(values: list[Any], world: World) -> contract.Findings:
        bound = dataclasses.replace(first, values=values, rng=None)
        return contract.inspect(
            target, bound, streams.generator(Stream.BACKWARD), case.tolerance.nondet_tol, repeat, world
        )

    return inspect


def _in_use(
    target: Target, first: Bound, checked: list[int], streams: Streams, tolerances: list[Tolerance]
) -> Callable[[list[Any], tuple[Any, ...], list[int], tuple[list[Any], list[Any]]], contract.Findings]:
    """Backward as autograd uses it (linear in grad_output, undefined output gradients as zeros) on a rank's
    graph, as the backward check looks at it in one process (``contract.in_use``): the same random streams,
    calls, and tolerance (the loosest of the checked arguments')."""
    loosest = max(tolerances, key=lambda t: (t.atol, t.rtol))

    def in_use(
        values: list[Any], outputs: tuple[Any, ...], positions: list[int], given: tuple[list[Any], list[Any]]
    ) -> contract.Findings:
        found = contract.Findings()
        bound = dataclasses.replace(first, values=values, rng=None)
        contract.in_use(found, target, bound, (values, outputs), positions, checked, vjp, given, streams, loosest)
        return found

    return in_use


def _said(lists: list[list[str]], size: int) -> list[str]:
    """The ranks' messages, each once, in order of first appearance: as one process words them, after the ranks
    that said it where the world has more than one."""
    ranks: dict[str, list[int]] = {}
    for r, messages in enumerate(lists):
        for message in messages:
            ranks.setdefault(message, []).append(r)
    if size == 1:
        return list(ranks)
    return [f"rank{'s' * (len(rs) > 1)} {', '.join(map(str, rs))}: {message}" for message, rs in ranks.items()]


def _by_rank(begun: verdict.Begun, plan: rank.Plan, mark: Callable[[int, int, InputReport], None]) -> list[InputReport]:
    """The check's rows: a checked argument ``i``'s row once per rank ``r`` (``x@rank1``, with that rank's shape),
    marked by ``mark(i, r, row)``; the other arguments' rows as they are."""
    rows: list[InputReport] = []
    for i, row in enumerate(begun.rows):
        if i not in begun.checked:
            rows.append(row)
            continue
        for r in range(plan.size):
            one = copy.copy(row)
            one.name, one.shape = f"{row.name}@rank{r}", list(plan.values[r][i].shape)
            mark(i, r, one)
            rows.append(one)
    return rows


def _refused(begun: verdict.Begun, found: list[dict[str, Any]], plan: rank.Plan) -> CheckResult:
    """The backward check's fail where a rank's backward broke its contract beyond what autograd accepts (every
    rank stopped there), as in one process: the arguments it concerns fail on the ranks where it did, the
    other rows are not compared."""

    def mark(i: int, r: int, row: InputReport) -> None:
        row.status, row.reason = Status.FAIL if i in found[r]["bad"] else Status.SKIP, BROKEN

    begun.result.inputs = _by_rank(begun, plan, mark)
    begun.result.warnings += _said([f["warnings"] for f in found], plan.size)
    with _one_process_names(begun.result, plan.size):
        return verdict.conclude(
            begun.result,
            begun.start,
            _said([f["failures"] for f in found], plan.size),
            lambda row: None,
            lambda right: "",  # never: a contract failure stopped it
        )


def _raised(begun: verdict.Begun, failure: launch.WorldFailure, plan: rank.Plan) -> CheckResult:
    """The backward check's fail where the ranks' backward raised on valid inputs, as in one process
    (``broken.raised``), after the ranks that raised it where more than one did."""
    first = failure.error
    ranks = sorted(r for r, e in failure.errors.items() if first is not None and e.message == first.message)
    said = failure.message.split(": ", 1)[1] if plan.size == 1 or len(ranks) > 1 else failure.message
    if plan.size > 1 and len(ranks) > 1:
        said = f"ranks {', '.join(map(str, ranks))}: {said}"
    begun.result.inputs = _by_rank(begun, plan, lambda i, r, row: None)
    with _one_process_names(begun.result, plan.size):
        return broken.raised(
            begun.result, UserCodeError(failure.kind, said, failure.where, failure.frames), begun.start
        )


def _skipped(bound: Bound, name: str) -> CheckResult:
    """Check ``name``, not run across ranks: a skip with the reason."""
    return verdict.skip(CheckResult(name, Status.PASS, inputs=skeleton(bound)), ONLY_BACKWARD, time.perf_counter())


def _broken(begun: verdict.Begun, failure: launch.WorldFailure, plan: rank.Plan) -> CheckResult:
    """The backward check's fail where autograd rejected what the ranks' backward returned (its contract): the
    rows of the arguments (every one, for a wrong count) of the ranks where it did fail, the others are not
    compared."""
    broken = {r: e.broken for r, e in failure.errors.items() if e.broken is not None}

    def mark(i: int, r: int, row: InputReport) -> None:
        hit = r in broken and broken[r] in (-1, row.index)
        row.status = Status.FAIL if hit else Status.SKIP
        row.reason = BROKEN if hit else "not compared (see the message)"

    begun.result.inputs = _by_rank(begun, plan, mark)
    ranks = sorted(broken)
    message = (
        failure.message
        if len(ranks) < 2
        else f"ranks {', '.join(map(str, ranks))}: " + failure.message.split(": ", 1)[1]
    )
    begun.result.problems = [message]
    return verdict.skip(begun.result, message, begun.start, Status.FAIL, "not compared (see the message)")


def _judge(
    begun: verdict.Begun,
    answers: list[dict[str, Any]],
    plan: rank.Plan,
    placed: list[placements.Placement],
    shapes: list[tuple[int, ...]],
    tolerances: list[Any],
) -> CheckResult:
    """The backward check's result: the rows of every rank, and what they show together."""
    size = plan.size
    objective = torch.stack([a["objective"] for a in answers]).sum(0)  # the global objective at each move
    spans = torch.tensor([0] + [int(m.owner.numel()) for m in plan.moves]).cumsum(0).tolist()
    replaced: dict[int, list[InputReport]] = {}
    problems: list[str] = []
    for k, i in enumerate(plan.checked):
        part = objective[spans[k] : spans[k + 1]]
        numerical = (part[:, 1] - part[:, 0]) / (2 * plan.eps[k])  # central differences of L
        grads = [a["grads"][k] for a in answers]
        wanted = [placements.expected(numerical, placed[i], shapes[k], r, size) for r in range(size)]
        limits = Limits(tolerances[k].atol, tolerances[k].rtol)
        ranked = judge.rows(begun.rows[i], grads, wanted, limits)
        full = numerical.view(size, *shapes[k]) if placed[i].kind == "per_rank" else numerical.view(shapes[k])
        said = judge.across_ranks(begun.rows[i].name, placed[i], grads, wanted, full, ranked, limits)
        if said:
            problems.append(said)
        replaced[i] = ranked
    found = [a["contract"] for a in answers]
    contract_only: set[int] = set()  # the rows that fail for the contract alone (said in its words)
    for i in plan.checked:
        for r, row in enumerate(replaced[i]):
            if i in found[r]["bad"]:
                if row.status is Status.PASS:
                    contract_only.add(id(row))
                row.status, row.reason = Status.FAIL, row.reason or BROKEN
    begun.result.inputs = [row for i, one in enumerate(begun.rows) for row in replaced.get(i, [one])]
    begun.result.warnings += _said([f["warnings"] for f in found], size)
    said_for = set(problems)
    problems = _said([f["failures"] for f in found], size) + problems

    def wrong(row: InputReport) -> Optional[str]:
        if row.diagnosis in said_for or id(row) in contract_only:
            return None
        if size == 1:
            return backward.wrong(row)
        return f"gradient of '{row.name}' is wrong" + (f": {row.diagnosis}" if row.diagnosis else "")

    with _one_process_names(begun.result, size):
        return verdict.conclude(
            begun.result,
            begun.start,
            problems,
            wrong,
            lambda right: (
                backward.within(right)
                if size == 1
                else f"every rank's gradient of {verdict.labels(_arguments(right))} matches finite differences "
                f"of the global objective ({size} ranks)"
            ),
        )


@contextmanager
def _one_process_names(result: CheckResult, size: int) -> Iterator[None]:
    """Over one rank, the rows by their arguments' names ('x', not 'x@rank0') while the message is made: the
    words of one process's verdict, which a world of one must give."""
    names = [row.name for row in result.inputs]
    if size == 1:
        for row in result.inputs:
            row.name = row.name.removesuffix("@rank0")
    try:
        yield
    finally:
        for row, name in zip(result.inputs, names):
            row.name = name


def _arguments(rows: list[InputReport]) -> list[InputReport]:
    """One row per argument (the rank 0 rows), for messages."""
    seen: dict[str, InputReport] = {}
    for row in rows:
        name = row.name.rpartition("@rank")[0] or row.name
        seen.setdefault(name, InputReport(row.index, name, row.shape, row.dtype, row.status))
    return list(seen.values())


def _warm() -> None:
    """Import once, here, what torch loads on a process's first backward with grad_outputs (sympy, through
    torch.fx): each forked rank would otherwise load it again. Imported, not run: on a machine with a GPU
    (or another accelerator) autograd's first backward starts its device threads, and torch then refuses
    backward in every process forked after it (``rank.AUTOGRAD_FORK``)."""
    import torch.fx.experimental.symbolic_shapes  # noqa: F401


def _agree(answers: list[dict[str, Any]], case: Case) -> None:
    """Replicate outputs hold the same values on every rank; shard outputs the same shape."""
    for k, first in enumerate(answers[0]["replicated"]):
        for r, answer in enumerate(answers[1:], start=1):
            other = answer["replicated"][k]
            limits = same(first.dtype)
            if other.shape != first.shape or not bool(within(other, first, limits.atol, limits.rtol).all()):
                raise UserCodeError(
                    ErrorKind.FORWARD,
                    f"replicate output {k} differs between rank 0 and rank {r}"
                    + (f" (shapes {list(first.shape)} and {list(other.shape)})" if other.shape != first.shape else "")
                    + ": forward is missing a collective (an all-reduce?), or give the output its placement in "
                    "`outputs:` (partial, per_rank or shard(d))",
                )
    for r, answer in enumerate(answers[1:], start=1):
        if answer["shapes"] != answers[0]["shapes"]:
            raise UserCodeError(
                ErrorKind.FORWARD,
                f"rank {r}'s outputs have shapes {answer['shapes']}, rank 0's {answers[0]['shapes']}: "
                "gradcheck-cli takes outputs of the same shape on every rank (shard(d): equal chunks)",
            )


def _refuse(target: Target, case: Case) -> None:
    """What a distributed case cannot hold yet, said as a spec error."""
    if target.is_module:
        raise BindError(
            "distributed",
            "an nn.Module class is not checked across ranks yet: name a Function, or a function that builds "
            "and calls the module",
        )
    if case.expect is not None:
        raise BindError("expect", "`expect:` is not supported under `distributed` yet: drop it")
    if any(isinstance(arg, Container) for arg in [*case.inputs, *(arg for _, arg in case.kwargs)]):
        raise BindError("inputs", "`list:` and `dict:` arguments are not supported under `distributed` yet")


def _fits(bound: Bound, i: int, placement: placements.Placement, size: int) -> None:
    """A checked argument that its placement can split, and real."""
    value = bound.values[i]
    if value.is_complex():
        raise BindError(
            f"inputs[{i}]", f"'{bound.names[i]}' is complex: only real tensors are checked under `distributed`"
        )
    if placement.kind == "shard":
        d = placement.dim or 0
        if not -value.dim() <= d < max(value.dim(), 1) or value.dim() == 0 or value.shape[d] % size:
            raise BindError(
                f"inputs[{i}].placement",
                f"'{bound.names[i]}' of shape {list(value.shape)} cannot be split along dim {d} into {size} equal "
                "chunks: give it a shape whose size along that dim is a multiple of world_size",
            )
