"""Import path -> the thing to check: a Function class, an nn.Module class, a custom op or a callable;
and the modules a spec imports first (``import:``, ``--import``: they register ops).

An import path is ``pkg.mod:Name``, ``pkg.mod.Name``, or a Python file's ``path/to/ops.py::Name`` (relative to
the current directory). A file is imported as pytest's default (prepend) import mode does it: the folder above
its top package (the first without ``__init__.py``) goes first on sys.path and the file is imported by its
dotted name, so its relative imports work and it is the module the rest of the user's code imports; a file in no
package under the current directory is named from there (``folder/ops.py`` is ``folder.ops``). When that
name is another module's (a file named like a module of the standard library), it is imported by location
under a name of its own, the same in every process: ``_gradcheck_file_<hash of its path>``.

One precise message per failure: module not importable (with the user's real error), no such
attribute, not callable, a Function without backward, a module without forward, an op not registered.
"""

from __future__ import annotations

import difflib
import hashlib
import importlib
import importlib.util
import os
import sys
from collections.abc import Sequence
from pathlib import Path
from types import ModuleType
from typing import Any, Callable, Optional, cast

import torch

from ..sandbox.errors import LoadError, user_frame
from ..spec import file_target
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
    if file_target(path) is None and path.replace(":", ".").startswith(TORCH_OPS):
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
    """The object ``pkg.mod:Name``, ``pkg.mod.Name`` or ``path/to/ops.py::Name`` names, as it is (the current
    directory is importable); a LoadError names spec key ``key``."""
    _importable_cwd()
    located = file_target(path)
    if located is not None:
        module_name, attr = located
    else:
        module_name, _, attr = path.partition(":") if ":" in path else path.rpartition(".")
    if not module_name or not attr:
        raise LoadError(
            f"'{path}' is not an import path; write it as 'pkg.mod:Name', 'pkg.mod.Name' or 'path/to/ops.py::Name'",
            key=key,
        )
    try:
        module = _import_file(module_name, path) if located else _import(module_name, f"for '{path}'")
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


def _import_file(file: str, target: str) -> ModuleType:
    """The module of Python file ``file`` (``target`` names an object in it), imported once per process."""
    path = Path(file)
    if not path.is_file():
        raise LoadError(
            f"'{file}' (in '{target}'): no such file; a relative path is read from the current directory, {os.getcwd()}"
        )
    path = path.resolve()
    package = path.parent
    while (package / "__init__.py").is_file() and package.parent != package:
        package = package.parent
    cwd = Path.cwd().resolve()
    if package == path.parent and path.is_relative_to(cwd):
        package = cwd  # in no package: named from the current directory, as `gradcheck folder.ops:Name` imports it
    root = str(package)  # the folder above the file's top package (else its own folder, or the current one)
    if root not in sys.path:
        sys.path.insert(0, root)
    parts = path.relative_to(package).with_suffix("").parts
    name = ".".join(parts[:-1] if parts[-1] == "__init__" else parts)
    module = sys.modules.get(name)
    importlib.invalidate_caches()  # a file written since its folder was last read is found too
    if module is None and _finds(parts, package, path):
        module = _import(name, f"for '{target}'", file)
    if _is_file_of(module, path):
        return cast(ModuleType, module)
    own = f"_gradcheck_file_{hashlib.sha256(str(path).encode()).hexdigest()[:16]}"  # its dotted name is taken
    if own not in sys.modules:
        spec = importlib.util.spec_from_file_location(own, path)
        if spec is None or spec.loader is None:
            raise LoadError(f"'{file}' (in '{target}') cannot be imported: not a Python source file")
        module = sys.modules[own] = importlib.util.module_from_spec(spec)
        try:
            _import(own, f"for '{target}'", file, lambda _: cast(Any, spec.loader).exec_module(module))
        except LoadError:
            del sys.modules[own]
            raise
    return sys.modules[own]


def _finds(parts: tuple[str, ...], package: Path, path: Path) -> bool:
    """Whether importing the dotted name ``parts`` would import the file ``path`` (under ``package``), and not a
    module of that name elsewhere (one imported already, or found earlier on sys.path)."""
    if not all(part.isidentifier() for part in parts):
        return False
    try:
        found = importlib.util.find_spec(parts[0])  # a top-level name: no code runs
    except (ImportError, ValueError):
        return False
    if found is None:
        return False
    if len(parts) == 1:
        return isinstance(found.origin, str) and _same(found.origin, path)
    return any(_same(folder, package / parts[0]) for folder in found.submodule_search_locations or ())


def _is_file_of(module: Optional[ModuleType], path: Path) -> bool:
    file = getattr(module, "__file__", None)
    return isinstance(file, str) and _same(file, path)


def _same(file: str, path: Path) -> bool:
    """Whether ``file`` is ``path`` (both exist)."""
    return os.path.exists(file) and os.path.samefile(file, path)


def _import(
    module_name: str, why: str, shown: Optional[str] = None, run: Callable[[str], Any] = importlib.import_module
) -> Any:
    """``run(module_name)`` (importing it), its failures as LoadErrors; ``shown``: the module as the user named it."""
    shown = shown or module_name
    try:
        return run(module_name)
    except ModuleNotFoundError as exc:
        if exc.name and module_name.startswith(exc.name) and module_name[len(exc.name) :][:1] in ("", "."):
            raise LoadError(
                f"cannot import '{module_name}' ({why}): no module named '{exc.name}'; "
                "check the spelling, run from the project root, or install the package"
            ) from exc
        raise LoadError(f"importing '{shown}' failed: {type(exc).__name__}: {exc}", user_frame(exc)) from exc
    except SyntaxError as exc:
        where = f"{os.path.relpath(exc.filename)}:{exc.lineno}" if exc.filename else None
        raise LoadError(f"importing '{shown}' failed: SyntaxError: {exc}", where) from exc
    except (Exception, SystemExit) as exc:
        raise LoadError(f"importing '{shown}' failed: {type(exc).__name__}: {exc}", user_frame(exc)) from exc
