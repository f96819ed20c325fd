"""A stage's cap on a GPU comes from its free memory (issue 30 item 2): on a CPU the compressed stages keep
the small caps tuned to its caches; on a GPU, where each call is a launch and a host round trip, a stage may
hold as much as the memory budget's share allows, so a check makes fewer, larger calls. The CPU here has no
GPU: the rule is checked with the free memory the device would report, and the stages' wiring by giving
the CPU a GPU's cap, which must cut the calls and leave every verdict and number as it was."""

from __future__ import annotations

from typing import Any

import pytest
import torch

from gradcheck_cli import check
from gradcheck_cli.examples.broken import LinearDoubleBias
from gradcheck_cli.examples.linear import LinearFunction
from gradcheck_cli.numerics import batching, compressed, row_groups
from gradcheck_cli.numerics import rows as rows_module

MB = 2**20


def test_a_cpu_keeps_the_cap_tuned_to_its_caches() -> None:
    assert batching.device_cap(batching.GROUP_STAGE_BYTES, torch.device("cpu")) == batching.GROUP_STAGE_BYTES


def test_a_gpu_stage_is_a_share_of_its_free_memory_within_the_memory_budget(monkeypatch: pytest.MonkeyPatch) -> None:
    free = 40 * 2**30
    monkeypatch.setattr(torch.cuda, "mem_get_info", lambda device=None: (free, 80 * 2**30))
    gpu = torch.device("cuda", 0)
    cap = batching.device_cap(batching.GROUP_STAGE_BYTES, gpu)
    assert cap == free // batching.STAGE_SHARE
    row_bytes = 16 * (2 * 128 * 128 + 128 + 2 * 128 * 128)  # a group of Linear n=128, as Groups counts it
    cpu_stage = batching.stage_size(batching.COL_STAGE, row_bytes, 512 * MB, batching.GROUP_STAGE_BYTES)
    gpu_stage = batching.stage_size(batching.COL_STAGE, row_bytes, 512 * MB, cap)
    assert gpu_stage == 512 * MB // batching.STAGE_SHARE // (batching.SLACK * row_bytes) > 3 * cpu_stage
    # the budget still bounds it: a small --max-memory gives the CPU's stage or less
    assert batching.stage_size(batching.COL_STAGE, row_bytes, 64 * MB, cap) <= cpu_stage
    # a GPU with little free memory never gets less than the CPU's cap
    monkeypatch.setattr(torch.cuda, "mem_get_info", lambda device=None: (MB, 80 * 2**30))
    assert batching.device_cap(batching.GROUP_STAGE_BYTES, gpu) == batching.GROUP_STAGE_BYTES


class CountedLinear(LinearFunction):
    calls = 0

    @staticmethod
    def forward(ctx: Any, *args: Any) -> Any:
        CountedLinear.calls += 1
        return LinearFunction.forward(ctx, *args)


def linear_args(n: int) -> list[torch.Tensor]:
    gen = torch.Generator().manual_seed(0)
    return [torch.randn(*s, generator=gen, dtype=torch.float64).requires_grad_() for s in ((n, n), (n, n), (n,))]


def calls_and_report(fn: Any, monkeypatch: pytest.MonkeyPatch, gpu_caps: bool) -> tuple[int, Any]:
    with monkeypatch.context() as m:
        if gpu_caps:  # the CPU given the cap a GPU with 8 GB free would have, at every stage site
            for module in (batching, compressed, row_groups, rows_module):
                m.setattr(module, "device_cap", lambda cap, device: max(cap, 2**30))
        CountedLinear.calls = 0
        result = check(fn, linear_args(48), max_memory=2048, seed=3)
        return CountedLinear.calls, result


def said(result: Any) -> list[Any]:
    """What a report says of each row: the check, its status and each argument's numbers."""
    return [
        (c.check, c.status, [(r.name, r.status, r.mismatched, r.max_abs_err, r.worst_index) for r in c.inputs])
        for c in result.checks
    ]


@pytest.mark.parametrize("fn", [CountedLinear, LinearDoubleBias], ids=["correct", "broken"])
def test_a_gpu_cap_makes_fewer_calls_and_the_same_report(fn: Any, monkeypatch: pytest.MonkeyPatch) -> None:
    small_calls, small = calls_and_report(fn, monkeypatch, gpu_caps=False)
    large_calls, large = calls_and_report(fn, monkeypatch, gpu_caps=True)
    assert said(small) == said(large)
    assert small.status.value == ("pass" if fn is CountedLinear else "fail")
    if fn is CountedLinear:  # the broken one's forward is LinearFunction's: not counted
        assert large_calls < small_calls
