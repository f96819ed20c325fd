"""Backward's contract, read off the raw values a Function's backward returns.

The raw return values are seen by calling the graph node's ``apply`` directly, as the autograd
engine does, so that what autograd would repair or reject (extra gradients, casts, sums over
broadcast dimensions, in-place changes) is seen as the user wrote it. ``in_use`` adds what
autograd's use of backward needs of any target: linearity in grad_output, and undefined output
gradients treated as zeros.

``inspect`` also runs on every rank of a distributed case, each rank in lockstep with the others (``World``):
where one rank stops, every rank stops at the same point, so that the collectives inside forward and backward
stay matched; and a collective that sums into a tensor changes it, even where its values stay as they were
(over one rank). Alone, ``ALONE``: this process decides by itself, and only values show a change.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from functools import partial
from typing import Any, Callable, Optional

import torch

from ...core.tolerance import Tolerance
from ...numerics import as_tuple, is_float_tensor
from ...numerics.realify import Vjp, strided
from ...numerics.streams import Stream, Streams
from ...results import ErrorKind
from ...sandbox.errors import guarded
from ...subject.binding import Bound
from ...subject.target import Target
from . import linearity, undefined
from .base import call_forward, fresh_leaves, probe_like


@dataclass
class Findings:
    """What the contract inspection found. ``fatal``: autograd itself would reject backward."""

    failures: list[str] = field(default_factory=list)
    warnings: list[str] = field(default_factory=list)
    fatal: bool = False
    bad_args: set[int] = field(default_factory=set)
    repeated: bool = False  # backward was called twice with the same grad_output and compared
    graph: Optional[tuple[list[Any], tuple[Any, ...]]] = None  # (leaves, outputs) of the inspected forward
    # copies of the arguments as forward found them (``fresh_leaves`` without grad), left as they were: where
    # ``graph`` is set, what the finite differences may move
    copies: Optional[list[Any]] = None
    probe: Optional[tuple[list[Any], tuple[Any, ...]]] = None  # (grad_outputs, backward's return), as autograd's
    # where ``probe`` is set: backward called again on the same node, as the engine would call it, with the
    # grad_outputs given by output position (the others those of ``probe``): its raw return, as autograd's
    again: Optional[Callable[[dict[int, torch.Tensor]], tuple[Any, ...]]] = None

    def fail(self, message: str, fatal: bool = False, arg: Optional[int] = None) -> None:
        self.failures.append(message)
        self.fatal = self.fatal or fatal
        if arg is not None:
            self.bad_args.add(arg)


def _alone(stop: bool) -> bool:
    return stop


def _unseen(tensor: torch.Tensor) -> bool:
    return False


def _quiet(what: str) -> None:
    return None


@dataclass(frozen=True)
class World:
    """The processes that run ``inspect`` together (the ranks of a distributed case), as ``inspect`` sees them.

    ``agree(stop)``: whether any process stops here (each says whether it does; every one asks at the same
    points); ``wrote(t)``: whether a collective summed into ``t``'s storage since the inspection began (a change
    even where the values stay, as over one rank); ``enter(what)``: forward or backward runs next (a rank's
    progress). The rule for the next contributor: every call of user code that may hold a collective must be
    reached by every process alike, so any early return goes through ``agree``."""

    agree: Callable[[bool], bool] = _alone
    wrote: Callable[[torch.Tensor], bool] = _unseen
    enter: Callable[[str], None] = _quiet


ALONE = World()


def inspect(
    target: Target, bound: Bound, gen: torch.Generator, nondet_tol: float, repeat: int = 2, world: World = ALONE
) -> Findings:
    """Call backward directly on a fresh graph and check what it returns and what it touches;
    ``repeat`` calls with the same grad_output must agree within ``nondet_tol``. ``world``: the processes
    that run it together (``World``)."""
    found = Findings()
    leaves = fresh_leaves(bound.values)
    copies = fresh_leaves(leaves, grad=False)  # a tensor passed twice is one copy, as in ``leaves``
    before = [v if isinstance(v, torch.Tensor) else None for v in copies]
    world.enter("forward")
    outputs = as_tuple(call_forward(target, bound, leaves))
    after_forward = [
        b if b is None or same_values(v.detach(), b) and not world.wrote(v) else v.detach().clone()  # copied
        for v, b in zip(leaves, before)  # again where changed
    ]
    for i, (b, a) in enumerate(zip(before, after_forward)):
        if b is not None and a is not None and a is not b:
            found.fail(
                f"forward modified '{bound.names[i]}' in place without ctx.mark_dirty: work on a copy "
                f"(x = x.clone()), or mark it with ctx.mark_dirty({bound.names[i]}) and return it; autograd "
                "does not know of the change, and every finite difference would be taken on a changed "
                "input",
                fatal=True,
                arg=i,
            )
    node = next((o.grad_fn for o in outputs if isinstance(o, torch.Tensor) and o.grad_fn is not None), None)
    alien = node is None or getattr(type(node), "_forward_cls", None) is not target.obj
    if not found.fatal:
        found.graph = leaves, outputs  # node.apply below leaves the graph as it was (unless fatal)
        found.copies = copies
        if alien:
            found.warnings.append(
                "backward's raw return values could not be inspected: no output carries this Function's graph node"
            )
    if world.agree(found.fatal or alien):
        return found
    assert node is not None  # not alien here
    grads_in = [
        (probe_like(o, gen) if is_float_tensor(o) and o.requires_grad else torch.zeros_like(o))
        if isinstance(o, torch.Tensor)
        else None
        for o in outputs
    ]
    apply = node.apply  # type: ignore[attr-defined]  # a Function's node (BackwardCFunction) has apply
    kept = [g.clone() if g is not None else None for g in grads_in]
    world.enter("backward")
    with torch.no_grad():
        first = _values(guarded(ErrorKind.BACKWARD, "backward", apply, *grads_in))
    returned = tuple(g.detach().clone() if isinstance(g, torch.Tensor) else g for g in first)  # as they were
    _check_returned(first, leaves, bound, found)
    for i, (g, k) in enumerate(zip(grads_in, kept)):
        if g is not None and k is not None and (not torch.equal(g, k) or world.wrote(g)):
            found.fail(
                f"backward modified grad_output{f' {i}' if len(kept) > 1 else ''} in place: "
                "clone it before changing it (grad_output may be shared with other parts of the graph)"
            )
    for i, (v, b) in enumerate(zip(leaves, after_forward)):
        if b is not None and (not same_values(v.detach(), b) or world.wrote(v)):
            found.fail(
                f"backward modified input '{bound.names[i]}' in place: work on a copy "
                "(autograd refuses a saved tensor that was changed, and the gradients are wrong)",
                fatal=True,
                arg=i,
            )
    if not world.agree(found.fatal):
        with torch.no_grad():
            again = [
                _values(
                    guarded(
                        ErrorKind.BACKWARD,
                        "backward (called again)",
                        apply,
                        *[k.clone() if k is not None else None for k in kept],
                    )
                )
                for _ in range(repeat - 1)
            ]
        _check_repeat(first, again, bound, nondet_tol, found)
        found.repeated = True
    if not found.failures and not found.warnings:  # autograd would pass the returned values on as they are
        found.probe = kept, returned
        found.again = partial(_again, apply, kept)
    return found


def in_use(
    found: Findings,
    target: Target,
    bound: Bound,
    graph: tuple[list[Any], tuple[Any, ...]],
    positions: list[int],
    checked: list[int],
    backward: Vjp,
    given: Optional[tuple[list[Any], list[Any]]],
    streams: Streams,
    tol: Tolerance,
) -> None:
    """Backward as autograd uses it, on the check's graph (leaves, outputs; left as it was): linear in
    grad_output (see ``linearity``), and undefined output gradients (None after
    ``ctx.set_materialize_grads(False)``) treated as zeros, as the ``undefined_grad`` check and
    torch.autograd.gradcheck's ``check_undefined_grad`` test it. ``backward``: ``vjp``'s signature;
    ``given``: a signed grad_output per output and the gradients of the ``checked`` arguments that
    backward returned for it (or None). What is wrong is a failure in ``found``, naming the arguments."""
    leaves, outputs = graph
    live = [outputs[p] for p in positions if outputs[p].requires_grad]
    if not live or not checked:
        return
    dense = ([given[0][p] for p in positions], given[1]) if given is not None else None
    message, bad = linearity.examine(
        backward,
        live,
        positions,
        [leaves[i] for i in checked],
        [bound.names[i] for i in checked],
        dense,
        streams.generator(Stream.LINEARITY),
        tol,
    )
    if message:
        found.failures.append(message)
        found.bad_args.update(checked[k] for k in bad)
    seen = undefined.situations(target, bound.names, leaves, outputs, positions, checked, streams, tol.nondet_tol)
    if seen is not None:
        problems, args = undefined.findings(seen, bound.names, bound.values, tol.nondet_tol)
        found.failures += problems
        found.bad_args |= args


def _again(apply: Callable[..., Any], kept: list[Any], given: dict[int, torch.Tensor]) -> tuple[Any, ...]:
    """``Findings.again``: the node's backward with ``given`` grad_outputs (by output position) and copies of
    the inspected call's for the other outputs (zeros, as autograd materialises them)."""
    grads = [given[p] if p in given else k.clone() if k is not None else None for p, k in enumerate(kept)]
    with torch.no_grad():
        return _values(guarded(ErrorKind.BACKWARD, "backward", apply, *grads))


