"""``gradcheck init``: a commented spec skeleton from a Function's forward signature
(for an nn.Module class, from its constructor's too; for a custom op, from its schema)."""

from __future__ import annotations

import inspect
from collections.abc import Sequence
from typing import Any

import yaml

from .subject.custom_op import OpTarget, is_tensor
from .subject.loader import import_modules, load

PLACEHOLDER_SHAPE = [4, 5]


def _literal(value: Any) -> bool:
    try:
        return yaml.safe_load(yaml.safe_dump(value)) == value
    except yaml.YAMLError:
        return False


def skeleton(function: str, imports: Sequence[str] = ()) -> str:
    """YAML text of a spec for ``function``, valid as written (shapes are placeholders); ``imports``
    are imported first (they register the op ``function`` names) and written as ``import:``."""
    import_modules(imports, "--import")
    target = load(function)
    if isinstance(target, OpTarget):
        return "\n".join(_head(function, imports, f"the op's schema: {target.schema}") + _op_lines(target)) + "\n"
    params = target.parameters() or []
    lines = _head(function, imports, "inputs are forward's positional arguments, after ctx") + ["inputs:"]
    kwargs = []
    positional = [p for p in params if p.kind in (p.POSITIONAL_ONLY, p.POSITIONAL_OR_KEYWORD)]
    for p in positional:
        if p.default is inspect.Parameter.empty:
            lines += [
                f"  - name: {p.name}",
                f"    shape: {PLACEHOLDER_SHAPE}   # placeholder: set the real shape",
                "    # dist: normal             # or uniform (low, high), randint (low, high)",
                "    # avoid: [[-0.01, 0.01]]   # keep values away from kinks",
            ]
        elif _literal(p.default):
            kwargs.append(p)
    if not any(p.default is inspect.Parameter.empty for p in positional):
        lines[-1] = "inputs: []"
    if kwargs:
        lines.append("kwargs:   # parameters with defaults; change a value to check another setting")
        for p in kwargs:
            lines.append(f"  {p.name}: {{value: {_flow(p.default)}}}")
    if target.is_module:
        lines += _init_lines(target.obj)
    return "\n".join(lines) + "\n"


def _head(function: str, imports: Sequence[str], arguments: str) -> list[str]:
    lines = [
        f"# Spec for {function}: edit the shapes, then run `gradcheck <this file>`.",
        f"# Format: docs/how-to/specs.md, every key in docs/reference/spec.md ({arguments}).",
        f"function: {function}",
    ]
    lines += [f"import: [{', '.join(imports)}]   # imported first: they register the op"] if imports else []
    return lines + [
        f"description: {function.replace(':', '.').split('.')[-1]}",
        "seed: 0",
        "# device: cpu                 # or cuda, or [cpu, cuda]",
        "# dtype: float64              # finite differences want float64",
        "# tolerance: {eps: 1.0e-6, atol: 1.0e-5, rtol: 1.0e-3}",
    ]


PLACEHOLDER_VALUES = {"float": 1.0, "int": 1, "SymInt": 1, "bool": False, "str": "", "Scalar": 1.0}


def _op_lines(target: OpTarget) -> list[str]:
    """``inputs`` and ``kwargs`` from an op's schema: a tensor entry per ``Tensor`` argument, a value per
    other argument without a default (a placeholder to set), the arguments with defaults in ``kwargs``."""
    inputs: list[str] = []
    kwargs: list[str] = []
    for p in target.parameters() or []:
        kind = str(p.annotation)
        required = p.default is inspect.Parameter.empty
        if required and is_tensor(kind):
            entry, note = f"shape: {_flow(PLACEHOLDER_SHAPE)}", f"{kind}; placeholder: set the real shape"
        elif required and kind == "Tensor[]":
            shape = _flow(PLACEHOLDER_SHAPE)
            entry, note = f"list: [{{shape: {shape}}}, {{shape: {shape}}}]", f"{kind}; placeholder: set the tensors"
        elif required and kind.startswith("Tensor"):
            entry, note = "value: []", f"{kind}: a list that may hold None cannot be drawn; give it as a value"
        elif required:
            entry, note = f"value: {_flow(PLACEHOLDER_VALUES.get(kind))}", f"{kind}; placeholder: set it"
        elif _literal(p.default):
            entry = f"value: {_flow(p.default)}"
            tensor = kind.startswith("Tensor")
            note = f"{kind}, its default" + ("; give a shape to check its gradient" if tensor else "")
        else:
            continue
        if required and p.kind is not p.KEYWORD_ONLY:
            inputs.append(f"  - {{name: {p.name}, {entry}}}   # {note}")
        else:
            kwargs.append(f"  {p.name}: {{{entry}}}   # {note}")
    lines = ["inputs:" if inputs else "inputs: []"] + inputs
    if kwargs:
        lines += [
            "kwargs:   # arguments with defaults (and keyword-only ones); change a value to check another setting"
        ] + kwargs
    return lines


def _flow(value: Any) -> str:
    return yaml.safe_dump(value, default_flow_style=True).strip().removesuffix("...").strip()


def _init_lines(cls: type) -> list[str]:
    """The ``init`` block of an nn.Module class: its constructor's keyword arguments.

    Required ones are left commented out (no value can be guessed: the check says which are
    missing until they are set); those with literal defaults are written with their default.
    """
    try:
        params = list(inspect.signature(cls).parameters.values())
    except (TypeError, ValueError):
        params = []
    lines = [
        f"init:     # constructor arguments of {cls.__name__}; its parameters are checked as arguments too",
        "  args: []",
        "  kwargs:",
    ]
    for p in params:
        if p.kind in (p.VAR_POSITIONAL, p.VAR_KEYWORD):
            continue
        if p.default is inspect.Parameter.empty:
            lines.append(f"    # {p.name}: ...   # required: set it")
        elif _literal(p.default):
            lines.append(f"    {p.name}: {_flow(p.default)}")
    return lines
