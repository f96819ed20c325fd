"""One value of a spec, read and checked where it stands: a number (also written as text), a whole
number, a dtype, an import path, a device, a module name; a mapping's keys against those allowed; a
value shown short in a message."""

from __future__ import annotations

import difflib
import math
import re
from collections.abc import Iterator
from typing import Any, Optional

from .lines import Ctx
from .model import DTYPES, Key

DEVICE_RE = re.compile(r"cpu|cuda(:\d+)?|mps")  # used with fullmatch: `$` would let a trailing newline in
FUNCTION_RE = re.compile(r"[A-Za-z_][\w.]*(:[A-Za-z_][\w.]*)?")  # likewise
MODULE_RE = re.compile(r"[A-Za-z_]\w*(\.[A-Za-z_]\w*)*")  # a module name for `import`; likewise
# a Python file's object, as pytest names a test: `path/to/ops.py::Name` (also `C:\x\ops.py::Outer.Inner`): the
# greedy file part makes the split the LAST `::`, as the name holds no colon; likewise used with fullmatch
FILE_TARGET_RE = re.compile(r"(.+\.py)::([A-Za-z_][A-Za-z0-9_]*(?:\.[A-Za-z_][A-Za-z0-9_]*)*)")
# a number written as a string ('1e-6': YAML 1.1 reads an exponent without a dot as text); the JSON
# Schema's `number` pattern is the same (a test compares them), so editors accept what runs accept
NUMERIC_RE = re.compile(r"[+-]?([0-9]+(\.[0-9]*)?|\.[0-9]+)([eE][+-]?[0-9]+)?", re.ASCII)


def is_device(text: str) -> bool:
    """cpu, cuda, cuda:N or mps, exactly."""
    return DEVICE_RE.fullmatch(text) is not None


def is_import_path(text: str) -> bool:
    """'pkg.mod:Name' or 'pkg.mod.Name' (at least one dot), or a file's 'path/to/ops.py::Name', exactly."""
    dotted = FUNCTION_RE.fullmatch(text) is not None and "." in text.replace(":", ".")
    return dotted or file_target(text) is not None


def file_target(text: str) -> Optional[tuple[str, str]]:
    """(file, name) of 'path/to/ops.py::Name', split at the last ``::``; None for anything else."""
    found = FILE_TARGET_RE.fullmatch(text)
    return (found[1], found[2]) if found else None


def is_module_name(text: str) -> bool:
    """'pkg' or 'pkg.mod', exactly."""
    return MODULE_RE.fullmatch(text) is not None


def whole(value: Any) -> Optional[int]:
    """An integer, also written as a whole float (``1.0``: JSON, and so the JSON Schema and editors, do
    not tell 1.0 from 1); None for anything else (a bool, a fraction, text)."""
    if isinstance(value, float) and value.is_integer():
        return int(value)
    return value if isinstance(value, int) and not isinstance(value, bool) else None


def number(value: Any, key: Key, ctx: Ctx, positive: bool = False) -> float:
    """A YAML number; also a numeric string such as '1e-6' (YAML 1.1 reads that as text)."""
    written = value
    if isinstance(value, str) and NUMERIC_RE.fullmatch(value):
        value = float(value)
    try:
        bad = (
            isinstance(value, bool)
            or not isinstance(value, (int, float))
            or not math.isfinite(value)
            or (positive and not value > 0)
        )
    except OverflowError:  # an int too large for a float
        bad = True
    if bad:
        raise ctx.fail(key, f"expected a finite {'positive ' if positive else ''}number, got {show(written)}")
    return float(value)


def import_path(value: Any, key: Key, ctx: Ctx) -> str:
    """An import path (``pkg.mod:Name`` or ``pkg.mod.Name``, or a file's ``path/to/ops.py::Name``, relative to
    the current directory): ``function``, ``reference``, ``param``, ..."""
    if not isinstance(value, str) or not is_import_path(value):
        raise ctx.fail(
            key,
            "expected an import path like 'pkg.mod:MyFunction' or 'pkg.mod.MyFunction', or a file's "
            f"'path/to/ops.py::MyFunction', got {show(value)}",
        )
    return value


