"""``gradcheck init``: a commented spec skeleton from a Function's forward signature
(and, for an nn.Module class, from its constructor's)."""
from __future__ import annotations

import inspect
from typing import Any

import yaml

from .loader import load

PLACEHOLDER_SHAPE = [4, 5]


def _literal(value: Any) -> bool:
    try:
        return yaml.safe_load(yaml.safe_dump(value)) == value
    except yaml.YAMLError:
        return False


def skeleton(function: str) -> str:
    """YAML text of a spec for ``function``, valid as written (shapes are placeholders)."""
    target = load(function)
    params = target.parameters() or []
    lines = [
        f"# Spec for {function}: edit the shapes, then run `gradcheck <this file>`.",
        "# Format: see the README (inputs are forward's positional arguments, after ctx).",
        f"function: {function}",
        f"description: {function.replace(':', '.').split('.')[-1]}",
        "seed: 0",
        "# device: cpu                 # or cuda, or [cpu, cuda]",
        "# dtype: float64              # finite differences want float64",
        "# tolerance: {eps: 1.0e-6, atol: 1.0e-5, rtol: 1.0e-3}",
        "inputs:",
    ]
    kwargs = []
    positional = [p for p in params if p.kind in (p.POSITIONAL_ONLY, p.POSITIONAL_OR_KEYWORD)]
    for p in positional:
        if p.default is inspect.Parameter.empty:
            lines += [f"  - name: {p.name}", f"    shape: {PLACEHOLDER_SHAPE}   # placeholder: set the real shape",
                      "    # dist: normal             # or uniform (low, high), randint (low, high)",
                      "    # avoid: [[-0.01, 0.01]]   # keep values away from kinks"]
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
    lines = [f"init:     # constructor arguments of {cls.__name__}; its parameters are checked as arguments too",
             "  args: []", "  kwargs:"]
    for p in params:
        if p.kind in (p.VAR_POSITIONAL, p.VAR_KEYWORD):
            continue
        if p.default is inspect.Parameter.empty:
            lines.append(f"    # {p.name}: ...   # required: set it")
        elif _literal(p.default):
            lines.append(f"    {p.name}: {_flow(p.default)}")
    return lines
