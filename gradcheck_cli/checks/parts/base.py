"""What every check gets and shares: its context (target, bound arguments, device, options),
and calling the user's forward safely."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field, replace
from typing import Any, Callable, NamedTuple, Optional

import torch

from ...core.options import MEMORY_BYTES
from ...core.rng import seed_plus
from ...core.tolerance import Tolerance
from ...numerics import as_tuple, is_float_tensor, real_numel
from ...numerics.batching import stage_budget
from ...numerics.streams import RngFork, Streams, signed_uniform
from ...results import ErrorKind
from ...sandbox.errors import UserCodeError, guarded
from ...subject.binding import Bound
from ...subject.devices import memory_problem
from ...subject.oracle import Oracle
from ...subject.target import Target
from .argument_rows import short

IN_PLACE_ON_LEAF = "a leaf Variable that requires grad"  # autograd's error for an in-place change of a leaf
HALF = (torch.float16, torch.bfloat16)  # finite differences in these measure rounding, not derivatives
WORK_LIMIT = 10**11  # calls x tensor elements per call: an element-by-element check beyond this takes hours


@dataclass(frozen=True)
class Options:
    """How every check compares: the tolerances, the memory budget, and the run's options (--fast's
    probes, --no-compress). What one check alone reads from the spec is its own (``CheckContext.settings``)."""

    tolerance: Tolerance = field(default_factory=Tolerance)
    memory_bytes: int = MEMORY_BYTES
    probes: int = 0  # > 0: decide with this many signed random probes, element by element only if one fails
    compress: bool = True  # compressed finite differences where the Jacobian is sparse (see numerics.compressed)


@dataclass
class CheckContext:
    """Everything a check reads: ``run(ctx) -> CheckResult`` is the one interface of the checks.

    ``devices`` are all the devices the case lists (the first is the reference of
    device_consistency); ``rebind(device)`` gives the same arguments, drawn again from the seed,
    on another device (None where there is no spec to draw from). A check the Function cannot
    support fails when it was ``named`` and skips under ``checks: all``. ``oracle`` is what the
    spec's ``reference``/``reference_backward`` name, loaded when the case runs the reference check.
    ``streams`` are the random streams of this attempt at the case, which the arguments were drawn from.
    ``settings`` are the spec's keys that a check owns (``x-check`` in the schema: ``repeat``, ``compile``),
    by key, as the spec gave them (a key not given is absent); each check builds its own ``Settings``.
    """

    target: Target
    bound: Bound
    device: str = "cpu"
    options: Options = field(default_factory=Options)
    devices: tuple[str, ...] = ()
    rebind: Optional[Callable[[str], Bound]] = None
    named: bool = True  # the check was named (`checks: [...]`, --check NAME), not run under `all`
    oracle: Optional[Oracle] = None  # the reference implementation the spec names, for the reference check
    settings: Mapping[str, Any] = field(default_factory=dict)

    @property
    def tolerance(self) -> Tolerance:
        return self.options.tolerance

    @property
    def streams(self) -> Streams:
        return self.bound.streams


class EightBitOutput(UserCodeError):
    """Forward returned an 8-bit float: no finite difference judges a gradient through it (``call_forward``).
    A check that meets it skips where the reference check judges the Function or under `checks: all`
    (``broken.instead_of_error``); named with no reference, it is the case's forward error. ``why``: the
    message without its advice (where the reference check judges it, none is needed)."""

    ADVICE = (
        "; return the value before the cast to 8 bits (cast outside the Function), "
        "or compare a wider kernel with `reference:`"
    )

    def __init__(self, what: str, dtype: torch.dtype, position: int) -> None:
        self.why = (
            f"{what} returned a {str(dtype)[6:]} tensor (output {position}): 8-bit floats step by an eighth "
            "or more of their value, so no gradient can be judged through them by finite differences"
        )
        super().__init__(ErrorKind.FORWARD, self.why + self.ADVICE)


def call_forward(
    target: Target,
    bound: Bound,
    values: Sequence[Any],
    kind: ErrorKind = ErrorKind.FORWARD,
    what: str = "forward",
    eight_bit: bool = False,
) -> Any:
    """The target's forward on ``values`` (arguments in ``bound``'s order), user errors labelled
    ``kind`` / ``what`` (as in ``guarded``). An 8-bit float output is a forward error (no finite
    difference can judge a gradient through it) unless ``eight_bit``: a check that compares two
    computations of the same values (the reference check) differentiates through no step.

    The global RNG is forked around every forward: each starts from a state seeded from
    ``bound.streams`` and the user's state is put back after, so a forward that draws random numbers
    (dropout) draws the same ones in every call of a check (the graph forward and each
    finite-difference forward), in any process, and the user's RNG is left as it was.
    """
    if bound.rng is None:
        bound.rng = RngFork.capture(bound.values, bound.streams)
    bound.rng.restore()
    try:
        arguments = bound.transformed(values)  # `param:` / symmetric maps applied; lists and dicts at the call
        if bound.clone_inputs is None:
            out = _first_call(target, bound, arguments, kind, what)
        else:
            called = copies(arguments) if bound.clone_inputs else arguments
            out = guarded(kind, what, target.call, bound.assemble(called), bound.n_positional, bound.kw_names)
    finally:
        bound.rng.release()
    if not isinstance(out, torch.Tensor) and not any(isinstance(o, torch.Tensor) for o in as_tuple(out)):
        raise UserCodeError(
            ErrorKind.FORWARD,
            f"{what} returned {_returned(out)}, not a tensor or a tuple of tensors: "
            "there is no output to differentiate (a missing `return`?)",
        )
    eight = [
        (p, o)
        for p, o in enumerate(as_tuple(out))
        if not eight_bit and isinstance(o, torch.Tensor) and o.is_floating_point() and o.dtype.itemsize == 1
    ]
    if eight:
        p, o = eight[0]
        raise EightBitOutput(what, o.dtype, p)
    return out


def _first_call(target: Target, bound: Bound, values: Sequence[Any], kind: ErrorKind, what: str) -> Any:
    """The case's first forward (``values``: one per leaf, as ``Bound.transformed`` gives them), which
    finds an in-place target: one that changes an argument and returns it (``ctx.mark_dirty``), which
    autograd refuses on a leaf that requires grad after forward changed it. Its arguments are then put
    back as they were, and this and every later call is on copies (``bound.clone_inputs``). A forward
    that changes an argument without returning it is left to the backward contract, which fails that
    undeclared change."""
    kept = [v.detach().clone() if isinstance(v, torch.Tensor) else None for v in values]
    versions = [v._version if isinstance(v, torch.Tensor) else 0 for v in values]
    out: Any = None
    try:
        out = guarded(kind, what, target.call, bound.assemble(values), bound.n_positional, bound.kw_names)
        changed = [v for v, n in zip(values, versions) if isinstance(v, torch.Tensor) and v._version != n]
        in_place = any(o is v for o in as_tuple(out) for v in changed)
    except UserCodeError as exc:
        if IN_PLACE_ON_LEAF not in str(exc):
            raise
        in_place = True
    bound.clone_inputs = bound.found_in_place = in_place
    if not in_place:
        return out
    with torch.no_grad():
        for v, k in zip(values, kept):
            if isinstance(v, torch.Tensor) and k is not None and not torch.equal(v, k):
                v.copy_(k)
    if bound.rng:
        bound.rng.restore()
    return guarded(kind, what, target.call, bound.assemble(copies(values)), bound.n_positional, bound.kw_names)


def copies(values: Sequence[Any]) -> list[Any]:
    """The values with each tensor replaced by a clone (in the graph: its gradient flows to the
    original), aliasing kept: what an in-place forward may change instead of the arguments."""
    made: dict[int, Any] = {}
    return [made.setdefault(id(v), v.clone()) if isinstance(v, torch.Tensor) else v for v in values]


def _returned(value: Any) -> str:
    """What a forward returned, in a message: 'None', "an int (3)", 'a list of 2 floats'."""
    if value is None:
        return "None"
    kind = type(value).__name__
    if isinstance(value, (list, tuple)):
        inner = sorted({type(v).__name__ for v in value})
        return f"a {kind} of {len(value)} {'/'.join(inner) or 'values'}" + ("s" * (len(value) != 1 and len(inner) == 1))
    article = "an" if kind[:1] in "aeiou" else "a"
    return f"{article} {kind} ({short(value)})"


def draws_random(target: Target, bound: Bound, outputs: tuple[Any, ...]) -> bool:
    """Whether forward draws random numbers: its floating outputs (``outputs``, from ``bound``'s own random
    state) change when every forward starts from the state of another seed."""
    other = replace(bound, rng=None, streams=Streams(seed_plus(bound.streams.seed, 1)))
    again = as_tuple(call_forward(target, other, fresh_leaves(bound.values)))
    return any(
        is_float_tensor(a) and not torch.equal(a.detach(), b.detach())
        for a, b in zip(again, outputs)
        if isinstance(b, torch.Tensor) and a.shape == b.shape
    )


def fresh_leaves(values: list[Any], grad: bool = True) -> list[Any]:
    """Detached copies of the tensor arguments, aliasing and strides preserved.

    With ``grad`` they keep each argument's requires_grad (leaves of a new graph); without,
    none requires grad (copies to perturb for finite differences).
    """
    copies: dict[int, Any] = {}
    out = []
    for v in values:
        if isinstance(v, torch.Tensor):
            if id(v) not in copies:
                copies[id(v)] = v.detach().clone().requires_grad_(grad and v.requires_grad)
            out.append(copies[id(v)])
        else:
            out.append(v)
    return out


def probe_like(t: torch.Tensor, gen: torch.Generator) -> torch.Tensor:
    """A signed random probe (see ``signed_uniform``) with ``t``'s shape, dtype and device, drawn on the CPU."""
    real = signed_uniform(t.shape + ((2,) if t.is_complex() else ()), gen)
    probe = torch.view_as_complex(real) if t.is_complex() else real
    return probe.to(device=t.device, dtype=t.dtype)


