"""Command-line targets (spec files, directories, import paths, a Python file's ``path/to/ops.py::Name``) ->
spec cases, in order.

No torch here: resolving targets only reads YAML (and, for a bare Python file, its syntax tree).
"""

from __future__ import annotations

import ast
import fnmatch
import os
import re
from collections.abc import Callable, Iterator
from dataclasses import replace
from pathlib import Path
from typing import Any, Optional, Union

import yaml

from ..spec import Arg, Case, SpecError, file_target, is_import_path, load_file, parse_argument

SPEC_SUFFIXES = (".yaml", ".yml")
Item = Union[Case, SpecError]


class TargetError(Exception):
    """A target that names nothing checkable: a usage error (exit 2)."""


def spec_files(directory: Path) -> list[Path]:
    """Every spec file under ``directory``, recursively, in a deterministic (sorted) order."""
    return sorted(p for p in directory.rglob("*") if p.suffix in SPEC_SUFFIXES and p.is_file())


def canonical(function: str) -> str:
    """'pkg.mod:Name' and 'pkg.mod.Name' name the same thing; so do 'ops.py::Name' and './ops.py::Name'."""
    located = file_target(function)
    if located is not None:
        return f"{os.path.abspath(located[0])}::{located[1]}"
    return function.replace(":", ".")


Test = Callable[[list[str]], bool]  # -k's expression, as a test of an item's keywords
MAX_NESTING = 100  # -k's `not`s and parentheses around one word


def matching(items: list[Item], pattern: str) -> list[Item]:
    """The items named exactly ``pattern`` if any (``path::case``, as a replay command names it; a spec
    error's path), else those ``pattern`` selects as pytest's -k does: words joined by ``and``, ``or``,
    ``not`` and parentheses, each word matching a case whose name (``path::case[device]``) or function
    (``pkg.mod:Fn``) contains it, case-insensitively, or glob-matches it when it has * ? [. ValueError for
    an expression that does not parse."""
    exact = [i for i in items if _name(i) == pattern]
    if exact:
        return exact
    select = _expression(pattern)
    return [i for i in items if select(_keywords(i))]


def _name(item: Item) -> str:
    return item.name if isinstance(item, Case) else item.path


def _keywords(item: Item) -> list[str]:
    """What -k matches of an item, lowercased: its name and its function (a spec error: its path)."""
    dotted = [item.function, item.function.replace(":", ".")] if isinstance(item, Case) else []
    words = [_name(item)] + dotted
    return [w.lower() for w in words]


def _expression(pattern: str) -> Test:
    """-k's expression (``or`` of ``and``s of possibly negated words or parenthesised expressions) as a test
    of an item's keywords."""
    tokens = re.findall(r"\(|\)|[^\s()]+", pattern)
    at = 0
    depth = 0  # the `not`s and `(`s open around the word being read

    def peek() -> Optional[str]:
        return tokens[at] if at < len(tokens) else None

    def take() -> str:
        nonlocal at
        at += 1
        return tokens[at - 1]

    def joined(operator: str, part: Callable[[], Test], combine: Callable[[Iterator[bool]], bool]) -> Test:
        parts = [part()]
        while peek() == operator:
            take()
            parts.append(part())
        return parts[0] if len(parts) == 1 else lambda words: combine(p(words) for p in parts)

    def either() -> Test:
        return joined("or", both, any)

    def both() -> Test:
        return joined("and", one, all)

    def one() -> Test:
        token = peek()
        if token is None or token in ("and", "or", ")"):
            raise ValueError(f"expected a word, `not` or `(` {f'before {token!r}' if token else 'at the end'}")
        take()
        if token not in ("not", "("):
            return _word(token)
        nonlocal depth
        depth += 1
        if depth > MAX_NESTING:  # read and run by recursion: past Python's limit it would be an internal error
            raise ValueError(f"nested more than {MAX_NESTING} deep (`not`s and parentheses): write it flatter")
        if token == "not":
            inner = one()
            depth -= 1
            return lambda words: not inner(words)
        inner = either()
        if peek() != ")":
            raise ValueError("a `(` is not closed")
        take()
        depth -= 1
        return inner

    if not tokens:
        raise ValueError("empty expression")
    select = either()
    if peek() is not None:
        raise ValueError(f"unexpected {peek()!r}: join words with `and`, `or`, `not`")
    return select


