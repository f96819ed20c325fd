"""The compile check's truth set (issue 28): in-place (``ctx.mark_dirty``) Functions and modules with
state that compile and eager differentiate alike (the check must pass them), and Functions and modules
whose compiled gradient differs from eager's (it must fail them).

Each entry is (name, spec text of the inputs and init); specs name the classes here as
``tests.compile_truth:NAME``.
"""

from __future__ import annotations

from typing import Any

import torch
from torch import Tensor

# ---- in-place Functions (mark_dirty), right under compile --------------------------------------------------


class SigmoidInPlace(torch.autograd.Function):
    """x.sigmoid_(): d s / dx = s (1 - s), from the saved result."""

    @staticmethod
    def forward(ctx: Any, x: Tensor) -> Tensor:
        x.sigmoid_()
        ctx.mark_dirty(x)
        ctx.save_for_backward(x)
        return x

    @staticmethod
    def backward(ctx: Any, grad: Tensor) -> Tensor:
        (s,) = ctx.saved_tensors
        return grad * s * (1 - s)


class TanhInPlace(torch.autograd.Function):
    """x.tanh_(): d t / dx = 1 - t^2."""

    @staticmethod
    def forward(ctx: Any, x: Tensor) -> Tensor:
        x.tanh_()
        ctx.mark_dirty(x)
        ctx.save_for_backward(x)
        return x

    @staticmethod
    def backward(ctx: Any, grad: Tensor) -> Tensor:
        (t,) = ctx.saved_tensors
        return grad * (1 - t * t)


class AddScaledInPlace(torch.autograd.Function):
    """x.add_(y, alpha=a): x changes, y does not; d/dx = 1, d/dy = a."""

    @staticmethod
    def forward(ctx: Any, x: Tensor, y: Tensor, a: float) -> Tensor:
        ctx.a = a
        x.add_(y, alpha=a)
        ctx.mark_dirty(x)
        return x

    @staticmethod
    def backward(ctx: Any, grad: Tensor) -> tuple[Tensor, Tensor, None]:
        return grad, grad * ctx.a, None


class MulInPlace(torch.autograd.Function):
    """x.mul_(y): x's values before the change are saved (a copy), then d/dx = y, d/dy = x."""

    @staticmethod
    def forward(ctx: Any, x: Tensor, y: Tensor) -> Tensor:
        ctx.save_for_backward(x.clone(), y)
        x.mul_(y)
        ctx.mark_dirty(x)
        return x

    @staticmethod
    def backward(ctx: Any, grad: Tensor) -> tuple[Tensor, Tensor]:
        x, y = ctx.saved_tensors
        return grad * y, grad * x


class SquareInPlaceTwoOutputs(torch.autograd.Function):
    """(x.pow_(2), x.sum() of the input): an in-place output beside a new one."""

    @staticmethod
    def forward(ctx: Any, x: Tensor) -> tuple[Tensor, Tensor]:
        total = x.sum()
        ctx.save_for_backward(x.clone())
        x.pow_(2)
        ctx.mark_dirty(x)
        return x, total

    @staticmethod
    def backward(ctx: Any, grad: Tensor, grad_total: Tensor) -> Tensor:
        (x,) = ctx.saved_tensors
        return 2 * x * grad + grad_total


# ---- modules with state, right under compile -----------------------------------------------------------------


class CountsCalls(torch.nn.Module):
    """A linear map that counts its calls in a buffer, in place; the count is not in the output."""

    calls: Tensor

    def __init__(self, features: int) -> None:
        super().__init__()
        self.weight = torch.nn.Parameter(torch.randn(features, features) / features)
        self.register_buffer("calls", torch.zeros((), dtype=torch.int64))

    def forward(self, x: Tensor) -> Tensor:
        self.calls += 1
        return torch.tanh(x @ self.weight.t())


class UpdateThenUse(torch.nn.Module):
    """Moves its running mean towards the batch's in place, then uses the updated mean: eager and compiled
    code both differentiate the values used, which are the updated ones."""

    running_mean: Tensor

    def __init__(self, features: int) -> None:
        super().__init__()
        self.weight = torch.nn.Parameter(1 + 0.1 * torch.randn(features))
        self.register_buffer("running_mean", 0.5 * torch.randn(features))

    def forward(self, x: Tensor) -> Tensor:
        with torch.no_grad():
            self.running_mean.lerp_(x.mean(0), 0.1)
        return torch.sin(x - self.running_mean) * self.weight


class ExponentialAverage(torch.nn.Module):
    """Scales by an exponential average of the batch's norm, kept in a buffer that is assigned anew."""

    average: Tensor

    def __init__(self, features: int) -> None:
        super().__init__()
        self.weight = torch.nn.Parameter(torch.randn(features))
        self.register_buffer("average", torch.ones(()))

    def forward(self, x: Tensor) -> Tensor:
        out = x * self.weight / (1 + self.average)
        if self.training:
            with torch.no_grad():
                self.average = 0.9 * self.average + 0.1 * x.norm()
        return out


# ---- compiled gradient differs from eager's -------------------------------------------------------------------


class RunningNorm1dInPlace(torch.nn.Module):
    """gradcheck_cli.examples.stateful.RunningNorm1d as it was: the running statistics are changed in place
    (``lerp_``) after forward used them. Eager autograd differentiates the values used; the backward
    torch.compile makes (torch 2.13, aot_eager) reads the buffers as forward left them."""

    running_mean: Tensor
    running_var: Tensor

    def __init__(self, features: int, momentum: float = 0.1, eps: float = 1e-5) -> None:
        super().__init__()
        self.momentum, self.eps = momentum, eps
        self.weight = torch.nn.Parameter(1 + 0.1 * torch.randn(features))
        self.bias = torch.nn.Parameter(0.1 * torch.randn(features))
        self.register_buffer("running_mean", 0.5 * torch.randn(features))
        self.register_buffer("running_var", 1 + torch.rand(features))

    def forward(self, x: Tensor) -> Tensor:
        out = (x - self.running_mean) / torch.sqrt(self.running_var + self.eps) * self.weight + self.bias
        if self.training:
            with torch.no_grad():
                self.running_mean.lerp_(x.mean(0), self.momentum)
                self.running_var.lerp_(x.var(0), self.momentum)
        return out


