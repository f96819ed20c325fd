"""The checks: one module each, one interface (``run(ctx: CheckContext) -> CheckResult``, see
``base``), and this registry.

A new check is one module here with a ``run`` function, plus one line in ``REGISTRY``. The
registry names modules instead of importing them and imports nothing of the package, so reading
the check names (spec validation, ``gradcheck --help``) costs no torch and makes no cycle. A test
ties the names to the spec schema's enum.
"""

from __future__ import annotations

import importlib
from typing import Any, Callable

REGISTRY: dict[str, str] = {  # check name -> its module in this package; `checks: all` runs them in this order
    "backward": "backward",
    "reference": "reference",
    "double_backward": "double_backward",
    "forward_ad": "forward_ad",
    "forward_over_reverse": "forward_over_reverse",
    "batched": "batched",
    "batched_forward": "batched_forward",
    "undefined_grad": "undefined_grad",
    "noncontiguous": "noncontiguous",
    "device_consistency": "device_consistency",
    "opcheck": "opcheck",
    "compile": "compile",
}
NAMES = tuple(REGISTRY)


def get(name: str) -> Callable[[Any], Any]:
    """The ``run`` function of check ``name``: ``run(ctx: CheckContext) -> CheckResult``. (Typed
    loosely so that this module imports nothing: spec validation reads NAMES from here.)"""
    run: Callable[[Any], Any] = importlib.import_module(f"{__name__}.{REGISTRY[name]}").run
    return run
