"""Reporters: each turns a finished Report into text on a stream. One registry feeds --format."""
from __future__ import annotations

import importlib
from collections.abc import Mapping
from typing import Callable, Optional, TextIO

from ..results import CaseResult, Report

Render = Callable[[Report, TextIO, bool], None]  # (report, stream, color)

FORMATS = {"table": "table", "json": "json_", "github": "github"}


def get(name: str) -> Render:
    """The render function of format ``name`` (imported only when used)."""
    return importlib.import_module(f"{__name__}.{FORMATS[name]}").render


def choose_auto(env: Mapping[str, str]) -> str:
    """The format ``--format auto`` means in environment ``env`` (e.g. ``os.environ``):
    ``github`` inside a GitHub Actions job (``GITHUB_ACTIONS=true``), else ``table``."""
    return "github" if env.get("GITHUB_ACTIONS") == "true" else "table"


def spec_file(result: CaseResult) -> Optional[str]:
    """The spec file a result came from, or None for inline and library results
    (``spec`` None or a pseudo-path such as ``<command line>``)."""
    if not result.spec or (result.spec.startswith("<") and result.spec.endswith(">")):
        return None
    return result.spec