def differentiable(outputs: tuple[Any, ...]) -> list[int]:
    """Positions of the outputs a backward flows through (floating-point tensors that require grad)."""
    return [p for p, o in enumerate(outputs) if is_float_tensor(o) and o.requires_grad]


class Graph(NamedTuple):
    """A forward in a new graph (``graph_forward``)."""

    leaves: list[Any]  # fresh leaves of the arguments
    outputs: tuple[Any, ...]  # forward's outputs on them
    positions: list[int]  # the outputs a backward flows through


def graph_forward(target: Target, bound: Bound) -> Graph:
    """Fresh leaves of ``bound``'s values, forward's outputs on them, and the differentiable ones' positions."""
    leaves = fresh_leaves(bound.values)
    outputs = as_tuple(call_forward(target, bound, leaves))
    return Graph(leaves, outputs, differentiable(outputs))


def refuse_if_too_big(ctx: CheckContext, outputs: tuple[Any, ...]) -> None:
    """On a GPU: an out_of_memory error result, before starting, when the check will not fit in
    free GPU memory: its arguments and outputs with their copies, and a stage of batched calls
    (one-hot grad_outputs, perturbed arguments: on the device, within their share of
    --max-memory). The Jacobian entries are held on the CPU, within --max-memory; work that would
    not finish in reasonable time is refused by ``work_limit``."""
    refusal = memory_problem(ctx.bound.values, outputs, ctx.device, stage_budget(ctx.options.memory_bytes))
    if refusal:
        raise UserCodeError(ErrorKind.OUT_OF_MEMORY, refusal)