def _values(returned: Any) -> tuple[Any, ...]:
    """What backward returned, as a tuple, sparse gradients as their dense values (autograd accepts them)."""
    return tuple(strided(g) if isinstance(g, torch.Tensor) else g for g in as_tuple(returned))


def _check_returned(grads: tuple[Any, ...], leaves: list[Any], bound: Bound, found: Findings) -> None:
    n_in, names = len(leaves), bound.names
    if len(grads) < n_in or any(g is not None for g in grads[n_in:]):
        listed = ", ".join(names)
        found.fail(
            f"backward returned {len(grads)} gradient{'s' * (len(grads) != 1)}, but forward takes "
            f"{n_in} input{'s' * (n_in != 1)} ({listed}): return one per input, None for those "
            "without a gradient",
            fatal=True,
        )
        return
    for i, (v, g) in enumerate(zip(leaves, grads)):
        name = names[i]
        if not isinstance(v, torch.Tensor):
            if g is not None:
                found.fail(
                    f"backward returned a gradient for '{name}', which is not a tensor "
                    f"({type(v).__name__}): return None in position {i}",
                    fatal=True,
                    arg=i,
                )
            continue
        if g is None or not v.requires_grad:
            continue
        if not isinstance(g, torch.Tensor):
            found.fail(
                f"backward returned a {type(g).__name__} for '{name}': return a tensor or None", fatal=True, arg=i
            )
            continue
        if g.shape != v.shape:
            if _expandable(v.shape, g.shape):
                found.warnings.append(
                    f"backward returned shape {list(g.shape)} for '{name}' of shape "
                    f"{list(v.shape)}; autograd sums it down, but returning the input's "
                    "shape is clearer"
                )
            else:
                found.fail(
                    f"backward returned shape {list(g.shape)} for '{name}' of shape {list(v.shape)}: "
                    "a gradient has its input's shape",
                    fatal=True,
                    arg=i,
                )
        if g.device != v.device:
            found.fail(
                f"backward returned the gradient of '{name}' on {g.device}, but '{name}' is on "
                f"{v.device}: create it on the input's device",
                fatal=True,
                arg=i,
            )
        elif g.dtype != v.dtype:
            found.fail(
                f"backward returned a {str(g.dtype)[6:]} gradient for {str(v.dtype)[6:]} '{name}': "
                "autograd casts it silently, losing precision; compute it in the input's dtype",
                arg=i,
            )


