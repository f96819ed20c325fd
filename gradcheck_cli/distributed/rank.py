"""What every rank runs, in lockstep with the others: join the process group, backward's contract (as in one
process: ``checks.contract.inspect``, every rank stopping where one does), forward and backward with
its grad_outputs, then the forwards of finite differences, every rank through the same list of moves
(an element moves on the rank that holds it, or on every rank for a replicate argument), so that the
collectives inside forward stay matched. A rank answers with its gradients, its replicate outputs and
its share of the objective at each move, and what the contract found; the coordinator does the sums.

A rank's collectives as gradcheck-cli sees them (``_watch``): each call counted and named (the coordinator's
view of where a rank is), and the tensors that summing collectives write into while backward's contract is
inspected (an all-reduce into grad_output changes it, even over one rank, where its values stay). The ranks'
own agreement on whether to go on (``checks.contract.World``) runs on a process group of its own, so that it
never pairs with one of the user's collective calls. For the next contributor: the agreement is the only
collective gradcheck-cli calls itself; every rank calls it at the same points of ``contract.inspect``, and it
must stay out of the user's group (a mismatched pair would hang or corrupt the user's next collective) and out
of the counts the timeout message reports."""

from __future__ import annotations

import datetime
import inspect
import re
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any, Callable, Optional

import torch

from ..checks.parts.contract import Findings, World
from ..numerics import as_tuple
from ..numerics.differences import elements
from ..numerics.streams import Streams
from ..results import ErrorKind
from ..sandbox.errors import UserCodeError
from .launch import BACKWARD, COLLECTIVE_NAMES, DIFFERENCES, DONE, FORWARD, Progress, RankError, user_error
from .placements import Moves, Placement, grad_output, share

SUMMING = ("all_reduce", "reduce", "reduce_scatter", "reduce_scatter_tensor")  # write a sum (or product) in place
_written: Optional[list[torch.Tensor]] = None  # while ``_recording``: what summing collectives wrote into
_originals: dict[str, Any] = {}  # torch.distributed's own functions, by name, where ``_watch`` wrapped them
CONTRACT = re.compile(r"returned an (?:invalid gradient at index (\d+)|incorrect number of gradients)")  # autograd's
# torch's refusal of backward in a process forked after autograd started its device threads (a GPU is visible
# and the forking process ran backward): said as what it is, not as the user's backward failing
AUTOGRAD_FORK = "Unable to handle autograd's threading in combination with fork-based multiprocessing"
FORKED_AFTER_BACKWARD = (
    "torch refuses backward in this rank: it was forked from a process that had run backward on a machine "
    "with a GPU (autograd's device threads cannot be forked). The command line checks each distributed case "
    "in a fresh worker that has not: leave out --no-isolate; from Python, check distributed cases in a "
    "process that has not run backward yet"
)


@dataclass
class Plan:
    """What every rank needs, made by the coordinator before it forks the ranks."""

    size: int
    backend: str
    rendezvous: str  # a file no rank has opened yet: the ranks meet in it (no TCP port to be taken meanwhile)
    timeout: float
    device: str  # cpu, or cuda (rank r on cuda:r)
    call: Callable[[list[Any]], Any]  # the target on one value per argument
    values: list[list[Any]]  # per rank: its value of each argument
    checked: list[int]  # the argument positions whose gradient is checked
    moves: list[Moves]  # per checked argument
    eps: list[float]  # per checked argument
    outputs: tuple[str, ...]  # the spec's output placements (none: every output replicate)
    streams: Streams
    # backward's contract on one value per argument, as ``checks.contract.inspect`` (None: not a Function)
    contract: Optional[Callable[[list[Any], World], Findings]] = None
    # backward as autograd uses it, on this rank's graph, as ``checks.contract.in_use``: its failures and the
    # checked arguments they concern; given the values (the leaves), the outputs, the differentiable outputs'
    # positions, and the grad_output per output position with the gradients backward returned for it
    in_use: Optional[Callable[[list[Any], tuple[Any, ...], list[int], tuple[list[Any], list[Any]]], Findings]] = None


