"""JSON report, schema_version 1 (see the contract)."""

from __future__ import annotations

import importlib.metadata
import json
from dataclasses import fields
from typing import Any, TextIO

from ..core.printable import printable
from ..results import CaseResult, InputReport, Report, to_dict
from ..version import __version__

SCHEMA_VERSION = 1
PICTURES = [f.name for f in fields(InputReport) if not f.metadata.get("json", True)]  # data for pictures (--html)
OPTIONAL = [f.name for f in fields(CaseResult) if f.metadata.get("optional")]  # left out where None


def as_dict(report: Report, torch_version: str) -> dict[str, Any]:
    results = []
    for r in report.results:
        d = to_dict(r)
        d["duration_s"] = round(r.duration_s, 4)
        for name in OPTIONAL:  # additions to schema_version 1: absent where there is nothing to say
            if d[name] is None:
                del d[name]
        if r.shrunk is not None:
            d["shrunk"]["duration_s"] = round(r.shrunk.duration_s, 4)
        for c in d["checks"]:
            c["duration_s"] = round(c["duration_s"], 4)
            for i in c["inputs"]:
                for name in PICTURES:
                    del i[name]
        results.append(d)
    return {
        "schema_version": SCHEMA_VERSION,
        "tool": {"name": "gradcheck-cli", "version": __version__, "torch": torch_version},
        "summary": report.summary(),
        "results": results,
    }


def torch_version() -> str:
    """The installed torch's version, read from its metadata (importing torch would take seconds)."""
    try:
        return importlib.metadata.version("torch").split("+")[0]
    except importlib.metadata.PackageNotFoundError:
        return "unknown"


def render(report: Report, stream: TextIO, color: bool = False) -> None:
    # text from user code may hold lone surrogates: strict JSON readers refuse them even escaped
    json.dump(as_dict(printable(report), torch_version()), stream, indent=2, allow_nan=False)
    stream.write("\n")
