"""Import path -> the thing to check: a Function class, an nn.Module class, a custom op or a callable;
and the modules a spec imports first (``import:``, ``--import``: they register ops).

One precise message per failure: module not importable (with the user's real error), no such
attribute, not callable, a Function without backward, a module without forward, an op not registered.
"""

from __future__ import annotations

import difflib
import importlib
import os
import sys
from collections.abc import Sequence
from typing import Any, Callable, cast

import torch

from ..sandbox.errors import LoadError, user_frame
from .custom_op import TORCH_OPS, as_op, load_op
from .nn_module import ModuleTarget
from .target import Target


def import_modules(names: Sequence[str], key: str) -> None:
    """Import the modules that spec key (or option) ``key`` lists, in order; a LoadError names ``key``."""
    _importable_cwd()
    for name in names:
        try:
            _import(name, f"listed in `{key}`")
        except LoadError as exc:
            raise LoadError(str(exc), exc.where, key) from exc


def load(path: str) -> Target:
    """Import ``pkg.mod:Name`` or ``pkg.mod.Name`` (the current directory is importable), or look up
    ``torch.ops.ns.op[.overload]`` (registered by a module imported before)."""
    _importable_cwd()
    if path.replace(":", ".").startswith(TORCH_OPS):
        return load_op(path)
    obj = load_object(path)
    if isinstance(obj, type) and issubclass(obj, torch.autograd.Function):
        if obj.backward is torch.autograd.Function.backward:
            raise LoadError(
                f"'{path}' is an autograd.Function without a backward(); define "
                "`@staticmethod def backward(ctx, *grad_outputs)`"
            )
        return Target(path, obj, True)
    if isinstance(obj, type) and issubclass(obj, torch.nn.Module):
        if obj.forward is torch.nn.Module.forward:
            raise LoadError(f"'{path}' is an nn.Module class without a forward(); define `def forward(self, ...)`")
        return ModuleTarget(path, obj, False)
    op = as_op(obj, path)  # what @torch.library.custom_op returns, or torch.ops.ns.op kept in a module
    if op is not None:
        return op
    if isinstance(obj, type) or not callable(obj):
        kind = "a class" if isinstance(obj, type) else f"a value of type {type(obj).__name__}"
        raise LoadError(f"'{path}' is {kind}, not an autograd.Function subclass or a callable")
    return Target(path, obj, False)


def load_object(path: str, key: str = "function") -> Any:
    """The object ``pkg.mod:Name`` or ``pkg.mod.Name`` names, as it is (the current directory is
    importable); a LoadError names spec key ``key``."""
    _importable_cwd()
    module_name, _, attr = path.partition(":") if ":" in path else path.rpartition(".")
    if not module_name or not attr:
        raise LoadError(f"'{path}' is not an import path; write it as 'pkg.mod:Name' or 'pkg.mod.Name'", key=key)
    try:
        module = _import(module_name, f"for '{path}'")
    except LoadError as exc:
        raise LoadError(str(exc), exc.where, key) from exc
    obj: Any = module
    for i, part in enumerate(attr.split(".")):
        if not hasattr(obj, part):
            owner = ".".join([module_name] + attr.split(".")[:i])
            close = difflib.get_close_matches(part, [n for n in dir(obj) if not n.startswith("_")], n=3)
            hint = f"; did you mean {', '.join(repr(c) for c in close)}?" if close else ""
            raise LoadError(f"'{owner}' has no attribute '{part}'{hint}", key=key)
        obj = getattr(obj, part)
    return obj


def load_callable(path: str, key: str) -> Callable[..., Any]:
    """What ``param:`` names: a function, or an autograd.Function class (called through ``apply``)."""
    obj = load_object(path, key)
    if isinstance(obj, type) and issubclass(obj, torch.autograd.Function):
        return obj.apply
    if isinstance(obj, type) or not callable(obj):
        raise LoadError(
            f"'{path}' is {'a class' if isinstance(obj, type) else type(obj).__name__}, not a function of one tensor",
            key=key,
        )
    return cast(Callable[..., Any], obj)


def _importable_cwd() -> None:
    if os.getcwd() not in sys.path and "" not in sys.path:
        sys.path.insert(0, os.getcwd())


def _import(module_name: str, why: str) -> Any:
    try:
        return importlib.import_module(module_name)
    except ModuleNotFoundError as exc:
        if exc.name and module_name.startswith(exc.name) and module_name[len(exc.name) :][:1] in ("", "."):
            raise LoadError(
                f"cannot import '{module_name}' ({why}): no module named '{exc.name}'; "
                "check the spelling, run from the project root, or install the package"
            ) from exc
        raise LoadError(f"importing '{module_name}' failed: {type(exc).__name__}: {exc}", user_frame(exc)) from exc
    except SyntaxError as exc:
        where = f"{os.path.relpath(exc.filename)}:{exc.lineno}" if exc.filename else None
        raise LoadError(f"importing '{module_name}' failed: SyntaxError: {exc}", where) from exc
    except (Exception, SystemExit) as exc:
        raise LoadError(f"importing '{module_name}' failed: {type(exc).__name__}: {exc}", user_frame(exc)) from exc
