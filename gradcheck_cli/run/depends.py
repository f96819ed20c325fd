"""Which of the project's Python files a case depends on: the modules its spec names (``function``,
``import``, ``reference``, ``param``, ...) and, transitively, the project's modules that those import.

Read from the files alone (their ``import`` statements), so a file with a syntax error or a module
that raises on import still has its place. The project is the current directory; installed packages
(site-packages) and gradcheck-cli's own modules are not the user's code. No torch here.
"""

from __future__ import annotations

import ast
import dataclasses
import importlib.machinery
import os
import sys
import sysconfig
from collections.abc import Iterable
from pathlib import Path
from typing import Any, Optional

IMPORT_FIELDS = ("function", "imports", "reference", "reference_backward", "param", "imported")
TOOL = Path(__file__).resolve().parents[1]  # gradcheck-cli itself: never the user's code (its examples are)
SUFFIXES = (*importlib.machinery.SOURCE_SUFFIXES, *importlib.machinery.EXTENSION_SUFFIXES)

_parsed: dict[str, tuple[tuple[int, int], tuple[str, ...]]] = {}  # file -> ((mtime, size), modules it imports)
_found: dict[str, list[str]] = {}  # module name -> its project files, until ``refresh()``


def refresh() -> None:
    """Look module names up again (a file was added or removed since); parsed files stay cached by mtime."""
    _found.clear()


def named_modules(obj: Any) -> list[str]:
    """The modules a case (or a task, or run options) names in its import paths, anywhere inside it:
    ``pkg.mod:Name`` gives ``pkg.mod``; ``pkg.mod.Name`` gives ``pkg.mod.Name`` and ``pkg.mod``
    (whichever is a module: a file is looked up for each); ``torch.ops.*`` gives nothing."""
    found: list[str] = []
    _walk(obj, None, found)
    names: list[str] = []
    for path in found:
        if path.startswith("torch."):
            continue
        module, colon, _ = path.partition(":")
        names += [module] if colon else [path, path.rpartition(".")[0]]
    return [n for n in dict.fromkeys(names) if n]


def _walk(obj: Any, field: Optional[str], found: list[str]) -> None:
    if isinstance(obj, str):
        if field in IMPORT_FIELDS:
            found.append(obj)
    elif dataclasses.is_dataclass(obj) and not isinstance(obj, type):
        for f in dataclasses.fields(obj):
            _walk(getattr(obj, f.name), f.name, found)
    elif isinstance(obj, (tuple, list)):
        for item in obj:
            _walk(item, field, found)
    elif isinstance(obj, dict):
        for item in obj.values():
            _walk(item, field, found)


def is_project_file(path: str) -> bool:
    """A file of the user's project: under the current directory, outside installed packages and
    outside gradcheck-cli (except its examples)."""
    resolved = Path(path).resolve()
    cwd = Path.cwd().resolve()
    if not resolved.is_relative_to(cwd) or any(p in resolved.parts for p in ("site-packages", "dist-packages")):
        return False
    if resolved.is_relative_to(TOOL) and not resolved.is_relative_to(TOOL / "examples"):
        return False
    return not any(resolved.is_relative_to(Path(p).resolve()) for p in _installed() if p)


def _installed() -> list[str]:
    paths = sysconfig.get_paths()
    return [paths.get("stdlib", ""), paths.get("purelib", ""), paths.get("platlib", "")]


def module_files(name: str) -> list[str]:
    """The project files that importing ``name`` runs: each package's ``__init__.py`` on the way, and
    the module's own file (source or extension). Found on sys.path (and the current directory) by name."""
    if name not in _found:
        _found[name] = _module_files(name)
    return _found[name]


def _module_files(name: str) -> list[str]:
    files: list[str] = []
    parts = name.split(".")
    for root in _search_path():
        base = Path(root, *parts[:-1])
        if not base.is_dir():
            continue
        here = [str(Path(root, *parts[:i], "__init__.py")) for i in range(1, len(parts))]
        own = [str(base / parts[-1] / "__init__.py")] + [str(base / (parts[-1] + s)) for s in SUFFIXES]
        hit = next((f for f in own if os.path.isfile(f)), None)
        if hit is not None:
            files = [f for f in here if os.path.isfile(f)] + [hit]
            break
    return [str(Path(f).resolve()) for f in files if is_project_file(f)]


def _search_path() -> list[str]:
    cwd = os.getcwd()
    return list(dict.fromkeys([cwd if p == "" else p for p in sys.path] + [cwd]))


def imports_of(file: str) -> tuple[str, ...]:
    """The modules a Python file imports anywhere (module level, functions, relative imports resolved),
    and for ``from pkg import name`` also ``pkg.name`` (it may be a submodule). Cached by mtime and size;
    a file that cannot be read or parsed imports nothing (yet)."""
    try:
        st = os.stat(file)
    except OSError:
        return ()
    stamp = (st.st_mtime_ns, st.st_size)
    cached = _parsed.get(file)
    if cached is not None and cached[0] == stamp:
        return cached[1]
    names: list[str] = []
    if file.endswith(tuple(importlib.machinery.SOURCE_SUFFIXES)):
        try:
            tree = ast.parse(Path(file).read_bytes(), file)
        except (OSError, SyntaxError, ValueError):
            tree = ast.Module(body=[], type_ignores=[])
        package = _package_of(file)
        for node in ast.walk(tree):
            if isinstance(node, ast.Import):
                names += [alias.name for alias in node.names]
            elif isinstance(node, ast.ImportFrom):
                base = _absolute(node.module, node.level, package)
                if base:
                    names += [base] + [f"{base}.{alias.name}" for alias in node.names if alias.name != "*"]
    _parsed[file] = (stamp, tuple(dict.fromkeys(names)))
    return _parsed[file][1]


def _package_of(file: str) -> list[str]:
    """The dotted package a file sits in, found by walking up while there is an ``__init__.py``."""
    parts: list[str] = []
    folder = Path(file).resolve().parent
    while (folder / "__init__.py").is_file():
        parts.insert(0, folder.name)
        folder = folder.parent
    return parts


def _absolute(module: Optional[str], level: int, package: list[str]) -> Optional[str]:
    if level == 0:
        return module
    if level - 1 > len(package):
        return None
    base = package[: len(package) - (level - 1)]
    return ".".join(base + ([module] if module else [])) or None


def closure(names: Iterable[str]) -> frozenset[str]:
    """The project files that importing ``names`` runs, following the project's imports transitively."""
    seen: set[str] = set()
    todo = [f for name in names for f in module_files(name)]
    while todo:
        file = todo.pop()
        if file in seen:
            continue
        seen.add(file)
        todo += [f for name in imports_of(file) for f in module_files(name) if f not in seen]
    return frozenset(seen)


def dependents(changed: Iterable[str], files: Iterable[str]) -> frozenset[str]:
    """``changed`` and every one of ``files`` that imports one of them, directly or not: what must be
    imported afresh (a module that did ``from changed import f`` still holds the old ``f``)."""
    stale = set(changed)
    graph = {f: {d for name in imports_of(f) for d in module_files(name)} for f in files}
    grew = True
    while grew:
        grew = False
        for file, deps in graph.items():
            if file not in stale and deps & stale:
                stale.add(file)
                grew = True
    return frozenset(stale)
