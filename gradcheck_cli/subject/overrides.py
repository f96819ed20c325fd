"""``--shape NAME=DIMS`` and ``--values NAME=KIND``: a case whose tensor arguments are drawn at other shapes,
or with simpler values than its spec says (how a shrunk case is replayed). Spec data in, spec data out: no
torch here."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import replace

from ..spec import Arg, Case, TensorArg
from ..spec.model import BOUNDS, DIST_DEFAULTS
from ..spec.rules import not_matrices, square_example

KINDS = ("zeros", "ones", "integers")  # simpler values, the simplest first
SMALL = 3  # integers: from -3 to 3, where the spec's values allow them
Shapes = tuple[tuple[str, tuple[int, ...]], ...]
Values = tuple[tuple[str, str], ...]


def tensor_args(case: Case, names: Sequence[str]) -> dict[str, TensorArg]:
    """The case's tensor arguments drawn at a shape (not literal data, not inside a list or dict), by the
    name the report gives them; ``names``: the positional arguments' names (entry, or forward's parameter)."""
    named = list(zip(names, case.inputs)) + [(arg.name or key, arg) for key, arg in case.kwargs]
    return {name: arg for name, arg in named if isinstance(arg, TensorArg) and arg.shape is not None}


def kinds(arg: TensorArg, dtype: str) -> dict[str, tuple[int, int]]:
    """The simpler values that ``arg``'s spec allows (``dtype``: the case's default), each as the integer
    range [low, high) drawn instead: zeros and ones where the spec's range holds 0 or 1 (inside its bounds,
    within 3 standard deviations of a normal's mean, out of every `avoid` interval: a positive range stays
    positive), small integers where it holds two or more. None for integer or complex tensors and for values
    with a structure (`symmetric`, `simplex`, `param:`, ...)."""
    kind = arg.dtype or dtype
    if (
        not kind.startswith(("float", "bfloat"))
        or arg.param
        or arg.size_of
        or arg.dist not in (None, "normal", "uniform", "positive")
    ):
        return {}
    params = dict(arg.params)
    if arg.dist in (None, "normal"):
        mean, std = params.get("mean", DIST_DEFAULTS["mean"]), params.get("std", DIST_DEFAULTS["std"])
        low, high = mean - 3 * std, mean + 3 * std
    else:
        low, high = params.get("low", BOUNDS[arg.dist][0]), params.get("high", BOUNDS[arg.dist][1])

    def allowed(v: int) -> bool:
        return low < v < high and not any(lo <= v <= hi for lo, hi in arg.avoid)

    found = {}
    if allowed(0):
        found["zeros"] = (0, 1)
    if allowed(1):
        found["ones"] = (1, 2)
    ints = [v for v in range(-SMALL, SMALL + 1) if allowed(v)]
    if len(ints) >= 2 and ints == list(range(ints[0], ints[-1] + 1)):
        found["integers"] = (ints[0], ints[-1] + 1)
    return found


def applied(case: Case, names: Sequence[str], shapes: Shapes = (), values: Values = ()) -> Case:
    """``case`` with the shapes of ``--shape`` and the values of ``--values``; BindError for a name that is
    no tensor argument drawn at a shape, or values that its spec does not allow."""
    if not shapes and not values:
        return case
    from ..sandbox.errors import (
        BindError,  # here: the front ends import this module for KINDS, and errors imports torch
    )

    args = tensor_args(case, names)
    for option, name in [("--shape", n) for n, _ in shapes] + [("--values", n) for n, _ in values]:
        if name not in args:
            raise BindError(
                f"{option} {name}",
                f"no tensor argument named '{name}' that is drawn at a shape (those of {case.function}: "
                f"{', '.join(args) or 'none'}); name one of them, as the report does",
            )
    new_shapes, new_values = dict(shapes), dict(values)
    for name, shape in new_shapes.items():
        problem = not_matrices(args[name].dist or "normal", shape)
        if problem:
            square, batch = square_example(shape)
            raise BindError(
                f"--shape {name}",
                f"{problem} (the spec's {args[name].key}); give a shape such as --shape {name}={described(square)} "
                f"(or {described(batch)} for a batch)",
            )
    for name, kind in new_values.items():
        possible = kinds(args[name], case.dtype)
        if kind not in possible:
            raise BindError(
                f"--values {name}",
                f"the spec's values of '{name}' do not allow {kind} "
                f"(they allow: {', '.join(possible) or 'none of ' + ', '.join(KINDS)}); name one they allow",
            )

    def changed(name: str, arg: Arg) -> Arg:
        if not isinstance(arg, TensorArg) or name not in args:
            return arg
        if name in new_shapes:
            arg = replace(arg, shape=new_shapes[name])
        if name in new_values:
            low, high = kinds(arg, case.dtype)[new_values[name]]
            params = (("low", float(low)), ("high", float(high)))
            arg = replace(arg, dist="randint", params=params, avoid=(), dtype=arg.dtype or case.dtype)
        return arg

    inputs = tuple(changed(name, arg) for name, arg in zip(names, case.inputs))
    kwargs = tuple((key, changed(arg.name or key, arg)) for key, arg in case.kwargs)
    return replace(case, inputs=inputs, kwargs=kwargs)


def described(shape: Sequence[int]) -> str:
    """A shape as --shape and -i write it: ``2x3``, ``scalar`` for a 0-d tensor."""
    return "x".join(map(str, shape)) or "scalar"