def _word(word: str) -> Test:
    word = word.lower()
    if any(ch in word for ch in "*?["):
        return lambda words: any(fnmatch.fnmatchcase(w, word) for w in words)
    return lambda words: any(word in w for w in words)


def collect(
    targets: list[str],
    specs_dir: Path,
    inline: list[str],
    kwargs: list[str],
    select: str | None,
    shown: str | None = None,
) -> list[Item]:
    """The targets' cases, those whose name contains ``select`` (named ``shown`` in the message,
    default ``-k SELECT``); TargetError when there is nothing to check."""
    items = resolve(targets, specs_dir, inline, kwargs)
    if not items:
        raise TargetError(f"no spec files (*.yaml, *.yml) found in {', '.join(targets)}")
    if select is not None:
        try:
            items = matching(items, select)
        except ValueError as exc:
            quoted = select if len(select) <= 80 else f"{select[:60]}... ({len(select)} characters)"
            raise TargetError(f"{shown or f'-k {quoted}'}: {exc}") from None
        if not items:
            raise TargetError(
                f"{shown or f'-k {select}'}: it selects no case (matched against each case's name "
                "and function, case-insensitively)"
            )
    return items


def looks_like_path(target: str) -> bool:
    return target.endswith(SPEC_SUFFIXES) or os.sep in target or target in (".", "..")


def resolve(targets: list[str], specs_dir: Path, inline: list[str], kwargs: list[str]) -> list[Item]:
    """Turn each target into cases; files and directories are read, import paths looked up."""
    items: list[Item] = []
    for target in targets:
        located = file_target(target)
        if located is not None and not Path(target).exists():  # a file named `x.py::F` is still that file
            if not Path(located[0]).is_file():
                raise TargetError(f"'{target}': no such file '{located[0]}'")
            items.extend(_for_function(target, specs_dir, inline, kwargs))
        elif Path(target).exists() or looks_like_path(target):
            items.extend(item for f in files_of(target) for item in load_file(f))
        else:
            items.extend(_for_function(target, specs_dir, inline, kwargs))
    return items


def files_of(target: str) -> list[str]:
    """The spec files a file or directory target names (a directory: every spec file under it), as
    the user would write their paths."""
    path = Path(target)
    if path.is_dir():
        return [_display(f) for f in spec_files(path)]
    if path.is_file() and path.suffix == ".py":
        raise TargetError(python_file(target))
    if path.is_file():
        return [_display(path)]
    raise TargetError(f"'{target}': no such file or directory")


def python_file(target: str) -> str:
    """What to write instead of a bare Python file: ``FILE::NAME``, with the names it defines that fit."""
    try:
        names = checkable(ast.parse(Path(target).read_bytes(), target))
    except (OSError, SyntaxError, ValueError, RecursionError, MemoryError) as exc:
        unread = f" (it could not be read: {type(exc).__name__}: {exc})"
        names = []
    else:
        unread = ""
    if not names:
        return (
            f"'{target}' is a Python file, not a spec: name what to check in it, as "
            f"`gradcheck {target}::NAME -i SHAPE` (it defines no autograd.Function subclass or custom op at "
            f"its top level{unread})"
        )
    return (
        f"'{target}' is a Python file, not a spec: name what to check in it, e.g. `gradcheck {target}::{names[0]} "
        f"-i 20x20`, or write a spec with `gradcheck init {target}::{names[0]}` (it defines {', '.join(names)})"
    )


