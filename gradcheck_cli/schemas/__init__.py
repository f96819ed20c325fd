"""JSON Schemas shipped with gradcheck-cli (draft 2020-12).

``report``: the JSON report (``--format json``, schema_version 1).
``spec``: the YAML spec file format; point an editor at it with its ``yaml.schemas`` setting, or
with ``# yaml-language-server: $schema=<path or URL of spec.schema.json>`` in each document.
"""

from __future__ import annotations

import json
from importlib import resources
from typing import Any

NAMES = ("report", "spec")


def text(name: str) -> str:
    """The schema ``name`` (``report`` or ``spec``) as JSON text, exactly as shipped."""
    if name not in NAMES:
        raise ValueError(f"unknown schema {name!r}; known schemas: {', '.join(NAMES)}")
    return resources.files(__name__).joinpath(f"{name}.schema.json").read_text(encoding="utf-8")


def load(name: str) -> dict[str, Any]:
    """The schema ``name`` (``report`` or ``spec``) as a dict, ready for a JSON Schema validator."""
    return json.loads(text(name))