class Sin(torch.autograd.Function):
    """sin x, with x saved in setup_context (so torch.func runs it): the base of the two below."""

    @staticmethod
    def forward(x: Tensor) -> Tensor:
        return torch.sin(x)

    @staticmethod
    def setup_context(ctx: Any, inputs: tuple[Any, ...], output: Any) -> None:
        ctx.save_for_backward(*inputs)

    @staticmethod
    def backward(ctx: Any, grad: Tensor) -> Tensor:
        (x,) = ctx.saved_tensors
        return grad * torch.cos(x)


class SinWithZeroBackward(Sin):
    """PyTorch issue 193279's repro: a backward that returns zeros on purpose. Under
    torch.compile(torch.func.vjp(...)) dynamo inlines forward and drops this backward (the gradient is
    cos x); eager, and the compiled backward of the callable, give zeros."""

    @staticmethod
    def backward(ctx: Any, grad: Tensor) -> Tensor:
        return torch.zeros_like(grad)


class BranchUnderCompile(Sin):
    """sin, whose backward takes another branch when torch.compile traces it (``torch.compiler.is_compiling()``),
    and that branch is wrong (2 cos x): the Function's own compiled backward differs, so the compile check
    blames the Function, not torch.compile. (Compiled torch.func.vjp drops this backward and agrees.)"""

    @staticmethod
    def backward(ctx: Any, grad: Tensor) -> Tensor:
        (x,) = ctx.saved_tensors
        if torch.compiler.is_compiling():
            return 2 * grad * torch.cos(x)
        return grad * torch.cos(x)


SHAPE = "inputs: [{name: x, shape: [3, 4]}]"
RIGHT_IN_PLACE: list[tuple[str, str]] = [
    ("gradcheck_cli.examples.inplace:ExpInPlace", SHAPE),
    ("gradcheck_cli.examples.inplace:ScaleInPlace", "inputs: [{name: x, shape: [3, 4]}, {name: a, value: 3.0}]"),
    ("tests.compile_truth:SigmoidInPlace", SHAPE),
    ("tests.compile_truth:TanhInPlace", SHAPE),
    (
        "tests.compile_truth:AddScaledInPlace",
        "inputs: [{name: x, shape: [3, 4]}, {name: y, shape: [3, 4]}, {name: a, value: -2.0}]",
    ),
    ("tests.compile_truth:MulInPlace", "inputs: [{name: x, shape: [3, 4]}, {name: y, shape: [3, 4]}]"),
    ("tests.compile_truth:SquareInPlaceTwoOutputs", SHAPE),
]
# right Functions that torch.func runs (setup_context): both compiled paths agree with eager
RIGHT_PLAIN: list[tuple[str, str]] = [
    ("tests.compile_truth:Sin", SHAPE),
    ("gradcheck_cli.examples.compiled:ScaledTanh", "inputs: [{name: x, shape: [3, 4]}, {name: a, value: 2.0}]"),
]
ROWS = "inputs: [{name: x, shape: [6, 4]}]"
RIGHT_STATEFUL: list[tuple[str, str]] = [
    ("gradcheck_cli.examples.stateful:RunningNorm1d", f"init: {{args: [4]}}\n{ROWS}"),
    ("gradcheck_cli.examples.stateful:RunningNorm1d", f"init: {{args: [4], mode: eval}}\n{ROWS}"),
    ("torch.nn.BatchNorm1d", f"init: {{args: [4]}}\n{ROWS.replace('x', 'input')}"),
    ("torch.nn.BatchNorm1d", f"init: {{args: [4], mode: eval}}\n{ROWS.replace('x', 'input')}"),
    ("tests.compile_truth:CountsCalls", f"init: {{args: [4]}}\n{ROWS}"),
    ("tests.compile_truth:UpdateThenUse", f"init: {{args: [4]}}\n{ROWS}"),
    ("tests.compile_truth:ExponentialAverage", f"init: {{args: [4]}}\n{ROWS}"),
]
TORCH = "this is torch.compile's divergence on the torch.func.vjp path, not the Function's"
# (function, spec text, words the compile check's message must hold, whether the words put it on torch.compile)
BROKEN: list[tuple[str, str, str, bool]] = [
    (
        "tests.compile_truth:RunningNorm1dInPlace",
        f"init: {{args: [4]}}\n{ROWS}",
        "forward changes buffers 'running_mean', 'running_var' in place",
        False,
    ),
    (
        "gradcheck_cli.examples.compiled:RoundSTE",
        "inputs: [{name: x, shape: [4], std: 2.0}]",
        "'x': compiled torch.func.vjp: its gradient is all zeros, eager's is not",
        True,
    ),
    (
        "tests.compile_truth:SinWithZeroBackward",
        SHAPE,
        "'x': compiled torch.func.vjp: its gradient is not zero, eager's is",
        True,
    ),
    (
        "tests.compile_truth:BranchUnderCompile",
        SHAPE,
        "'x': compiled backward: its gradient is 2.00x eager's; compiled autograd.grad (what loss.backward() of a "
        "compiled model runs) differs from eager: the target's own code computes otherwise",
        False,
    ),
]
