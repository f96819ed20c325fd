"""The errors that make a case an error result, and where in the user's code they arose.

Every exception here becomes one ``ErrorInfo`` of one case in the runner: bad data and broken
user code are results, never crashes of the tool.
"""

from __future__ import annotations

import importlib
import os
import traceback
from typing import Any, Callable, Optional

import torch

from ..results import ErrorKind
from .state_guard import GUARD


class UserCodeError(Exception):
    """The user's code raised (forward, backward, jvp, a constructor): the case becomes an error result."""

    def __init__(
        self, kind: ErrorKind, message: str, where: Optional[str] = None, frames: tuple[str, ...] = ()
    ) -> None:
        super().__init__(message)
        self.kind, self.where, self.frames = kind, where, frames  # frames: user_frames of what it raised


class LoadError(Exception):
    """The target (or what spec key ``key`` names) cannot be imported or is not something we can check."""

    def __init__(self, message: str, where: Optional[str] = None, key: str = "function") -> None:
        super().__init__(message)
        self.where, self.key = where, key


class BindError(Exception):
    """Spec arguments that do not fit the target's signature. ``key`` is the spec key path."""

    def __init__(self, key: str, message: str) -> None:
        super().__init__(message)
        self.key = key


def _user_frames(exc: BaseException) -> list[traceback.FrameSummary]:
    """The traceback frames of ``exc`` in the user's code (not torch, not us), outermost first."""
    ours = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))  # the package, this module's folder's parent
    skip = (os.path.dirname(torch.__file__), ours, "<", os.path.dirname(importlib.__file__))

    def is_user(filename: str) -> bool:
        return not filename.startswith(skip) or filename.startswith(os.path.join(ours, "examples"))

    return [f for f in traceback.extract_tb(exc.__traceback__) if is_user(f.filename)]


def user_frame(exc: BaseException) -> Optional[str]:
    """``file:line (code)`` of the innermost traceback frame in the user's code (not torch, not us)."""
    frames = _user_frames(exc)
    if not frames:
        return None
    frame = frames[-1]
    where = f"{os.path.relpath(frame.filename)}:{frame.lineno}"
    return f"{where} ({frame.line.strip()})" if frame.line else where


def user_frames(exc: BaseException) -> tuple[str, ...]:
    """Every traceback frame of ``exc`` in the user's code, outermost first, as ``file:line in function
    (code)``: the traceback a report shows (--tb)."""
    return tuple(
        f"{os.path.relpath(f.filename)}:{f.lineno} in {f.name}" + (f" ({f.line.strip()})" if f.line else "")
        for f in _user_frames(exc)
    )


def device_kind(exc: BaseException) -> Optional[ErrorKind]:
    """OUT_OF_MEMORY for an allocation that failed (GPU, or CPU: torch's allocator, or Python's), CUDA for
    other errors of the GPU (they leave its context unusable)."""
    if isinstance(exc, (torch.cuda.OutOfMemoryError, MemoryError)) or (
        isinstance(exc, RuntimeError) and "DefaultCPUAllocator: can't allocate memory" in str(exc)
    ):
        return ErrorKind.OUT_OF_MEMORY
    if isinstance(exc, RuntimeError) and any(s in str(exc) for s in ("CUDA error", "CUBLAS_STATUS", "CUDNN_STATUS")):
        return ErrorKind.CUDA
    return None


def guarded(kind: ErrorKind, what: str, fn: Callable[..., Any], *args: Any, **kwargs: Any) -> Any:
    """Call user code; turn any exception into a UserCodeError that says ``what`` raised and where."""
    try:
        with GUARD.kept_for_call():
            return fn(*args, **kwargs)
    except UserCodeError:
        raise
    except KeyboardInterrupt:  # Ctrl-C in this process: the run stops (an isolated worker never gets one)
        raise
    except BaseException as exc:
        raise UserCodeError(
            device_kind(exc) or kind, f"{what} raised {type(exc).__name__}: {exc}", user_frame(exc), user_frames(exc)
        ) from exc
