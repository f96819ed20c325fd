"""Text from user code made safe for any report: lone surrogates written as escapes.

Exception messages, argument and case names (YAML allows ``"\\udcff"``) and file names that are
not valid UTF-8 (Python reads them with ``surrogateescape``) can hold lone surrogates, which no
encoding can write: a report holding one would crash on its stream.
"""
from __future__ import annotations

import enum
import re
from dataclasses import fields, is_dataclass, replace
from typing import Any, TypeVar

T = TypeVar("T")
_SURROGATE = re.compile("[\ud800-\udfff]")


def _escape(match: re.Match[str]) -> str:
    code = ord(match.group())
    # U+DC80..U+DCFF is how surrogateescape keeps an undecodable byte: show the byte
    return f"\\x{code - 0xDC00:02x}" if 0xDC80 <= code <= 0xDCFF else f"\\u{code:04x}"


def printable(value: T) -> T:
    """``value`` (a string, or a report, result, list, ... holding strings) with every lone
    surrogate in its text written as an escape: ``\\xff`` for a byte of a file name that is not
    UTF-8, ``\\ud800`` for others. Values without one come back as they are."""
    out: Any = value
    if isinstance(value, enum.Enum):
        pass
    elif isinstance(value, str):
        out = _SURROGATE.sub(_escape, value) if _SURROGATE.search(value) else value
    elif is_dataclass(value) and not isinstance(value, type):
        changed = {f.name: printable(getattr(value, f.name)) for f in fields(value) if f.init}
        if any(new is not getattr(value, name) for name, new in changed.items()):
            out = replace(value, **changed)
    elif isinstance(value, (list, tuple)):
        items = [printable(v) for v in value]
        if any(new is not old for new, old in zip(items, value)):
            out = type(value)(items)
    elif isinstance(value, dict):
        pairs = [(printable(k), printable(v)) for k, v in value.items()]
        if any(k is not old_k or v is not old_v for (k, v), (old_k, old_v) in zip(pairs, value.items())):
            out = dict(pairs)
    return out