def checkable(tree: ast.Module) -> list[str]:
    """The names of the autograd.Function subclasses (a base named ``Function``, or one of these) and the
    custom ops (a decorator named ``custom_op``) defined at the top level of a module's syntax tree."""
    found: list[str] = []
    for node in tree.body:
        if isinstance(node, ast.ClassDef) and any(_named(b) in ("Function", *found) for b in node.bases):
            found.append(node.name)
        elif isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
            if any(_named(d) == "custom_op" for d in node.decorator_list):
                found.append(node.name)
    return found


def _named(node: ast.expr) -> str:
    """The last name of ``torch.autograd.Function``, ``custom_op(...)``, ``Name``: what an expression names."""
    if isinstance(node, ast.Call):
        return _named(node.func)
    if isinstance(node, ast.Attribute):
        return node.attr
    return node.id if isinstance(node, ast.Name) else ""


def _display(path: Path) -> str:
    """Paths as the user would write them: relative to the current directory when inside it."""
    try:
        return str(path.resolve().relative_to(Path.cwd().resolve()))
    except ValueError:
        return str(path)


def _for_function(function: str, specs_dir: Path, inline: list[str], kwargs: list[str]) -> list[Item]:
    if not is_import_path(function):
        raise TargetError(
            f"'{function}' is neither a spec file, a directory, nor an import path like 'pkg.mod.MyFunction' "
            "or 'path/to/ops.py::MyFunction'"
        )
    if inline or kwargs:
        return [inline_case(function, inline, kwargs)]
    found: list[Item] = []
    if specs_dir.is_dir():
        for f in spec_files(specs_dir):
            found += [
                c
                for c in load_file(_display(f))
                if isinstance(c, Case) and canonical(c.function) == canonical(function)
            ]
    if not found:
        raise TargetError(
            f"no spec for '{function}' in {specs_dir}/ and no inline inputs. Either give input shapes "
            f"(gradcheck {function} -i 20x20 -i 30x20), point --specs at your spec folder, or write a spec "
            f"(gradcheck init {function} -o {specs_dir}/{function.split('.')[-1].split(':')[-1].lower()}.yaml)"
        )
    return found


def inline_case(function: str, inline: list[str], kwargs: list[str]) -> Case:
    """A case built from ``-i SHAPE[:DTYPE]`` / ``-i =VALUE`` and ``--kwarg NAME=VALUE`` options."""
    args = [_inline_arg(text, f"-i {text}") for text in inline]
    kw = []
    for text in kwargs:
        name, eq, value = text.partition("=")
        if not eq or not name.isidentifier():
            raise TargetError(f"--kwarg {text}: expected NAME=VALUE, e.g. --kwarg dim=-1")
        kw.append((name, replace(_inline_arg("=" + value, f"--kwarg {text}"), name=name)))
    return Case(path="<command line>", label="inline", function=function, inputs=tuple(args), kwargs=tuple(kw))


def _inline_arg(text: str, option: str) -> Arg:
    """``-i 20x20[:DTYPE]``, ``-i scalar`` or ``-i =VALUE``, read as the spec entry it stands for."""
    if text.startswith("="):
        try:
            entry: dict[str, Any] = {"value": yaml.safe_load(text[1:])}
        except yaml.YAMLError as exc:
            raise TargetError(f"{option}: not a YAML value: {exc}") from exc
    else:
        shape_text, _, dtype = text.partition(":")
        if shape_text in ("", "scalar", "[]"):
            entry = {"shape": []}
        elif re.fullmatch(r"\d+(x\d+)*", shape_text):
            entry = {"shape": [int(d) for d in shape_text.split("x")]}
        else:
            raise TargetError(
                f"{option}: expected a shape like 20x20 (or 'scalar'), optionally with :DTYPE, "
                "or =VALUE for a non-tensor argument"
            )
        entry.update({"dtype": dtype} if dtype else {})
    try:
        return parse_argument(entry, option)
    except SpecError as exc:
        raise TargetError(str(exc)) from exc
