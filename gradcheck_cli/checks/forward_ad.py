"""The ``forward_ad`` check."""
from __future__ import annotations

from ..results import CheckResult, Status
from .backward import Options
from .devices import Context


def run(ctx: Context, opts: Options) -> CheckResult:
    return CheckResult("forward_ad", Status.SKIP, message="the forward_ad check is not available in this version of gradcheck-cli")
