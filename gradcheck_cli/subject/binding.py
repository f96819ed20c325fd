"""Spec arguments -> the target's call: names, positions and spec lines of every value.

For a Function every argument is positional (``apply`` takes no keywords); a module target's
parameters follow the arguments, so every check treats them like inputs. A ``list:`` or ``dict:``
argument is flat here, one value per leaf (``xs[0]``, ``feats.q``): the checks perturb and
differentiate leaves, and ``Bound.arguments`` puts the lists and dicts back together for the call.
"""

from __future__ import annotations

import inspect
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any, Callable, Optional, Union

import torch

from ..numerics.streams import RngFork, Streams
from ..sandbox.errors import BindError
from ..spec import Arg, Container, ListArg, TensorArg
from . import sparse
from .target import Target

VARIADIC = (inspect.Parameter.VAR_POSITIONAL, inspect.Parameter.VAR_KEYWORD)
Place = Union[int, list["Place"], dict[str, "Place"]]  # where a call argument's leaves are among the values


@dataclass
class Bound:
    """Arguments in call order, with the names and positions the user sees.

    For a module, its parameters follow the arguments (named as in named_parameters()).
    ``rng`` forks the global RNG for every forward (made at the first one, from ``streams``).
    """

    values: list[Any]
    names: list[str]
    indices: list[int]
    n_positional: int
    kw_names: list[str]
    entries: list[Optional[Arg]] = field(default_factory=list)  # each value's spec entry, where it has one
    rng: Optional[RngFork] = field(default=None, repr=False, compare=False)
    streams: Streams = Streams()  # the random streams the values came from; every forward starts from them
    clone_inputs: Optional[bool] = None  # forward on copies of the tensors (an in-place Function); None: unknown yet
    found_in_place: bool = False  # clone_inputs was found (the first forward changed an argument and returned it)
    # value i reaches the target as transforms[i](value) (`param:`, or sym for symmetric inputs): the
    # checks perturb and differentiate the value itself, so they check f(param(X))
    transforms: dict[int, Callable[[Any], Any]] = field(default_factory=dict, repr=False, compare=False)
    via: dict[int, str] = field(default_factory=dict)  # value i -> what transforms it, said in its row
    # one per call argument: the value it is, or the list/dict of values it is built of; empty: each
    # value is one argument (no `list:` or `dict:`)
    places: list[Place] = field(default_factory=list)

    def arguments(self, values: Sequence[Any]) -> list[Any]:
        """What the target is called with for the checks' ``values`` (in this Bound's order)."""
        return self.assemble(self.transformed(values))

    def transformed(self, values: Sequence[Any]) -> list[Any]:
        """``values`` with the `param:` / symmetric maps applied, still one per value."""
        return [self.transforms[i](v) if i in self.transforms else v for i, v in enumerate(values)]

    def assemble(self, values: Sequence[Any]) -> list[Any]:
        """The call's arguments from one value per leaf: lists and dicts rebuilt (``n_positional`` and
        ``kw_names`` count these)."""
        if not self.places:
            return list(values)

        def fill(place: Place) -> Any:
            if isinstance(place, list):
                return [fill(p) for p in place]
            if isinstance(place, dict):
                return {k: fill(p) for k, p in place.items()}
            return values[place]

        return [fill(p) for p in self.places]

    def flatten(self, arguments: Sequence[Any]) -> list[Any]:
        """The inverse of ``assemble``: one value per leaf, from values shaped as the call's arguments
        (None for a whole list or dict: None for each of its leaves). ValueError names the first place
        whose shape differs."""
        if not self.places:
            return list(arguments)
        out: list[Any] = [None] * len(self.values)

        def take(place: Place, value: Any) -> None:
            if value is None or not isinstance(place, (list, dict)):
                if isinstance(place, int):
                    out[place] = value
                return
            if isinstance(place, list) and not (isinstance(value, (list, tuple)) and len(value) == len(place)):
                name = self.names[_first(place)].rpartition("[")[0]
                raise ValueError(f"expected a list of {len(place)} for '{name}', got {_what(value)}")
            if isinstance(place, dict) and not (isinstance(value, dict) and set(value) == set(place)):
                raise ValueError(
                    f"expected a dict with keys {', '.join(place)} for "
                    f"'{self.names[_first(place)].rpartition('.')[0]}', got {_what(value)}"
                )
            for k, p in enumerate(place) if isinstance(place, list) else place.items():
                take(p, value[k])

        for place, value in zip(self.places, arguments):
            take(place, value)
        return out

    def line(self, i: int) -> Optional[int]:
        """The spec line of value ``i``, where known."""
        entry = self.entries[i] if i < len(self.entries) else None
        return entry.line if entry is not None else None

    def drawn(self, i: int) -> bool:
        """Whether value ``i`` was drawn at random (a ``shape`` entry, not literal ``data``)."""
        entry = self.entries[i] if i < len(self.entries) else None
        return getattr(entry, "shape", None) is not None


