"""A rank's collectives as gradcheck-cli sees them: each call counted and named (the coordinator's view of
where a rank is), the tensors that summing collectives write into while backward's contract is inspected
(an all-reduce into grad_output changes it, even over one rank, where its values stay), and the ranks' own
agreement on whether to go on (``checks.contract.World``), on a process group of its own so that it never
pairs with one of the user's collective calls.

For the next contributor: the agreement is the only collective gradcheck-cli calls itself; every rank calls
it at the same points of ``contract.inspect``, and it must stay out of the user's group (a mismatched pair
would hang or corrupt the user's next collective) and out of the counts the timeout message reports.
"""

from __future__ import annotations

import inspect
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any, Optional

import torch

from ..checks.contract import World
from .launch import BACKWARD, COLLECTIVE_NAMES, FORWARD, Progress

SUMMING = ("all_reduce", "reduce", "reduce_scatter", "reduce_scatter_tensor")  # write a sum (or product) in place
_written: Optional[list[torch.Tensor]] = None  # while ``recording``: what summing collectives wrote into
_originals: dict[str, Any] = {}  # torch.distributed's own functions, by name, where ``watch`` wrapped them


def watch(progress: Progress) -> None:
    """Count this rank's collective calls and note the one it is in (torch.distributed's functions as the
    user's code finds them on the module; this is a forked rank: the coordinator keeps the originals), and
    note what the summing ones write into while ``recording``."""
    import torch.distributed as dist
    import torch.distributed.distributed_c10d as c10d

    for name in COLLECTIVE_NAMES[1:]:
        original = getattr(c10d, name, None)
        if original is None:
            continue
        signature = inspect.signature(original) if name in SUMMING else None
        _originals[name] = original

        def watched(
            *args: Any, __name: str = name, __original: Any = original, __signature: Any = signature, **kwargs: Any
        ) -> Any:
            if __signature is not None and _written is not None:
                _note(__signature, args, kwargs)
            progress.enter(__name)
            try:
                return __original(*args, **kwargs)
            except BaseException as exc:
                try:
                    exc._gradcheck_collective = __name  # type: ignore[attr-defined]
                except AttributeError:
                    pass
                raise
            finally:
                progress.leave()

        for module in (dist, c10d):
            if getattr(module, name, None) is original:
                setattr(module, name, watched)


def _note(signature: inspect.Signature, args: tuple[Any, ...], kwargs: dict[str, Any]) -> None:
    """A summing collective's call: its output tensor (its first parameter), noted where it sums or multiplies."""
    try:
        bound = signature.bind(*args, **kwargs)
    except TypeError:  # the call itself raises, as the user's code will see
        return
    bound.apply_defaults()
    values = list(bound.arguments.values())
    op = bound.arguments.get("op")
    reduce = torch.distributed.ReduceOp
    if values and isinstance(values[0], torch.Tensor) and (op == reduce.SUM or op == reduce.PRODUCT):
        assert _written is not None
        _written.append(values[0])  # kept alive: its storage cannot be reused while the inspection compares


@contextmanager
def recording() -> Iterator[list[torch.Tensor]]:
    """Note what summing collectives write into, in the block (the tensors themselves)."""
    global _written
    _written = []
    try:
        yield _written
    finally:
        _written = None


def world(progress: Progress, device: str, written: list[torch.Tensor]) -> World:
    """The ranks as ``contract.inspect`` sees them: their agreement (any rank stops: all stop), the writes of
    summing collectives (``written``, from ``recording``), and the phases (forward, backward) for the
    coordinator. Made on every rank (it creates the agreement's process group, a collective)."""
    import torch.distributed as dist
    import torch.distributed.distributed_c10d as c10d

    group = dist.new_group(backend="gloo") if dist.is_gloo_available() else None
    where = "cpu" if group is not None else device
    all_reduce = _originals.get("all_reduce", c10d.all_reduce)

    def agree(stop: bool) -> bool:
        flag = torch.tensor([int(stop)], dtype=torch.int64, device=where)
        progress.agreeing()
        try:
            all_reduce(flag, op=dist.ReduceOp.MAX, group=group)
        finally:
            progress.leave()
        return bool(flag.item())

    def wrote(tensor: torch.Tensor) -> bool:
        storage = _storage(tensor)
        return storage is not None and any(_storage(w) == storage for w in written)

    def enter(what: str) -> None:
        progress.phase(FORWARD if what == "forward" else BACKWARD)

    return World(agree, wrote, enter)


def _storage(tensor: torch.Tensor) -> Optional[int]:
    """Where ``tensor``'s storage lies (None: it has none, a sparse tensor)."""
    try:
        return int(tensor.untyped_storage().data_ptr())
    except (RuntimeError, NotImplementedError):
        return None
