"""``gradcheck init``: a commented spec skeleton from a Function's forward signature."""
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
            lines.append(f"  {p.name}: {{value: {yaml.safe_dump(p.default, default_flow_style=True).strip().removesuffix('...').strip()}}}")
    return "\n".join(lines) + "\n"