def bind(
    target: Target,
    positional: list[tuple[Optional[str], Any]],
    keywords: list[tuple[str, Any]],
    entries: Sequence[Optional[Arg]] = (),
) -> Bound:
    """Bind (spec name, value) pairs to the target's signature.

    For a Function every argument becomes positional (``apply`` takes no keywords): keyword
    arguments go to their parameter's slot, and skipped parameters before them get their
    defaults. Parameters after the last one given are left to their defaults. ``entries`` are the
    spec entries of the positional then the keyword arguments, carried by the bound values. A sparse
    input that requires grad is bound as the dense variable the checks perturb, which reaches the target
    sparse again (``sparse``).
    """
    return _densified(_bind(target, positional, keywords, entries))


def _densified(bound: Bound) -> Bound:
    """``bound`` with each sparse input (``layout:``) that requires grad replaced by its dense variable and
    the map back to a sparse tensor of its specified elements; an argument ``same_as`` it is the same
    variable."""
    done: dict[int, tuple[torch.Tensor, Callable[[Any], Any], str]] = {}
    for i, (value, entry) in enumerate(zip(bound.values, bound.entries)):
        if not (isinstance(value, torch.Tensor) and value.layout in sparse.LAYOUTS.values() and value.requires_grad):
            continue
        if id(value) not in done and isinstance(entry, TensorArg) and entry.sparse is not None:
            mask = sparse.specified(value)
            dense = value.detach().to_dense().requires_grad_(True)
            layout, masked = entry.sparse.layout, entry.sparse.masked
            done[id(value)] = (dense, sparse.transform(mask, layout, masked), sparse.described(mask, layout, masked))
        if id(value) in done:
            bound.values[i], bound.transforms[i], bound.via[i] = done[id(value)]
    return bound


def positional_labels(given: Sequence[Optional[str]], params: Sequence[str]) -> list[str]:
    """How the report names positional arguments: the spec entry's name, else forward's parameter at that
    position, else ``arg{i}``."""
    return [n or (params[i] if i < len(params) else f"arg{i}") for i, n in enumerate(given)]


def _bind(
    target: Target,
    positional: list[tuple[Optional[str], Any]],
    keywords: list[tuple[str, Any]],
    entries: Sequence[Optional[Arg]] = (),
) -> Bound:
    """``bind`` before its sparse inputs are made dense variables (``_densified``)."""
    entry_of = dict(enumerate(entries))
    kw_entries = {name: entry_of.get(len(positional) + k) for k, (name, _) in enumerate(keywords)}
    params = target.parameters()
    names = [p.name for p in params] if params is not None else []
    if params is not None and not any(p.kind is p.VAR_POSITIONAL for p in params):
        n_max = sum(p.kind in (p.POSITIONAL_ONLY, p.POSITIONAL_OR_KEYWORD) for p in params)
        if len(positional) > n_max:
            raise BindError(
                "inputs",
                f"{len(positional)} inputs given, but {target.path} takes {n_max} "
                f"({', '.join(names[:n_max])}); remove the extra entries",
            )
    if target.is_function:
        _refuse_tensor_containers(target, [v for _, v in positional] + [v for _, v in keywords], entries)
    values = [v for _, v in positional]
    labels = positional_labels([n for n, _ in positional], names)
    indices = list(range(len(positional)))
    if not target.is_function:
        for name, value in keywords:
            _check_keyword(target, params, name, len(positional))
            labels.append(name)
            indices.append(names.index(name) if name in names else len(indices))
            values.append(value)
        bound = _flat(
            Bound(
                values,
                labels,
                indices,
                len(positional),
                [k for k, _ in keywords],
                [entry_of.get(i) for i in range(len(values))],
            )
        )
        device = next((str(v.device) for v in bound.values if isinstance(v, torch.Tensor)), None)
        extra = target.extra_arguments(device)  # a module's parameters; none for other targets
        start = max([len([p for p in params or [] if p.kind not in VARIADIC])] + [i + 1 for i in indices])
        for k, (name, value) in enumerate(extra):  # numbered after forward's parameters
            if bound.places:
                bound.places.append(len(bound.values))
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
                raise BindError(
                    "inputs",
                    f"'{names[pos]}' (position {pos}) of {target.path} has no default "
                    "and is not given: add it to `inputs` or `kwargs`",
                )
            labels.append(names[pos])
            values.append(default)
        indices.append(pos)
    return Bound(values, labels, indices, len(values), [], spec_entries)


