"""The ``double_backward`` check."""
from __future__ import annotations

from ..results import CheckResult, Status
from .backward import Options
from .devices import Context


def run(ctx: Context, opts: Options) -> CheckResult:
    return CheckResult("double_backward", Status.SKIP, message="the double_backward check is not available in this version of gradcheck-cli")
