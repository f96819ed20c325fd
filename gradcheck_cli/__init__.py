"""gradcheck-cli: check the hand-written backward of custom autograd Functions.

The library API is :func:`check`; the command line is ``gradcheck`` (see ``gradcheck --help``).
Importing this package does not import torch.
"""
from __future__ import annotations

from typing import TYPE_CHECKING, Any, Optional, Sequence

__version__ = "0.1.0"  # the one place the version is written: pyproject.toml reads it from here
FAST_PROBES = 3  # random probes per argument for --fast (the first non-negative, the others signed)

if TYPE_CHECKING:
    from .results import CaseResult


def check(
    fn: Any,
    args: Sequence[Any],
    kwargs: Optional[dict[str, Any]] = None,
    *,
    eps: float = 1e-6,
    atol: float = 1e-5,
    rtol: float = 1e-3,
    nondet_tol: float = 0.0,
    seed: int = 0,
    probes: int = 0,
) -> "CaseResult":
    """Check the backward of ``fn`` (an autograd.Function class or any callable) at ``args``.

    ``kwargs`` are bound to forward's signature by name. Tolerances default to
    torch.autograd.gradcheck's. ``probes > 0`` decides with that many random probes
    first and compares element by element only the arguments where one fails. Returns a
    CaseResult: ``.status`` is a Status, ``.checks[0]`` the backward check with one
    ``InputReport`` per argument. Never raises for errors in
    ``fn``: they come back as ``.error``.
    """
    import torch

    from . import loader, runner
    from .checks import backward
    from .results import CaseResult, Status
    from .spec import Tolerance

    is_function = isinstance(fn, type) and issubclass(fn, torch.autograd.Function)
    name = f"{getattr(fn, '__module__', '')}.{getattr(fn, '__qualname__', repr(fn))}"
    target = loader.Target(name, fn, is_function)
    result = CaseResult(id=name, spec=None, case=None, function=name, device="", seed=seed, status=Status.PASS)
    default = Tolerance()
    given = tuple(k for k, v in (("eps", eps), ("atol", atol), ("rtol", rtol)) if v != getattr(default, k))
    opts = backward.Options(Tolerance(eps, atol, rtol, nondet_tol, given), seed, probes=probes)

    def body(result: CaseResult) -> None:
        bound = loader.bind(target, [(None, a) for a in args], list((kwargs or {}).items()))
        bound.seed = seed
        devices = {str(v.device) for v in bound.values if isinstance(v, torch.Tensor)}
        result.device = ",".join(sorted(devices)) or "cpu"
        result.checks.append(backward.run(target, bound, opts))

    return runner.guard(result, body)
