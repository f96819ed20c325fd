"""Reporters: each turns a finished Report into text on a stream. One registry feeds --format."""

from __future__ import annotations

import codecs
import importlib
from collections.abc import Mapping
from typing import Any, Callable, Optional, TextIO, cast

from ..results import CaseResult, Report

Render = Callable[[Report, TextIO, bool], None]  # (report, stream, color)

FORMATS = {"table": "table", "json": "json_", "github": "github"}
COLOURED = ("table",)  # the formats that may colour their output; json, github (and JUnit) never do


def get(name: str) -> Render:
    """The render function of format ``name`` (imported only when used)."""
    return importlib.import_module(f"{__name__}.{FORMATS[name]}").render


def choose_auto(env: Mapping[str, str]) -> str:
    """The format ``--format auto`` means in environment ``env`` (e.g. ``os.environ``):
    ``github`` inside a GitHub Actions job (``GITHUB_ACTIONS=true``), else ``table``."""
    return "github" if env.get("GITHUB_ACTIONS") == "true" else "table"


def use_color(flag: Optional[bool], fmt: str, env: Mapping[str, str], isatty: bool) -> bool:
    """Whether format ``fmt`` is coloured: never for a machine format (json, github, JUnit); else the
    ``--color``/``--no-color`` flag (``flag``, None when neither was given); else ``NO_COLOR`` (any
    non-empty value: no colour), then ``FORCE_COLOR`` (any non-empty value: colour); else whether stdout
    is a terminal (``isatty``) that is not ``TERM=dumb``. As pytest decides, and https://no-color.org."""
    if fmt not in COLOURED:
        return False
    if flag is not None:
        return flag
    if env.get("NO_COLOR"):
        return False
    if env.get("FORCE_COLOR"):
        return True
    return isatty and env.get("TERM") != "dumb"


def spec_file(result: CaseResult) -> Optional[str]:
    """The spec file a result came from, or None for inline and library results
    (``spec`` None or a pseudo-path such as ``<command line>``)."""
    if not result.spec or (result.spec.startswith("<") and result.spec.endswith(">")):
        return None
    return result.spec


def writable(stream: TextIO) -> TextIO:
    """``stream``, or a view of it that writes what its encoding cannot hold as escapes (``\\xe9``):
    a log file in cp1252 or ``PYTHONIOENCODING=ascii`` must not crash on a name from user code."""
    encoding = getattr(stream, "encoding", None)
    if not isinstance(encoding, str) or codecs.lookup(encoding).name == "utf-8":
        return stream
    return cast(TextIO, _Escaping(stream, encoding))


class _Escaping:
    def __init__(self, stream: TextIO, encoding: str) -> None:
        self._stream, self._encoding = stream, encoding

    def write(self, text: str) -> int:
        self._stream.write(text.encode(self._encoding, "backslashreplace").decode(self._encoding))
        return len(text)

    def __getattr__(self, name: str) -> Any:  # isatty, flush, encoding, ...: the stream's own
        return getattr(self._stream, name)
