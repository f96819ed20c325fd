"""The checks, one module each, and what they share: calling user code safely."""
from __future__ import annotations

from typing import Any, Callable, Optional

import torch

from ..loader import Bound, RngFork, Target, user_frame


class UserCodeError(Exception):
    """The user's forward or backward raised: the case becomes an error result."""

    def __init__(self, kind: str, message: str, where: Optional[str] = None) -> None:
        super().__init__(message)
        self.kind, self.where = kind, where


def guarded(kind: str, what: str, fn: Callable[..., Any], *args: Any, **kwargs: Any) -> Any:
    """Call user code; turn any exception into a UserCodeError that says ``what`` raised and where."""
    try:
        return fn(*args, **kwargs)
    except UserCodeError:
        raise
    except (Exception, SystemExit) as exc:  # noqa: BLE001 - user code may raise anything, even sys.exit()
        raise UserCodeError(device_kind(exc) or kind, f"{what} raised {type(exc).__name__}: {exc}",
                            user_frame(exc)) from exc


def device_kind(exc: BaseException) -> Optional[str]:
    """'out_of_memory' or 'cuda' for errors of the GPU (the latter leave its context unusable)."""
    if isinstance(exc, torch.cuda.OutOfMemoryError):
        return "out_of_memory"
    if isinstance(exc, RuntimeError) and any(s in str(exc) for s in ("CUDA error", "CUBLAS_STATUS", "CUDNN_STATUS")):
        return "cuda"
    return None


def call_forward(target: Target, bound: Bound, values: list[Any], kind: str = "forward",
                 what: str = "forward") -> Any:
    """The target's forward on ``values`` (arguments in ``bound``'s order), user errors labelled
    ``kind`` / ``what`` (as in ``guarded``).

    The global RNG is forked around every forward: each starts from a state seeded from
    ``bound.seed`` and the user's state is put back after, so a forward that draws random numbers
    (dropout) draws the same ones in every call of a check (the graph forward and each
    finite-difference forward), in any process, and the user's RNG is left as it was.
    """
    if bound.rng is None:
        bound.rng = RngFork.capture(bound.values, bound.seed)
    bound.rng.restore()
    try:
        return guarded(kind, what, target.call, values, bound.n_positional, bound.kw_names)
    finally:
        bound.rng.release()