def work_limit(
    ctx: CheckContext,
    check: str,
    checked: Sequence[int],
    outputs: tuple[Any, ...],
    positions: Sequence[int],
    fast: bool = False,
) -> Callable[[int, int], None]:
    """The ``budget`` of ``numerics.compare`` (``calls`` of forward and backward, ``passes`` over
    the analytical rows): an element-by-element comparison whose calls, each over all the
    arguments' and outputs' elements, come to more than WORK_LIMIT element visits would not finish
    in reasonable time; ``check`` is refused before it starts, with the sizes and what to do
    (``fast``: the check has --fast's random probes)."""
    bound = ctx.bound
    size = sum(real_numel(v) for v in bound.values if isinstance(v, torch.Tensor))
    size += sum(real_numel(o) for o in outputs if isinstance(o, torch.Tensor))
    shapes = ", ".join(f"'{bound.names[i]}' {list(bound.values[i].shape)}" for i in checked)
    outs = ", ".join(str(list(outputs[p].shape)) for p in positions)
    remedy = (
        "use --fast (a few random probes v^T J u per argument, element by element only where one fails), "
        "or smaller shapes in the spec"
        if fast
        else f"give {check} smaller shapes (a case of its own in the spec), or leave it out for these shapes"
    )

    def budget(calls: int, passes: int) -> None:
        if calls * size <= WORK_LIMIT:
            return
        memory = (
            f", as the analytical rows do not fit in --max-memory {ctx.options.memory_bytes / 2**20:g} MB and "
            f"are recomputed for each of {passes:,} blocks of columns (a larger --max-memory needs fewer)"
            if passes > 1
            else ""
        )
        raise UserCodeError(
            ErrorKind.TOO_LARGE,
            (
                f"the {check} check was not started: comparing {shapes} with output{'s' * (len(positions) != 1)} "
                f"{outs} element by element takes about {calls:,} calls, each over {size:,} tensor elements{memory}: "
                f"{calls * size:.1e} element visits, beyond the {WORK_LIMIT:.0e} that finish in reasonable time; "
                f"{remedy}"
            ),
        )

    return budget


def half_precision(bound: Bound, checked: list[int], order: str) -> Optional[str]:
    """Why finite differences cannot judge ``order`` (e.g. "the second derivative") of a Function whose
    checked arguments include float16 or bfloat16 tensors, or None: its steps and values round at about
    1e-3 relative, so the differences measure rounding (the reference check judges such kernels)."""
    half = [i for i in checked if isinstance(bound.values[i], torch.Tensor) and bound.values[i].dtype in HALF]
    if not half:
        return None
    names = ", ".join(repr(bound.names[i]) for i in half)
    dtypes = " / ".join(sorted({str(bound.values[i].dtype)[6:] for i in half}))
    return (
        f"{names} {'is' if len(half) == 1 else 'are'} {dtypes}: finite differences in half precision measure "
        f"its rounding (about 1e-3 relative), not {order}, so they cannot judge it; the reference check "
        "judges a half-precision kernel against a plain PyTorch implementation (`reference: pkg.mod:fn`)"
    )
