"""Modules with state: forward updates a buffer (running statistics) that its output uses.

``RunningNorm1d`` normalizes by its running mean and variance as they are before the batch, then
updates them from the batch (an online normalizer, as observation normalizers in reinforcement
learning do; ``init: {mode: eval}`` freezes them). Called twice on the same input it gives two
different outputs, so finite differences taken one call after another see a different function
each time; gradcheck puts the buffers back after every call and says that forward mutates them.

The new statistics are assigned to the buffers, not written into them in place (``lerp_``): a backward
that torch.compile makes may read a buffer changed in place as forward left it, where eager autograd
reads the values forward used (torch 2.13 does, aot_eager and inductor alike), and the compiled gradient
then differs from eager's. Assigning new tensors leaves the ones forward used untouched.
"""

from __future__ import annotations

import torch
from torch import Tensor


class RunningNorm1d(torch.nn.Module):
    """y = (x - running_mean) / sqrt(running_var + eps) * weight + bias; in train mode the running
    statistics then move towards the batch's (momentum)."""

    running_mean: Tensor
    running_var: Tensor

    def __init__(self, features: int, momentum: float = 0.1, eps: float = 1e-5) -> None:
        super().__init__()
        self.momentum, self.eps = momentum, eps
        self.weight = torch.nn.Parameter(1 + 0.1 * torch.randn(features))
        self.bias = torch.nn.Parameter(0.1 * torch.randn(features))
        self.register_buffer("running_mean", 0.5 * torch.randn(features))
        self.register_buffer("running_var", 1 + torch.rand(features))

    def scale(self) -> Tensor:
        return self.weight

    def forward(self, x: Tensor) -> Tensor:
        out = (x - self.running_mean) / torch.sqrt(self.running_var + self.eps) * self.scale() + self.bias
        if self.training:
            with torch.no_grad():  # new tensors, not lerp_: the backward may need the ones used above
                self.running_mean = torch.lerp(self.running_mean, x.mean(0), self.momentum)
                self.running_var = torch.lerp(self.running_var, x.var(0), self.momentum)
        return out


class RunningNorm1dDetachedWeight(RunningNorm1d):
    """Deliberately broken: the weight is detached, so its gradient is zero."""

    def scale(self) -> Tensor:
        return self.weight.detach()  # BUG: no gradient reaches the weight
