"""``gradcheck_cli.check()``'s arguments read as the spec loader reads the same keys, with its messages: a
value a spec refuses is a spec error there too (the case's result, kind ``spec``), never an internal error
or a check run with it (``eps=0``, ``atol=inf``, ``seed=2**64``, ``repeat=0``). A device the spec loader
accepts but this machine lacks (``cuda`` on a CPU-only torch) is a skip with the reason, as a spec's is."""

from __future__ import annotations

from typing import Any, Optional

from .errors import BindError
from .spec.lines import Ctx
from .spec.model import SpecError
from .spec.settings import setting
from .spec.values import devices, number, show, whole
from .spec.vocabulary import DEFS

SEEDS = 2**64  # torch's generators take a seed below this


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
        if device is not None:
            devices(device, ("device",), ctx)
        if other_devices:
            devices(list(other_devices), ("devices",), ctx)
    except SpecError as exc:
        raise BindError(exc.key, str(exc).removeprefix(f": {exc.key}: ")) from None
    found = whole(seed)
    if found is None or not 0 <= found < SEEDS:
        raise BindError("seed", f"expected a non-negative integer below 2**64, got {show(seed)}")
    count = whole(probes)
    if count is None or count < 0:
        raise BindError("probes", f"expected a non-negative integer (0: element by element), got {show(probes)}")
