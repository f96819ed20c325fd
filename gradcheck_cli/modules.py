"""nn.Module support for the loader: building a module from the spec's ``init``, calling it with
its parameters replaced, and the RNG fork that makes a random forward repeatable.

An ``nn.Module`` class is built once per case, deterministically from the spec's seed, and its
parameters become extra arguments at the end of the bound ones, so every check treats them
like inputs. ``loader`` re-exports the public names (``RngFork``, ``init_module``).
"""
from __future__ import annotations

import difflib
import inspect
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Callable, Sequence

import torch

from .numerics import probe_generator

if TYPE_CHECKING:  # loader imports this module: only the type names are needed here
    from .loader import BindError, Bound, Target

Slots = list[list[tuple[torch.nn.Module, str]]]  # per parameter, every (submodule, name) holding it
VARIADIC = (inspect.Parameter.VAR_POSITIONAL, inspect.Parameter.VAR_KEYWORD)


def device_key(device: Any) -> str:
    """``device`` as tensors name theirs ('cuda' -> 'cuda:0')."""
    return str(torch.empty(0, device=device).device)


def parameter_slots(module: torch.nn.Module) -> Slots:
    """For each parameter of named_parameters() (tied ones once), every (submodule, name) that holds it."""
    by_id: dict[int, list[tuple[torch.nn.Module, str]]] = {}
    for qualified, p in module.named_parameters(remove_duplicate=False):
        owner, _, attr = qualified.rpartition(".")
        by_id.setdefault(id(p), []).append((module.get_submodule(owner), attr))
    return list(by_id.values())


def call_with(module: torch.nn.Module, slots: Slots, params: list[Any], args: list[Any],
              kwargs: dict[str, Any]) -> Any:
    """``module(*args, **kwargs)`` with its parameters replaced by ``params`` for this call.

    What ``torch.func.functional_call`` does (tied parameters share one value), at a fraction
    of its cost per call: this runs for every finite-difference forward.
    """
    saved = [[(m, a, m._parameters[a]) for m, a in holders] for holders in slots]
    try:
        for holders, value in zip(slots, params):
            for m, a in holders:
                m._parameters[a] = value
        return module(*args, **kwargs)
    finally:
        for held in saved:
            for m, a, old in held:
                m._parameters[a] = old


@dataclass
class RngFork:
    """The global RNG (the CPU generator and those of CUDA devices in use) forked for the checks.

    Every forward starts from the same state, seeded from the spec's seed, so a Function that
    draws random numbers (dropout) is one deterministic function for the checks, the same in any
    process; after each forward the user's state is put back. Setting a state costs about half a
    microsecond, so it is done unconditionally.
    """

    cpu: torch.Tensor  # where every forward starts
    cuda: list[tuple[int, torch.Tensor]]
    user_cpu: torch.Tensor  # what the user had
    user_cuda: list[tuple[int, torch.Tensor]]

    @classmethod
    def capture(cls, values: list[Any], seed: int = 0) -> RngFork:
        devices = sorted({v.device.index if v.device.index is not None else torch.cuda.current_device()
                          for v in values if isinstance(v, torch.Tensor) and v.is_cuda})
        return cls(torch.Generator().manual_seed(seed).get_state(),
                   [(d, torch.Generator(f"cuda:{d}").manual_seed(seed).get_state()) for d in devices],
                   torch.default_generator.get_state(),
                   [(d, torch.cuda.default_generators[d].get_state()) for d in devices])

    def restore(self) -> None:
        """Set the state every forward starts from."""
        self._set(self.cpu, self.cuda)

    def release(self) -> None:
        """Put the user's state back."""
        self._set(self.user_cpu, self.user_cuda)

    @staticmethod
    def _set(cpu: torch.Tensor, cuda: list[tuple[int, torch.Tensor]]) -> None:
        torch.default_generator.set_state(cpu)
        for d, state in cuda:
            torch.cuda.default_generators[d].set_state(state)


