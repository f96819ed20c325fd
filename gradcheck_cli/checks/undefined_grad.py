"""The ``undefined_grad`` check."""
from __future__ import annotations

from ..results import CheckResult, Status
from .backward import Options
from .devices import Context


def run(ctx: Context, opts: Options) -> CheckResult:
    return CheckResult("undefined_grad", Status.SKIP, message="the undefined_grad check is not available in this version of gradcheck-cli")
