"""Text from user code made safe for any report: lone surrogates written as escapes; for a
terminal, control characters too.

Exception messages, argument and case names (YAML allows ``"\\udcff"``) and file names that are
not valid UTF-8 (Python reads them with ``surrogateescape``) can hold lone surrogates, which no
encoding can write: a report holding one would crash on its stream. They can hold terminal control
sequences as well (``"\\x1b[2J"`` clears the screen, ``"\\x1b]0;...\\x07"`` retitles the window, a
carriage return overwrites the line): text shown on a terminal (the table, the GitHub log, a
result's repr) writes them as escapes, as JSON does; the JSON report keeps the text as it is.
"""

from __future__ import annotations

import enum
import re
from dataclasses import fields, is_dataclass, replace
from typing import Any, TypeVar

T = TypeVar("T")
_SURROGATE = re.compile("[\ud800-\udfff]")
_CONTROL = re.compile("[\ud800-\udfff\x00-\x08\x0b-\x1f\x7f-\x9f]")  # all but newline and tab


def _escape(match: re.Match[str]) -> str:
    code = ord(match.group())
    if code < 0xD800:  # a control character
        return f"\\x{code:02x}"
    # U+DC80..U+DCFF is how surrogateescape keeps an undecodable byte: show the byte
    return f"\\x{code - 0xDC00:02x}" if 0xDC80 <= code <= 0xDCFF else f"\\u{code:04x}"


def printable(value: T, terminal: bool = False) -> T:
    """``value`` (a string, or a report, result, list, ... holding strings) with every lone
    surrogate in its text written as an escape: ``\\xff`` for a byte of a file name that is not
    UTF-8, ``\\ud800`` for others; with ``terminal``, every control character but newline and tab
    too (``\\x1b``, ``\\x0d``, ``\\x9b``). Values without one come back as they are."""
    out: Any = value
    found = _CONTROL if terminal else _SURROGATE
    if isinstance(value, enum.Enum):
        pass
    elif isinstance(value, str):
        out = found.sub(_escape, value) if found.search(value) else value
    elif is_dataclass(value) and not isinstance(value, type):
        changed = {f.name: printable(getattr(value, f.name), terminal) for f in fields(value) if f.init}
        if any(new is not getattr(value, name) for name, new in changed.items()):
            out = replace(value, **changed)
    elif isinstance(value, (list, tuple)):
        items = [printable(v, terminal) for v in value]
        if any(new is not old for new, old in zip(items, value)):
            out = type(value)(items)
    elif isinstance(value, dict):
        pairs = [(printable(k, terminal), printable(v, terminal)) for k, v in value.items()]
        if any(k is not old_k or v is not old_v for (k, v), (old_k, old_v) in zip(pairs, value.items())):
            out = dict(pairs)
    return out