def bind_parameters(target: Target, bound: Bound, n_params: int) -> None:
    """Append the module's parameters, on the arguments' device, numbered after forward's parameters."""
    device = next((str(v.device) for v in bound.values if isinstance(v, torch.Tensor)), None)
    module = target._on(device)[0]
    start = max([n_params] + [i + 1 for i in bound.indices])
    for k, (name, p) in enumerate(module.named_parameters()):
        bound.values.append(p.detach().clone().requires_grad_(p.requires_grad))
        bound.names.append(name)
        bound.indices.append(start + k)


def init_module(target: Target, args: Sequence[Any], kwargs: dict[str, Any], seed: int, dtype: str,
                device: str, guard: Callable[..., Any]) -> None:
    """Build ``target``'s module from the spec's ``init``: deterministic from ``seed`` (the global RNG
    is forked, not disturbed), in ``dtype`` (floating parameters and buffers), on ``device``.

    Arguments that do not fit ``__init__`` raise BindError naming the ``init`` key; the constructor
    is called through ``guard(kind, what, fn, *args, **kwargs)``, which labels the user's errors.
    """
    if not target.is_module:
        if args or kwargs:
            raise _bind_error("init", f"{target.path} is not an nn.Module class: `init` (constructor "
                                      "arguments) applies to modules only; remove it")
        return
    _check_init(target, args, kwargs)
    shown = ", ".join([repr(a) for a in args] + [f"{k}={v!r}" for k, v in kwargs.items()])
    cuda = list(range(torch.cuda.device_count())) if torch.cuda.is_initialized() else []
    with torch.random.fork_rng(devices=cuda):
        init_seed = probe_generator(seed, 100).initial_seed()  # its own stream, not the inputs'
        torch.default_generator.manual_seed(init_seed)
        for d in cuda:
            torch.cuda.default_generators[d].manual_seed(init_seed)
        module = guard("init", f"init: {target.obj.__name__}({shown})", target.obj, *args, **kwargs)
    if not isinstance(module, torch.nn.Module):  # a __new__ that returns something else
        raise _bind_error("init", f"{target.obj.__name__}(...) returned a {type(module).__name__}, not a module")
    wanted = getattr(torch, dtype)
    if wanted.is_floating_point or wanted.is_complex:
        module = module.to(wanted)
    target.module = module.to(device)
    target.param_names = [n for n, _ in module.named_parameters()]
    target._copies = {device_key(device): (target.module, parameter_slots(target.module))}


def _check_init(target: Target, args: Sequence[Any], kwargs: dict[str, Any]) -> None:
    """BindError naming the ``init`` key when the arguments do not fit the constructor's signature."""
    name = target.obj.__name__
    try:
        sig = inspect.signature(target.obj)
    except (TypeError, ValueError):
        return
    names = [p.name for p in sig.parameters.values() if p.kind not in VARIADIC]
    listed = f"{name}({', '.join(_shown(p) for p in sig.parameters.values())})"
    if not any(p.kind is p.VAR_KEYWORD for p in sig.parameters.values()):
        for k in kwargs:
            if k not in names:
                close = difflib.get_close_matches(k, names, n=1)
                hint = f"; did you mean '{close[0]}'?" if close else ""
                raise _bind_error(f"init.kwargs.{k}", f"{name} has no constructor parameter '{k}'{hint} "
                                                      f"(the constructor is {listed})")
    try:
        sig.bind(*args, **kwargs)
    except TypeError as exc:
        key = "init.args" if "positional" in str(exc) else "init"
        raise _bind_error(key, f"the arguments do not fit {listed}: {exc}; "
                               "give them in `init: {args: [...], kwargs: {...}}`") from exc


def _shown(p: inspect.Parameter) -> str:
    """A parameter as written, without its annotation: ``bias=True``, ``*args``."""
    star = {p.VAR_POSITIONAL: "*", p.VAR_KEYWORD: "**"}.get(p.kind, "")
    return f"{star}{p.name}" + (f"={p.default!r}" if p.default is not p.empty else "")


def _bind_error(key: str, message: str) -> BindError:
    """loader's BindError (looked up at call time: loader imports this module)."""
    from . import loader

    return loader.BindError(key, message)