def _first(place: Place) -> int:
    """The first value's position in ``place``."""
    while not isinstance(place, int):
        place = place[0] if isinstance(place, list) else next(iter(place.values()))
    return place


def _what(value: Any) -> str:
    if isinstance(value, dict):
        return f"a dict with keys {', '.join(map(str, value))}"
    if isinstance(value, (list, tuple)):
        return f"a {type(value).__name__} of {len(value)}"
    return f"a {type(value).__name__}"


def _flat(bound: Bound) -> Bound:
    """``bound`` with each ``list:`` / ``dict:`` argument spread into one value per leaf, named by its path
    (``xs[0]``, ``feats.q``) and numbered as its argument, and ``places`` to put them back."""
    if not any(isinstance(e, Container) for e in bound.entries):
        return bound
    flat = Bound([], [], [], bound.n_positional, bound.kw_names, [])

    def place(entry: Optional[Arg], value: Any, name: str, index: int) -> Place:
        if isinstance(entry, ListArg):
            return [place(e, value[k], f"{name}[{k}]", index) for k, e in enumerate(entry.items)]
        if isinstance(entry, Container):
            return {k: place(e, value[k], f"{name}.{k}", index) for k, e in entry.items}
        flat.values.append(value)
        flat.names.append(name)
        flat.indices.append(index)
        flat.entries.append(entry)
        return len(flat.values) - 1

    flat.places = [place(e, v, n, i) for v, n, i, e in zip(bound.values, bound.names, bound.indices, bound.entries)]
    return flat


def _refuse_tensor_containers(target: Target, values: list[Any], entries: Sequence[Optional[Arg]]) -> None:
    """A Function's ``apply`` tracks only the tensors passed to it directly: a list or dict of tensors
    would pass silently with no gradient at all. Said, with the way out."""
    for value, entry in zip(values, entries):
        if not isinstance(entry, Container):
            continue
        if any(isinstance(v, torch.Tensor) for v in _leaf_values(value)):
            name, cls = entry.name or entry.key, target.path.replace(":", ".").split(".")[-1]
            raise BindError(
                entry.key,
                (
                    f"{target.path} is an autograd.Function, whose apply() tracks only the tensors passed to it "
                    f"directly, not those inside a list or dict: '{name}' would get no gradient at all. Check a "
                    f"function that unpacks it instead, e.g. `def f(xs): return {cls}.apply(*xs)`, and name that "
                    "function in `function:`; for a literal list or dict, write `value: [...]`"
                ),
            )


def _leaf_values(value: Any) -> list[Any]:
    if isinstance(value, (list, tuple)):
        return [x for v in value for x in _leaf_values(v)]
    if isinstance(value, dict):
        return [x for v in value.values() for x in _leaf_values(v)]
    return [value]


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
        raise BindError(
            key,
            f"'{name}' is keyword-only in forward(), but Function.apply passes arguments "
            "by position only: make it a positional parameter",
        )
    if params[pos].kind in (params[pos].POSITIONAL_ONLY, params[pos].POSITIONAL_OR_KEYWORD) and pos < n_pos:
        raise BindError(key, f"'{name}' is given twice: by position (inputs[{pos}]) and in kwargs")
    return pos