def module_names(value: Any, key: Key, ctx: Ctx) -> tuple[str, ...]:
    """``import``: one module name or a list of them (``null`` or ``[]``: none)."""
    items = [] if value is None else [value] if isinstance(value, str) else value
    if not isinstance(items, list):
        raise ctx.fail(key, f"expected a module name or a list of them, e.g. `import: [my_pkg.ops]`, got {show(value)}")
    for i, name in enumerate(items):
        if not isinstance(name, str) or not is_module_name(name):
            raise ctx.fail(
                key if isinstance(value, str) else key + (i,),
                f"expected a module name like 'my_pkg.ops' (no ':' and no attribute), got {show(name)}",
            )
    return tuple(dict.fromkeys(items))


def devices(value: Any, key: Key, ctx: Ctx) -> tuple[str, ...]:
    """``device``: one device or a list of them, each once."""
    items = value if isinstance(value, list) else [value]
    if not items or not all(isinstance(d, str) and is_device(d) for d in items):
        raise ctx.fail(key, f"expected cpu, cuda, cuda:N (or a list of these), got {show(value)}")
    return tuple(dict.fromkeys(items))


def dtype_of(value: Any, key: Key, ctx: Ctx) -> str:
    """The dtype a name or alias (``double``, ``half``, ...) stands for."""
    if not isinstance(value, str) or value not in DTYPES:  # a list or mapping is unhashable
        raise ctx.fail(key, f"unknown dtype {show(value)}; use one of {', '.join(sorted(set(DTYPES.values())))}")
    return DTYPES[value]


def mapping(value: Any, key: Key, allowed: tuple[str, ...], ctx: Ctx) -> None:
    """Refuse anything but a mapping whose keys are all in ``allowed``."""
    if not isinstance(value, dict):
        raise ctx.fail(key, f"expected a mapping with keys {', '.join(allowed)}; got {show(value)}")
    for k in value:
        if k not in allowed:
            raise ctx.fail(
                key + (k,), f"unknown key{did_you_mean(k, allowed)}; allowed keys here: {', '.join(allowed)}"
            )


def did_you_mean(key: Any, allowed: tuple[str, ...]) -> str:
    """`` (did you mean 'shape'?)`` for a key written close to an allowed one (a typo), else ''."""
    close = difflib.get_close_matches(str(key), list(allowed), n=1, cutoff=0.6)
    return f" (did you mean {close[0]!r}?)" if close else ""


SHOWN = 60  # characters of a value that a message quotes, at most


def show(value: Any) -> str:
    """``value`` as a message quotes it, spelled as YAML writes it (``null``, ``true``, ``.inf``, ``[1, null]``;
    text quoted, ``'x'``), cut to 60 characters."""
    text = ""
    for piece in _yaml(value):
        text += piece
        if len(text) > SHOWN:
            return text[: SHOWN - 3] + "..."
    return text


def _yaml(value: Any) -> Iterator[str]:
    """The pieces of ``value`` in YAML's flow style, outermost first (a message reads only its start)."""
    if value is None:
        yield "null"
    elif isinstance(value, bool):
        yield "true" if value else "false"
    elif isinstance(value, float) and not math.isfinite(value):
        yield ".nan" if math.isnan(value) else ".inf" if value > 0 else "-.inf"
    elif isinstance(value, (list, tuple)):
        yield "["
        for i, item in enumerate(value):
            yield ", " if i else ""
            yield from _yaml(item)
        yield "]"
    elif isinstance(value, dict):
        yield "{"
        for i, (k, item) in enumerate(value.items()):
            yield ", " if i else ""
            yield from _yaml(k)
            yield ": "
            yield from _yaml(item)
        yield "}"
    else:
        yield repr(value)