def run(plan: Plan, rank: int, progress: Progress) -> dict[str, Any]:
    """The body of rank ``rank``."""
    torch.set_num_threads(1)
    _watch(progress)
    device = f"cuda:{rank}" if plan.device.startswith("cuda") else "cpu"
    if device != "cpu":
        torch.cuda.set_device(rank)
    progress.phase(1)
    try:
        torch.distributed.init_process_group(
            plan.backend,
            store=torch.distributed.FileStore(plan.rendezvous, plan.size),  # type: ignore[attr-defined]
            rank=rank,
            world_size=plan.size,
            timeout=datetime.timedelta(seconds=2 * plan.timeout + 10),  # the coordinator's timeout decides first
        )
    except Exception as exc:  # noqa: BLE001 - the machine (its files, the backend's network), not the user's code
        raise RankError(
            ErrorKind.DEVICE,
            f"could not join the process group ({plan.backend}, {plan.rendezvous}): {type(exc).__name__}: {exc}",
        ) from None
    values = [v.to(device) if isinstance(v, torch.Tensor) else v for v in plan.values[rank]]
    for i in plan.checked:
        values[i] = values[i].detach().requires_grad_(True)
    found = _contract(plan, values, progress, device, rank)
    if found["stopped"]:  # a rank's backward broke its contract where autograd would refuse it: none goes on
        return {"contract": found}
    progress.phase(FORWARD)
    outs = _call(plan, values)
    if any(isinstance(y, torch.Tensor) and y.is_complex() for y in outs):
        raise RankError(
            ErrorKind.SPEC, "outputs: forward returns a complex tensor: not checked under `distributed` yet"
        )
    # the differentiable outputs (as torch.autograd.gradcheck takes them): floating, and requiring grad
    positions = [
        p for p, y in enumerate(outs) if isinstance(y, torch.Tensor) and y.is_floating_point() and y.requires_grad
    ]
    if not positions:
        raise RankError(
            ErrorKind.FORWARD,
            "no output of forward requires grad (mark_non_differentiable, or computed without autograd): "
            "there is no gradient to check",
        )
    placements = _placements(plan, outs, positions)
    grads_out = [grad_output(outs[p], placements[k], p, rank, plan.size, plan.streams) for k, p in enumerate(positions)]
    progress.phase(BACKWARD)
    try:
        grads = torch.autograd.grad(  # on copies of grad_outputs: the objective keeps them (the contract
            [outs[p] for p in positions],  # says where backward changes them)
            [values[i] for i in plan.checked],
            [g.clone() for g in grads_out],
            allow_unused=True,
            retain_graph=plan.in_use is not None,  # called again there
        )
    except Exception as exc:  # noqa: BLE001 - the user's backward raised, or autograd rejected what it returned
        if AUTOGRAD_FORK in str(exc):
            raise RankError(ErrorKind.DEVICE, f"rank {rank}: {FORKED_AFTER_BACKWARD}") from None
        error = user_error(ErrorKind.BACKWARD, "backward", exc, getattr(exc, "_gradcheck_collective", ""))
        rejected = CONTRACT.search(str(exc))
        if rejected:
            error.broken = int(rejected.group(1)) if rejected.group(1) else -1
            error.message = f"backward's contract is broken: {exc}"
        raise error from None
    in_use = plan.in_use
    if in_use is not None:  # every rank, in lockstep: the calls of backward are the same on each
        by_position: list[Any] = [None] * len(outs)
        for k, p in enumerate(positions):
            by_position[p] = grads_out[k]
        used = _user_code(rank, lambda: in_use(values, outs, positions, (by_position, list(grads))))
        found["failures"] += used.failures
        found["bad"] = sorted(set(found["bad"]) | used.bad_args)
    gradients = [
        g.detach().cpu() if g is not None else torch.zeros(values[i].shape, dtype=values[i].dtype)
        for g, i in zip(grads or [None] * len(plan.checked), plan.checked)
    ]
    replicated = [outs[p].detach().cpu() for k, p in enumerate(positions) if placements[k].kind == "replicate"]
    shapes = [list(outs[p].shape) for p in positions]
    progress.phase(DIFFERENCES)
    plain = [v.detach().clone() if isinstance(v, torch.Tensor) else v for v in values]
    objective = torch.zeros(sum(int(m.owner.numel()) for m in plan.moves), 2, dtype=torch.float64)
    row = 0
    with torch.no_grad():
        for k, i in enumerate(plan.checked):
            element = elements(plain[i])
            owners, indices = plan.moves[k].owner.tolist(), plan.moves[k].index.tolist()
            for owner, index in zip(owners, indices):
                for side, step in enumerate((-plan.eps[k], plan.eps[k])):
                    moved = element(index).to(step) if owner in (-1, rank) else None
                    if moved is not None:
                        moved.apply()
                    try:
                        ys = _call(plan, plain)
                    finally:
                        if moved is not None:
                            moved.restore()
                    objective[row, side] = share([ys[p] for p in positions], grads_out, placements, rank)
                    progress.step()
                row += 1
    progress.phase(DONE)
    return {"grads": gradients, "replicated": replicated, "shapes": shapes, "objective": objective, "contract": found}


def _user_code(rank: int, inspect: Callable[[], Findings]) -> Findings:
    """``inspect()``, a part of backward's contract that calls the user's code, with what it raised as this
    rank reports it."""
    try:
        return inspect()
    except UserCodeError as exc:
        if AUTOGRAD_FORK in str(exc):
            raise RankError(ErrorKind.DEVICE, f"rank {rank}: {FORKED_AFTER_BACKWARD}") from None
        raise RankError(
            exc.kind, str(exc), exc.where, exc.frames, getattr(exc.__cause__, "_gradcheck_collective", "")
        ) from None


def _call(plan: Plan, values: list[Any]) -> tuple[Any, ...]:
    try:
        return as_tuple(plan.call(values))
    except Exception as exc:  # noqa: BLE001 - the user's forward raised
        raise user_error(ErrorKind.FORWARD, "forward", exc, getattr(exc, "_gradcheck_collective", "")) from None


