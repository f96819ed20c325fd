"""Review of the copies to the device without waiting (``numerics.transfer.sent``) and of the compressed check's
host reads on a GPU: a stage reads nothing, and the groups whose moves disagree (a curvature) are read once for
all stages, not once per stage that holds any (``Groups._settle_far``). Counted on the CPU as
tests/unit/test_host_syncs.py counts (on a GPU each read waits for the device)."""

from __future__ import annotations

from typing import Any

import pytest
import torch
from test_host_syncs import HostSyncs

import gradcheck_cli
from gradcheck_cli.numerics import compressed
from gradcheck_cli.results import Status

K = 4.0  # exp(K z): its third derivative moves a group's weighted moves apart (``on_curvature_line`` decides)


class ExpLinear(torch.autograd.Function):
    """y = exp(K (x w^T + b)): a Linear layer's sparsity, with curvature."""

    @staticmethod
    def forward(ctx: Any, x: torch.Tensor, w: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
        y = torch.exp(K * (x @ w.t() + b))
        ctx.save_for_backward(x, w, y)
        return y

    @staticmethod
    def backward(ctx: Any, g: torch.Tensor) -> Any:
        x, w, y = ctx.saved_tensors
        gz = K * g * y
        return gz @ w, gz.t() @ x, gz.sum(0)


class ExpLinearWrongBias(ExpLinear):
    @staticmethod
    def backward(ctx: Any, g: torch.Tensor) -> Any:
        gx, gw, gb = ExpLinear.backward(ctx, g)
        return gx, gw, 2 * gb


def _args(n: int) -> list[torch.Tensor]:
    gen = torch.Generator().manual_seed(n)
    shapes = ((n, n), (n, n), (n,))
    return [(0.3 * torch.randn(*s, dtype=torch.float64, generator=gen)).requires_grad_() for s in shapes]


@pytest.mark.slow
def test_the_groups_whose_moves_disagree_are_read_once_for_every_stage(monkeypatch):
    settled: list[tuple[int, int]] = []  # per call: stages holding such groups, host reads made
    settle = compressed.Groups._settle_far

    def counted(self: compressed.Groups) -> None:
        stages = sum(bool(far.any()) for _, _, far in self._far)
        with HostSyncs() as syncs:
            settle(self)
        settled.append((stages, syncs.total))

    monkeypatch.setattr(compressed.Groups, "_settle_far", counted)
    assert gradcheck_cli.check(ExpLinear, _args(40)).status is Status.PASS
    assert max(stages for stages, _ in settled) >= 2, settled  # several stages hold groups whose moves disagree
    assert all(reads == 1 for _, reads in settled), settled  # one read, however many


@pytest.mark.slow
def test_a_wrong_bias_with_curvature_still_fails_on_the_compressed_path():
    result = gradcheck_cli.check(ExpLinearWrongBias, _args(40))
    assert result.status is Status.FAIL
    (backward,) = result.checks
    assert [r.status for r in backward.inputs] == [Status.PASS, Status.PASS, Status.FAIL]
