"""Spec arguments -> the target's call: names, positions and spec lines of every value.

For a Function every argument is positional (``apply`` takes no keywords); a module target's
parameters follow the arguments, so every check treats them like inputs.
"""
from __future__ import annotations

import inspect
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Callable, Optional

import torch

from .errors import BindError
from .rng import RngFork
from .target import Target

if TYPE_CHECKING:
    from .spec import Arg

VARIADIC = (inspect.Parameter.VAR_POSITIONAL, inspect.Parameter.VAR_KEYWORD)


@dataclass
class Bound:
    """Arguments in call order, with the names and positions the user sees.

    For a module, its parameters follow the arguments (named as in named_parameters()).
    ``rng`` forks the global RNG for every forward (made at the first one, from ``seed``).
    """

    values: list[Any]
    names: list[str]
    indices: list[int]
    n_positional: int
    kw_names: list[str]
    entries: list[Optional[Arg]] = field(default_factory=list)  # each value's spec entry, where it has one
    rng: Optional[RngFork] = field(default=None, repr=False, compare=False)
    seed: int = 0  # seeds the RNG state every forward starts from
    clone_inputs: Optional[bool] = None  # forward on copies of the tensors (an in-place Function); None: unknown yet
    found_in_place: bool = False  # clone_inputs was found (the first forward changed an argument and returned it)
    # value i reaches the target as transforms[i](value) (`param:`, or sym for symmetric inputs): the
    # checks perturb and differentiate the value itself, so they check f(param(X))
    transforms: dict[int, Callable[[Any], Any]] = field(default_factory=dict, repr=False, compare=False)
    via: dict[int, str] = field(default_factory=dict)  # value i -> what transforms it, said in its row

    def arguments(self, values: Sequence[Any]) -> list[Any]:
        """What the target is called with for the checks' ``values`` (in this Bound's order)."""
        return [self.transforms[i](v) if i in self.transforms else v for i, v in enumerate(values)]

    def line(self, i: int) -> Optional[int]:
        """The spec line of value ``i``, where known."""
        entry = self.entries[i] if i < len(self.entries) else None
        return entry.line if entry is not None else None

    def drawn(self, i: int) -> bool:
        """Whether value ``i`` was drawn at random (a ``shape`` entry, not literal ``data``)."""
        entry = self.entries[i] if i < len(self.entries) else None
        return getattr(entry, "shape", None) is not None


def bind(target: Target, positional: list[tuple[Optional[str], Any]],
         keywords: list[tuple[str, Any]], entries: Sequence[Optional[Arg]] = ()) -> Bound:
    """Bind (spec name, value) pairs to the target's signature.

    For a Function every argument becomes positional (``apply`` takes no keywords): keyword
    arguments go to their parameter's slot, and skipped parameters before them get their
    defaults. Parameters after the last one given are left to their defaults. ``entries`` are the
    spec entries of the positional then the keyword arguments, carried by the bound values.
    """
    entry_of = dict(enumerate(entries))
    kw_entries = {name: entry_of.get(len(positional) + k) for k, (name, _) in enumerate(keywords)}
    params = target.parameters()
    names = [p.name for p in params] if params is not None else []
    if params is not None and not any(p.kind is p.VAR_POSITIONAL for p in params):
        n_max = sum(p.kind in (p.POSITIONAL_ONLY, p.POSITIONAL_OR_KEYWORD) for p in params)
        if len(positional) > n_max:
            raise BindError("inputs", f"{len(positional)} inputs given, but {target.path} takes {n_max} "
                                      f"({', '.join(names[:n_max])}); remove the extra entries")
    values = [v for _, v in positional]
    labels = [n or (names[i] if i < len(names) else f"arg{i}") for i, (n, _) in enumerate(positional)]
    indices = list(range(len(positional)))
    if not target.is_function:
        for name, value in keywords:
            _check_keyword(target, params, name, len(positional))
            labels.append(name)
            indices.append(names.index(name) if name in names else len(indices))
            values.append(value)
        bound = Bound(values, labels, indices, len(positional), [k for k, _ in keywords],
                      [entry_of.get(i) for i in range(len(values))])
        device = next((str(v.device) for v in values if isinstance(v, torch.Tensor)), None)
        extra = target.extra_arguments(device)  # a module's parameters; none for other targets
        start = max([len([p for p in params or [] if p.kind not in VARIADIC])] + [i + 1 for i in indices])
        for k, (name, value) in enumerate(extra):  # numbered after forward's parameters
            bound.values.append(value)
            bound.names.append(name)
            bound.indices.append(start + k)
            bound.entries.append(None)
        return bound
    slots: dict[int, tuple[str, Any]] = {}
    for name, value in keywords:
        pos = _check_keyword(target, params, name, len(positional))
        slots[pos] = (name, value)
    spec_entries = [entry_of.get(i) for i in range(len(positional))]
    for pos in range(len(positional), max(slots, default=-1) + 1):
        spec_entries.append(kw_entries.get(slots[pos][0]) if pos in slots else None)
        if pos in slots:
            labels.append(slots[pos][0])
            values.append(slots[pos][1])
        else:
            default = params[pos].default if params else inspect.Parameter.empty
            if default is inspect.Parameter.empty:
                raise BindError("inputs", f"'{names[pos]}' (position {pos}) of {target.path} has no default "
                                          "and is not given: add it to `inputs` or `kwargs`")
            labels.append(names[pos])
            values.append(default)
        indices.append(pos)
    return Bound(values, labels, indices, len(values), [], spec_entries)


def _check_keyword(target: Target, params: Optional[list[inspect.Parameter]], name: str, n_pos: int) -> int:
    """Position of keyword ``name`` in the signature (or -1 for **kwargs); raise if it does not fit."""
    key = f"kwargs.{name}"
    if params is None:
        if target.is_function:
            raise BindError(key, f"cannot read the signature of {target.path}.forward to place '{name}'")
        return -1
    names = [p.name for p in params]
    if name not in names:
        if any(p.kind is p.VAR_KEYWORD for p in params) and not target.is_function:
            return -1
        raise BindError(key, f"{target.path} has no parameter '{name}'; its parameters are: {', '.join(names)}")
    pos = names.index(name)
    if params[pos].kind is params[pos].KEYWORD_ONLY and target.is_function:
        raise BindError(key, f"'{name}' is keyword-only in forward(), but Function.apply passes arguments "
                             "by position only: make it a positional parameter")
    if params[pos].kind in (params[pos].POSITIONAL_ONLY, params[pos].POSITIONAL_OR_KEYWORD) and pos < n_pos:
        raise BindError(key, f"'{name}' is given twice: by position (inputs[{pos}]) and in kwargs")
    return pos