def _placements(plan: Plan, outs: tuple[Any, ...], positions: list[int]) -> list[Placement]:
    """Each floating output's placement, as the spec's ``outputs`` gives them (one per tensor output)."""
    if not plan.outputs:
        return [Placement("replicate")] * len(positions)
    tensors = [p for p, y in enumerate(outs) if isinstance(y, torch.Tensor)]
    if len(tensors) != len(plan.outputs):
        raise RankError(
            ErrorKind.SPEC,
            f"outputs: forward returns {len(tensors)} tensor{'s' * (len(tensors) != 1)} and `outputs` places "
            f"{len(plan.outputs)}: give one placement per tensor output, in order",
        )
    by_position = dict(zip(tensors, plan.outputs))
    return [Placement.of(by_position[p]) for p in positions]


def _contract(plan: Plan, values: list[Any], progress: Progress, device: str, rank: int) -> dict[str, Any]:
    """Backward's contract on this rank, in lockstep with the others: what it found (its failures, warnings,
    the arguments they concern, whether autograd would refuse what backward returned) and whether every rank
    stops here (``stopped``: one rank's contract is broken beyond what autograd accepts)."""
    found = Findings()
    if plan.contract is not None:
        contract = plan.contract
        with _recording() as written:
            world = _world(progress, device, written)
            found = _user_code(rank, lambda: contract(values, world))
            stopped = world.agree(found.fatal)
    else:
        stopped = False
    return {
        "failures": found.failures,
        "warnings": found.warnings,
        "bad": sorted(found.bad_args),
        "fatal": found.fatal,
        "stopped": stopped,
    }


def _watch(progress: Progress) -> None:
    """Count this rank's collective calls and note the one it is in (torch.distributed's functions as the
    user's code finds them on the module; this is a forked rank: the coordinator keeps the originals), and
    note what the summing ones write into while ``_recording``."""
    import torch.distributed as dist
    import torch.distributed.distributed_c10d as c10d

    for name in COLLECTIVE_NAMES[1:]:
        original = getattr(c10d, name, None)
        if original is None:
            continue
        signature = inspect.signature(original) if name in SUMMING else None
        _originals[name] = original

        def watched(
            *args: Any, __name: str = name, __original: Any = original, __signature: Any = signature, **kwargs: Any
        ) -> Any:
            if __signature is not None and _written is not None:
                _note(__signature, args, kwargs)
            progress.enter(__name)
            try:
                return __original(*args, **kwargs)
            except BaseException as exc:
                try:
                    exc._gradcheck_collective = __name  # type: ignore[attr-defined]
                except AttributeError:
                    pass
                raise
            finally:
                progress.leave()

        for module in (dist, c10d):
            if getattr(module, name, None) is original:
                setattr(module, name, watched)


def _note(signature: inspect.Signature, args: tuple[Any, ...], kwargs: dict[str, Any]) -> None:
    """A summing collective's call: its output tensor (its first parameter), noted where it sums or multiplies."""
    try:
        bound = signature.bind(*args, **kwargs)
    except TypeError:  # the call itself raises, as the user's code will see
        return
    bound.apply_defaults()
    values = list(bound.arguments.values())
    op = bound.arguments.get("op")
    reduce = torch.distributed.ReduceOp
    if values and isinstance(values[0], torch.Tensor) and (op == reduce.SUM or op == reduce.PRODUCT):
        assert _written is not None
        _written.append(values[0])  # kept alive: its storage cannot be reused while the inspection compares


@contextmanager
def _recording() -> Iterator[list[torch.Tensor]]:
    """Note what summing collectives write into, in the block (the tensors themselves)."""
    global _written
    _written = []
    try:
        yield _written
    finally:
        _written = None


def _world(progress: Progress, device: str, written: list[torch.Tensor]) -> World:
    """The ranks as ``contract.inspect`` sees them: their agreement (any rank stops: all stop), the writes of
    summing collectives (``written``, from ``_recording``), and the phases (forward, backward) for the
    coordinator. Made on every rank (it creates the agreement's process group, a collective)."""
    import torch.distributed as dist
    import torch.distributed.distributed_c10d as c10d

    group = dist.new_group(backend="gloo") if dist.is_gloo_available() else None
    where = "cpu" if group is not None else device
    all_reduce = _originals.get("all_reduce", c10d.all_reduce)

    def agree(stop: bool) -> bool:
        flag = torch.tensor([int(stop)], dtype=torch.int64, device=where)
        progress.agreeing()
        try:
            all_reduce(flag, op=dist.ReduceOp.MAX, group=group)
        finally:
            progress.leave()
        return bool(flag.item())

    def wrote(tensor: torch.Tensor) -> bool:
        storage = _storage(tensor)
        return storage is not None and any(_storage(w) == storage for w in written)

    def enter(what: str) -> None:
        progress.phase(FORWARD if what == "forward" else BACKWARD)

    return World(agree, wrote, enter)


def _storage(tensor: torch.Tensor) -> Optional[int]:
    """Where ``tensor``'s storage lies (None: it has none, a sparse tensor)."""
    try:
        return int(tensor.untyped_storage().data_ptr())
    except (RuntimeError, NotImplementedError):
        return None