def _expandable(shape: torch.Size, to: torch.Size) -> bool:
    try:
        return torch.broadcast_shapes(shape, to) == to
    except RuntimeError:
        return False


def _check_repeat(
    first: tuple[Any, ...], again: list[tuple[Any, ...]], bound: Bound, nondet_tol: float, found: Findings
) -> None:
    for i, a in enumerate(first):
        others = [o[i] for o in again if i < len(o) and isinstance(o[i], torch.Tensor)]
        if not isinstance(a, torch.Tensor) or any(b.shape != a.shape for b in others):
            continue
        spread = max((max_difference(a, b) for b in others), default=0.0)
        if not spread <= nondet_tol:
            found.fail(
                f"backward returned different values for '{bound.names[i]}' when called {len(again) + 1} "
                f"times with the same grad_output (max difference {spread:.3g}): it keeps or changes state "
                f"between calls, or is nondeterministic; {nondet_hint(spread)}",
                arg=i,
            )


def same_values(a: torch.Tensor, b: torch.Tensor) -> bool:
    """Whether two tensors hold the same values, NaN where NaN (torch.equal calls NaN unequal); a sparse
    gradient by its values."""
    a, b = strided(a), strided(b)
    if torch.equal(a, b):
        return True
    if a.shape != b.shape or a.dtype != b.dtype or not (a.is_floating_point() or a.is_complex()):
        return False
    return bool(torch.allclose(a, b, rtol=0.0, atol=0.0, equal_nan=True))


def max_difference(a: torch.Tensor, b: torch.Tensor) -> float:
    """The largest difference between two gradients that backward returned for one argument with
    the same grad_output; 0 where they are equal, NaN where NaN (a backward that returns NaN every
    time is deterministic: the check of its values says what is wrong)."""
    a, b = strided(a), strided(b)
    if (
        a.numel() == 0
        or a.dtype == b.dtype
        and (torch.equal(a, b) or bool(torch.allclose(a, b, rtol=0.0, atol=0.0, equal_nan=True)))
    ):
        return 0.0
    return float((a.detach() - b.detach()).abs().max())


def nondet_hint(spread: float) -> str:
    """What to write in the spec when the nondeterminism is expected (e.g. atomic adds on a GPU)."""
    suggest = 10.0 ** math.ceil(math.log10(spread * 10)) if spread > 0 and math.isfinite(spread) else 1e-6
    return f"if that is expected (atomic adds on a GPU do this), set tolerance: {{nondet_tol: {suggest:g}}}"
