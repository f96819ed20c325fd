"""How a result shows itself in a notebook or with rich (``__rich__``, ``_repr_html_``): registers the
table and HTML reporters' drawings with the result model, which imports no reporter. The library API,
the edge that hands results out, imports this module."""

from __future__ import annotations

from typing import Any, Optional

from ..results import CaseResult, Report, shown_as
from .html import fragment
from .table import case_group, report_group


def _rich(results: list[CaseResult], report: Optional[Report]) -> Any:
    return report_group(report) if report is not None else case_group(results[0])


shown_as("rich", _rich)
shown_as("html", fragment)
