"""``gradcheck_cli.check()``'s arguments read as the spec loader reads the same keys, with its messages: a
value a spec refuses is a spec error there too (the case's result, kind ``spec``), never an internal error
or a check run with it (``eps=0``, ``atol=inf``, ``seed=2**64``, ``repeat=0``). A device is what torch parses
of cpu, cuda and mps (``cpu:0`` too, which device_consistency compares), never ``meta`` (it holds no values);
one this machine lacks (``cuda`` on a CPU-only torch) is a skip with the reason, as a spec's is."""

from __future__ import annotations

from typing import Any, Optional

from .sandbox.errors import BindError
from .spec.lines import Ctx
from .spec.model import SpecError
from .spec.settings import setting
from .spec.values import number, show, whole
from .spec.vocabulary import DEFS

SEEDS = 2**64  # torch's generators take a seed below this
COMPUTING = ("cpu", "cuda", "mps")  # devices whose tensors hold values (not meta) that checks can run on


def _device_type(value: Any) -> Optional[str]:
    """The type of the device ``value`` names as torch parses it ('cpu' for 'cpu:0'), or None."""
    import torch

    try:
        return str(torch.device(value).type)
    except (RuntimeError, TypeError, ValueError):
        return None


def refuse_unusable(
    *,
    eps: float,
    atol: float,
    rtol: float,
    nondet_tol: float,
    seed: Any,
    repeat: Any,
    probes: Any,
    device: Optional[str],
    other_devices: tuple[str, ...],
) -> None:
    """Raise BindError naming the first argument a spec would refuse (its key as the API spells it)."""
    ctx = Ctx("")
    try:
        number(eps, ("eps",), ctx, positive=True)
        for name, amount in (("atol", atol), ("rtol", rtol), ("nondet_tol", nondet_tol)):
            setting(amount, DEFS["non_negative"], (name,), ctx)
        setting(repeat, DEFS["repeat"], ("repeat",), ctx)
    except SpecError as exc:
        raise BindError(exc.key, str(exc).removeprefix(f": {exc.key}: ")) from None
    for name, value in [("device", device)] * (device is not None) + [("devices", d) for d in other_devices]:
        kind = _device_type(value)
        if kind not in COMPUTING:  # a spec's `device:` takes cpu, cuda, cuda:N; the API what torch parses of these
            raise BindError(name, f"expected cpu, cuda, cuda:N or mps (a device that holds values), got {show(value)}")
    found = whole(seed)
    if found is None or not 0 <= found < SEEDS:
        raise BindError("seed", f"expected a non-negative integer below 2**64, got {show(seed)}")
    count = whole(probes)
    if count is None or count < 0:
        raise BindError("probes", f"expected a non-negative integer (0: element by element), got {show(probes)}")
