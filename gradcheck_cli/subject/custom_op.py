"""A custom operator as a target: ``torch.ops.ns.op`` (its overload packet), an overload such as
``torch.ops.ns.op.default``, or the ``CustomOpDef`` that ``@torch.library.custom_op`` returns.

It is called like a function. Its Python signature is ``(*args, **kwargs)``, so its parameters
(names, kinds, defaults) come from the op's schema instead, e.g.
``ns::op(Tensor x, Tensor? bias=None, float scale=1.) -> Tensor``.
"""

from __future__ import annotations

import inspect
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any, Optional

import torch

from ..sandbox.errors import LoadError
from .target import Target

TORCH_OPS = "torch.ops."
OWN_NAMESPACES = ("aten", "prims")  # torch's own ops: forward-mode formulas come with torch


@dataclass
class OpTarget(Target):
    """A custom op: ``obj`` is what the spec names (called as is), ``overload`` the OpOverload whose
    schema names its arguments."""

    overload: Any = None

    @property
    def name(self) -> str:
        """The op's qualified name, ``ns::op``."""
        return str(self.overload._schema.name)

    @property
    def schema(self) -> str:
        """The op's schema as torch writes it."""
        return str(self.overload._schema)

    def parameters(self) -> Optional[list[inspect.Parameter]]:
        """The schema's arguments: name, kind (``Tensor``, ``Tensor?``, ``float``, ...: the annotation),
        default; keyword-only after the schema's ``*``."""
        params = []
        for arg in self.overload._schema.arguments:
            kind = inspect.Parameter.KEYWORD_ONLY if arg.kwarg_only else inspect.Parameter.POSITIONAL_OR_KEYWORD
            default = arg.default_value if arg.has_default_value() else inspect.Parameter.empty
            params.append(inspect.Parameter(arg.name, kind, default=default, annotation=arg_type(arg)))
        return params

    def forward_ad_rule(self) -> bool:
        """Whether forward-mode AD can go through the op: torch's own ops have formulas, and an op
        implemented in PyTorch ops (CompositeImplicitAutograd) is differentiated through its body;
        ``register_autograd`` (or a C++ autograd kernel) gives a backward only."""
        return self.name.split("::")[0] in OWN_NAMESPACES or torch._C._dispatch_has_kernel_for_dispatch_key(
            self.name, "CompositeImplicitAutograd"
        )

    @property
    def declares_vmap(self) -> bool:
        """Whether vmap has a batching rule for the op (``@torch.library.register_vmap``, torch's own, or a
        body in PyTorch ops); without one torch runs it once per batch element (its fallback)."""
        return any(
            torch._C._dispatch_has_kernel_for_dispatch_key(self.name, key)
            for key in ("FuncTorchBatched", "CompositeImplicitAutograd")
        )


@contextmanager
def vmap_fallback_quiet() -> Iterator[None]:
    """Inside, torch does not print its vmap fallback warning ("There is a performance drop because we have
    not yet implemented the batching rule for ns::op") to stderr, once per vmapped call of an op without a
    batching rule: the batched check says it once instead. (torch exposes no reading of the switch: it is
    left on after, its default.)"""
    switch = getattr(torch._C._functorch, "_set_vmap_fallback_warning_enabled", None)
    if switch is not None:
        switch(False)
    try:
        yield
    finally:
        if switch is not None:
            switch(True)


def arg_type(arg: Any) -> str:
    """An argument's type as the schema language writes it: ``Tensor``, ``Tensor?``, ``Tensor(a!)`` (mutated),
    ``float``, ``int[]``, ``Tensor?[]``."""
    text = _spelled(str(arg.type))
    alias = arg.alias_info
    return text + ("(a!)" if alias is not None and alias.is_write else "")


def _spelled(text: str) -> str:
    """torch's ``Optional[T]`` and ``List[T]`` as the schema writes them: ``T?``, ``T[]``."""
    for outer, suffix in (("Optional[", "?"), ("List[", "[]")):
        if text.startswith(outer) and text.endswith("]"):
            return _spelled(text[len(outer) : -1]) + suffix
    return text


def is_tensor(type_text: str) -> bool:
    """A ``Tensor`` argument (also ``Tensor(a!)``), not ``Tensor?`` nor a list of tensors."""
    return type_text.startswith("Tensor") and not type_text.rstrip(")!").endswith(("?", "[]"))


def as_op(obj: Any, path: str) -> Optional[OpTarget]:
    """``obj`` as an OpTarget when it is an op (a CustomOpDef, an OpOverloadPacket, an OpOverload), else None."""
    overload = obj
    if isinstance(obj, torch._library.custom_ops.CustomOpDef):
        overload = obj._opoverload
    elif isinstance(obj, torch._ops.OpOverloadPacket):
        names = obj.overloads()
        if "default" not in names and len(names) != 1:
            raise LoadError(f"'{path}' has the overloads {', '.join(names)}: name one, e.g. '{path}.{names[0]}'")
        overload = getattr(obj, "default" if "default" in names else names[0])
    elif not isinstance(obj, torch._ops.OpOverload):
        return None
    return OpTarget(path, obj, False, overload)


def load_op(path: str) -> OpTarget:
    """``torch.ops.ns.op`` or ``torch.ops.ns.op.overload``, registered by a module imported before."""
    parts = path.replace(":", ".")[len(TORCH_OPS) :].split(".")
    if len(parts) not in (2, 3) or not all(parts):
        raise LoadError(f"'{path}' is not an op: write torch.ops.NAMESPACE.OP, or torch.ops.NAMESPACE.OP.OVERLOAD")
    namespace, op = parts[:2]
    try:
        packet = getattr(getattr(torch.ops, namespace), op)
    except (AttributeError, RuntimeError):
        raise LoadError(
            f"no operator '{namespace}::{op}' is registered in this process: import the module that "
            "registers it (its @torch.library.custom_op or torch.library.define) before the check, "
            "with `import: [my_pkg.ops]` in the spec or --import my_pkg.ops on the command line"
        ) from None
    if len(parts) == 3:
        if parts[2] not in packet.overloads():
            raise LoadError(
                f"'{namespace}::{op}' has no overload '{parts[2]}'; its overloads: {', '.join(packet.overloads())}"
            )
        packet = getattr(packet, parts[2])
    found = as_op(packet, path)
    assert found is not None  # a packet or an overload
    return found
