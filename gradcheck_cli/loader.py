"""Import path -> the thing to check: a Function class, an nn.Module class or a callable.

One precise message per failure: module not importable (with the user's real error), no such
attribute, not callable, a Function without backward, a module without forward.
"""
from __future__ import annotations

import difflib
import importlib
import os
import sys
from typing import Any

import torch

from .errors import LoadError, user_frame
from .nn_module import ModuleTarget
from .target import Target


def load(path: str) -> Target:
    """Import ``pkg.mod:Name`` or ``pkg.mod.Name`` (the current directory is importable)."""
    if os.getcwd() not in sys.path and "" not in sys.path:
        sys.path.insert(0, os.getcwd())
    module_name, _, attr = path.partition(":") if ":" in path else path.rpartition(".")
    if not module_name or not attr:
        raise LoadError(f"'{path}' is not an import path; write it as 'pkg.mod:Name' or 'pkg.mod.Name'")
    module = _import(module_name, path)
    obj: Any = module
    for i, part in enumerate(attr.split(".")):
        if not hasattr(obj, part):
            owner = ".".join([module_name] + attr.split(".")[:i])
            close = difflib.get_close_matches(part, [n for n in dir(obj) if not n.startswith("_")], n=3)
            hint = f"; did you mean {', '.join(repr(c) for c in close)}?" if close else ""
            raise LoadError(f"'{owner}' has no attribute '{part}'{hint}")
        obj = getattr(obj, part)
    if isinstance(obj, type) and issubclass(obj, torch.autograd.Function):
        if obj.backward is torch.autograd.Function.backward:
            raise LoadError(f"'{path}' is an autograd.Function without a backward(); define "
                            "`@staticmethod def backward(ctx, *grad_outputs)`")
        return Target(path, obj, True)
    if isinstance(obj, type) and issubclass(obj, torch.nn.Module):
        if obj.forward is torch.nn.Module.forward:
            raise LoadError(f"'{path}' is an nn.Module class without a forward(); define "
                            "`def forward(self, ...)`")
        return ModuleTarget(path, obj, False)
    if isinstance(obj, type) or not callable(obj):
        kind = "a class" if isinstance(obj, type) else f"a value of type {type(obj).__name__}"
        raise LoadError(f"'{path}' is {kind}, not an autograd.Function subclass or a callable")
    return Target(path, obj, False)


def _import(module_name: str, path: str) -> Any:
    try:
        return importlib.import_module(module_name)
    except ModuleNotFoundError as exc:
        if exc.name and module_name.startswith(exc.name) and module_name[len(exc.name):][:1] in ("", "."):
            raise LoadError(f"cannot import '{module_name}' (for '{path}'): no module named '{exc.name}'; "
                            "check the spelling, run from the project root, or install the package") from exc
        raise LoadError(f"importing '{module_name}' failed: {type(exc).__name__}: {exc}", user_frame(exc)) from exc
    except SyntaxError as exc:
        where = f"{os.path.relpath(exc.filename)}:{exc.lineno}" if exc.filename else None
        raise LoadError(f"importing '{module_name}' failed: SyntaxError: {exc}", where) from exc
    except (Exception, SystemExit) as exc:
        raise LoadError(f"importing '{module_name}' failed: {type(exc).__name__}: {exc}", user_frame(exc)) from exc
