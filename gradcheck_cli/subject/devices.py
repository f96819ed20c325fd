"""Devices: whether one can be used here, whether a check will fit in its memory, and whether a process
forked from this one can run backward (not on a machine with a GPU once this one has)."""

from __future__ import annotations

import os
import signal
import time
import warnings
from typing import Any, Optional

import torch

MEMORY_FACTOR = 6  # leaves, outputs, saved tensors, grad_outputs, gradients, slack: x (inputs + outputs)


def device_problem(device: str) -> Optional[str]:
    """Why ``device`` cannot be used here, or None when it can."""
    kind, _, index = device.partition(":")
    if kind == "cpu":
        return None
    if kind == "cuda":
        if not torch.cuda.is_available():
            return "CUDA is not available on this machine (torch was built without CUDA or no GPU is visible)"
        if index and int(index) >= torch.cuda.device_count():
            return f"{device} does not exist: this machine has {torch.cuda.device_count()} CUDA device(s)"
        return None
    if kind == "mps" and not (hasattr(torch.backends, "mps") and torch.backends.mps.is_available()):
        return "MPS is not available on this machine"
    return None


def nbytes(values: Any) -> int:
    """Bytes held by the tensors among ``values``."""
    return sum(v.numel() * v.element_size() for v in values if isinstance(v, torch.Tensor))


def memory_problem(values: list[Any], outputs: tuple[Any, ...], device: str, batch: int = 0) -> Optional[str]:
    """On a CUDA device: a refusal when a check will likely not fit in free GPU memory (its
    arguments, outputs and their copies, and ``batch`` bytes of batched calls)."""
    if not device.startswith("cuda"):
        return None
    need = MEMORY_FACTOR * (nbytes(values) + nbytes(outputs)) + batch
    free, _ = torch.cuda.mem_get_info(torch.device(device))
    if need <= free:
        return None
    return (
        f"this check needs about {need / 2**30:.2f} GiB on {device}, but only {free / 2**30:.2f} GiB "
        "are free: use smaller shapes, or free GPU memory (another process may hold it)"
    )


PROBE_SECONDS = 10.0  # a probe child that has not answered by then counts as refused (and is ended)
_refused: list[bool] = []  # a probe found forks refused: they stay refused (torch's flag is never reset)


def forks_run_backward() -> bool:
    """Whether a process forked from this one now can run backward. Torch refuses backward in a child forked
    after autograd started its device threads, which its first backward does where a GPU (or another
    accelerator) is visible. Asked of torch itself: a child is forked that runs a one-element backward; a
    refusal is remembered."""
    if _refused or not hasattr(os, "fork"):
        return False
    blocked = signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGINT, signal.SIGTERM})
    try:
        with warnings.catch_warnings():  # a multi-threaded process: the child only runs the probe, then ends
            warnings.simplefilter("ignore", DeprecationWarning)
            pid = os.fork()
        if pid == 0:  # the child: never returns
            code = 1
            try:
                signal.signal(signal.SIGINT, signal.SIG_IGN)
                signal.signal(signal.SIGTERM, signal.SIG_DFL)
                torch.set_num_threads(1)  # not the parent's OpenMP pool
                x = torch.ones(1, requires_grad=True)
                code = 0 if torch.autograd.grad(x * 2, x)[0].item() == 2 else 1
            finally:
                os._exit(code)
    finally:
        signal.pthread_sigmask(signal.SIG_SETMASK, blocked)
    deadline, done, status = time.monotonic() + PROBE_SECONDS, 0, 0
    try:
        done, status = os.waitpid(pid, os.WNOHANG)
        while not done and time.monotonic() < deadline:
            time.sleep(0.005)
            done, status = os.waitpid(pid, os.WNOHANG)
    finally:
        if not done:  # past the deadline, or this process interrupted: the child ends too
            os.kill(pid, signal.SIGKILL)
            os.waitpid(pid, 0)
    if done and os.waitstatus_to_exitcode(status) == 0:
        return True
    _refused.append(True)
    return False
