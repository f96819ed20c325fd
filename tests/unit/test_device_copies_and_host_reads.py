"""Copies to the device without waiting (``numerics.transfer.sent``) and the compressed check's
host reads on a GPU: a stage reads nothing, and the groups whose moves disagree (a curvature) are read once for
all stages, not once per stage that holds any (``Groups._settle_far``). Counted on the CPU as
tests/unit/test_host_syncs.py counts (on a GPU each read waits for the device)."""

from __future__ import annotations

from typing import Any

import numpy as np
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


class FakeGpu:
    """A GPU's copies from the host as ``sent`` makes them, emulated on the CPU: ``pin_memory`` as torch's (a
    pinned tensor is handed back as it is; only a host tensor can be pinned: a device's raises), and a copy to
    'cuda' that reads its source when the device gets to it where it does not wait (``non_blocking``), at once
    where it waits. A tensor on the device is a 'meta' tensor here; ``run`` makes the queued copies."""

    def __init__(self, monkeypatch: pytest.MonkeyPatch) -> None:
        self.pinned: set[int] = set()
        self.queued: list[tuple[torch.Tensor, torch.Tensor]] = []  # (on the device, what it copies when run)
        real_to = torch.Tensor.to

        def pin_memory(t: torch.Tensor) -> torch.Tensor:
            if t.device.type != "cpu":
                raise RuntimeError(f"cannot pin '{t.type()}' only dense CPU tensors can be pinned")
            if self.is_pinned(t):
                return t
            p = t.clone()
            self.pinned.add(p.data_ptr())
            return p

        def to(t: torch.Tensor, *args: Any, **kwargs: Any) -> torch.Tensor:
            device = kwargs.get("device", args[0] if args and isinstance(args[0], (str, torch.device)) else None)
            if device is None or torch.device(device).type != "cuda":
                return real_to(t, *args, **kwargs)
            source = t if kwargs.get("non_blocking") and self.is_pinned(t) else t.clone()  # else read at once
            there = torch.empty(t.shape, dtype=t.dtype, device="meta")
            self.queued.append((there, source))
            return there

        monkeypatch.setattr(torch.Tensor, "pin_memory", pin_memory)
        monkeypatch.setattr(torch.Tensor, "is_pinned", lambda t, *a, **k: self.is_pinned(t))
        monkeypatch.setattr(torch.Tensor, "to", to)

    def is_pinned(self, t: torch.Tensor) -> bool:
        return t.device.type == "cpu" and t.data_ptr() in self.pinned

    def run(self, there: torch.Tensor) -> torch.Tensor:
        """What the copy that made ``there`` put there, once the device ran it."""
        (source,) = [s for t, s in self.queued if t is there]
        return source.clone()


CUDA = torch.device("cuda")


def test_a_host_array_changed_after_it_was_sent_arrives_as_it_was(monkeypatch):
    from gradcheck_cli.numerics.transfer import sent

    gpu = FakeGpu(monkeypatch)
    a = np.arange(6)
    there = sent(a, CUDA)
    a[:] = -1  # the caller's array, changed (or freed) before the device runs the copy
    assert torch.equal(gpu.run(there), torch.arange(6))


def test_a_pinned_host_tensor_changed_after_it_was_sent_arrives_as_it_was(monkeypatch):
    # torch's pin_memory hands a pinned tensor back as it is: a copy that does not wait would read the caller's
    # memory when the device gets to it, after the caller changed it
    from gradcheck_cli.numerics.transfer import sent

    gpu = FakeGpu(monkeypatch)
    t = torch.arange(6.0).pin_memory()
    there = sent(t, CUDA)
    t.fill_(-1.0)
    assert torch.equal(gpu.run(there), torch.arange(6.0))


def test_a_tensor_on_the_device_is_sent_where_it_is_asked(monkeypatch):
    # a tensor on a GPU cannot be pinned (torch raises): it goes from device to device
    from gradcheck_cli.numerics.transfer import sent

    FakeGpu(monkeypatch)
    on_device = torch.empty(3, dtype=torch.long, device="meta")  # stands for a tensor on the GPU
    got = sent(on_device, CUDA, torch.long)
    assert got.shape == (3,) and got.dtype == torch.long


def test_what_is_sent_keeps_its_dtype_or_takes_the_one_asked(monkeypatch):
    from gradcheck_cli.numerics.transfer import sent

    gpu = FakeGpu(monkeypatch)
    cases = [
        ([True, False], None, torch.bool),
        ([1, 0], torch.bool, torch.bool),
        (np.arange(3, dtype=np.int64), None, torch.int64),
        ([2, 0, 1], torch.int8, torch.int8),
        (torch.arange(3.0), torch.float64, torch.float64),
    ]
    for x, dtype, want in cases:
        there = sent(x, CUDA, dtype)
        assert there.dtype == want and gpu.run(there).dtype == want, (x, dtype)
        assert gpu.run(there).tolist() == torch.as_tensor(x).tolist()
