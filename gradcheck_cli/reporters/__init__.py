"""Reporters: each turns a finished Report into text on a stream. One registry feeds --format."""
from __future__ import annotations

import importlib
from typing import Callable, TextIO

from ..results import Report

Render = Callable[[Report, TextIO, bool], None]  # (report, stream, color)

FORMATS = {"table": "table", "json": "json_"}


def get(name: str) -> Render:
    """The render function of format ``name`` (imported only when used)."""
    return importlib.import_module(f"{__name__}.{FORMATS[name]}").render
