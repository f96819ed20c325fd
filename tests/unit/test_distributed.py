"""Distributed Functions (issue 32): the spec keys, the truth set at world sizes 2 and 4 (every correct
example of specs/distributed.yaml passes, every classic bug of broken-specs/distributed_*.yaml fails naming
the argument and every rank, with its diagnosis), the semantic rules, and the failure paths (a rank that
raises, dies or deadlocks is an error result naming the rank, and no rank process is left)."""

from __future__ import annotations

import dataclasses
import os
from pathlib import Path

import pytest

from gradcheck_cli import spec
from gradcheck_cli.results import CaseResult, ErrorKind, Status
from gradcheck_cli.run import runner
from gradcheck_cli.spec import Case, SpecError, load_file

REPO = Path(__file__).resolve().parents[2]
CORRECT = REPO / "specs" / "distributed.yaml"
BROKEN = {  # file -> words of the diagnosis
    "distributed_copy_forgets_all_reduce.yaml": "are partial: they add up to the numerical gradient",
    "distributed_reduce_all_reduces_both_ways.yaml": "an all-reduce too many",
    "distributed_average_forgets_division.yaml": "a missing division by world_size",
    "distributed_gather_splits_wrong_dim.yaml": "not along dim -1 (shard(-1)): a split or gather along the wrong dim",
    "distributed_scatter_keeps_local_chunk.yaml": "holds only its own slice along dim 1 (zeros elsewhere)",
}


def children() -> set[int]:
    """This process's child processes (running or not yet reaped), from /proc."""
    me, found = os.getpid(), set()
    for name in os.listdir("/proc"):
        if name.isdigit():
            try:
                stat = Path(f"/proc/{name}/stat").read_text()
            except OSError:
                continue
            if int(stat.rsplit(")", 1)[1].split()[1]) == me:
                found.add(int(name))
    return found


def cases(path: Path, size: int) -> list[Case]:
    """The cases of ``path`` at world size ``size``."""
    items = load_file(path)
    assert all(isinstance(c, Case) for c in items), [str(c) for c in items]
    return [
        dataclasses.replace(c, distributed=dataclasses.replace(c.distributed, world_size=size))
        for c in items
        if isinstance(c, Case) and c.distributed is not None
    ]


def one(write_spec, text: str) -> CaseResult:
    """The result of the one case of spec ``text``."""
    (case,) = load_file(write_spec(text))
    assert isinstance(case, Case), str(case)
    return runner.run_case(case, "cpu")


# ------------------------------------------------------------------------------------------- spec keys


def test_the_keys_load(write_spec):
    (case,) = load_file(
        write_spec(
            """
            function: m:F
            distributed: {world_size: 4, backend: gloo, timeout: 7}
            inputs:
              - {name: x, shape: [4, 6]}
              - {name: w, shape: [6, 8], placement: shard(1)}
              - {name: p, shape: [4, 6], placement: per_rank}
            outputs: [per_rank, partial, shard(-1), replicate]
            """
        )
    )
    assert isinstance(case, Case)
    assert case.distributed == spec.Distributed(4, "gloo", 7.0)
    assert [a.placement for a in case.inputs] == [None, "shard(1)", "per_rank"]
    assert case.outputs == ("per_rank", "partial", "shard(-1)", "replicate")


@pytest.mark.parametrize(
    "lines, key, words",
    [
        ("distributed: {world_size: 0}", "distributed.world_size", "expected an integer from 1 to 64"),
        ("distributed: {size: 2}", "distributed.size", "unknown key"),
        ("distributed: {}", "distributed.world_size", "missing; say how many ranks"),
        ("distributed: {world_size: 2, backend: mpi}", "distributed.backend", "expected one of gloo, nccl"),
        ("distributed: {world_size: 2, timeout: 0}", "distributed.timeout", "positive"),
        ("distributed: 2", "distributed", "expected a mapping such as `distributed: {world_size: 2}`"),
        ("outputs: [replicate]", "outputs", "it needs `distributed: {world_size: N}`"),
        ("distributed: {world_size: 2}\noutputs: [shard(x)]", "outputs[0]", "expected replicate, shard(d)"),
        ("distributed: {world_size: 2}\noutputs: []", "outputs", "one placement per output"),
        ("cases: [{name: a, outputs: [partial]}]", "cases[0].outputs", "case 'a': `outputs` places outputs"),
    ],
)
def test_bad_keys_are_spec_errors_that_name_the_key(write_spec, lines, key, words):
    text = "function: m:F\ninputs:\n  - {name: x, shape: [4, 6]}\n" + lines + "\n"
    (error,) = load_file(write_spec(text))
    assert isinstance(error, SpecError), error
    assert error.key == key and words in str(error), str(error)
    assert str(error).startswith(str(error.path) + ":")


@pytest.mark.parametrize(
    "entry, size, key, words",
    [
        ("{shape: [4, 6], placement: partial}", 2, "inputs[0].placement", "partial is an output's placement"),
        ("{shape: [4, 6], placement: shard(2)}", 2, "inputs[0].placement", "give a dim from -2 to 1"),
        ("{shape: [4, 6], placement: shard(0)}", 3, "inputs[0].placement", "make its size a multiple of 3"),
        ("{shape: [4, 6], placement: shard(1)}", 0, "inputs[0].placement", "a placement needs `distributed"),
    ],
)
def test_bad_placements_are_spec_errors(write_spec, entry, size, key, words):
    text = f"function: m:F\ninputs:\n  - {entry}\n" + (f"distributed: {{world_size: {size}}}\n" if size else "")
    (error,) = load_file(write_spec(text))
    assert isinstance(error, SpecError), error
    assert error.key == key and words in str(error), str(error)
    assert ":4: " in str(error) or ":3: " in str(error)  # the line of the entry


# ------------------------------------------------------------------------------------------ truth set


@pytest.mark.slow
@pytest.mark.parametrize("size", [2, 4])
def test_correct_examples_pass_and_each_classic_bug_fails_naming_argument_and_rank(size):
    before = children()
    correct = [runner.run_case(c, "cpu") for c in cases(CORRECT, size)]
    assert len(correct) == 10
    for result in correct:
        assert result.status is Status.PASS, str(result)
        (check,) = result.checks
        names = {row.name for row in check.inputs}
        assert all(f"@rank{r}" in " ".join(names) for r in range(size)), names
    for name, words in BROKEN.items():
        (case,) = cases(REPO / "broken-specs" / name, size)
        result = runner.run_case(case, "cpu")
        assert result.status is Status.FAIL, str(result)
        (check,) = result.checks
        failing = {row.name for row in check.inputs if row.status is Status.FAIL}
        assert failing == {f"x@rank{r}" for r in range(size)}, (name, str(result))
        assert words in check.message, (name, check.message)
        if "world_size" in words or "all-reduce too many" in words:
            assert f"{size:.2f}x the numerical one (world_size {size})" in check.message
    assert children() == before  # every rank was reaped


def test_semantic_rules(write_spec, user_module):
    """A per_rank output takes each rank's own grad_output, a replicate output must agree across ranks, and
    the other checks skip with the reason; ``outputs`` has one entry per tensor output."""
    user_module(
        """
        import torch
        import torch.distributed as dist

        class RankScaled(torch.autograd.Function):
            # y_r = (r + 1) x, a per_rank output: x's gradient is sum_r (r + 1) g_r, all-reduced
            @staticmethod
            def forward(ctx, x):
                return x * (dist.get_rank() + 1)

            @staticmethod
            def backward(ctx, g):
                out = g * (dist.get_rank() + 1)
                dist.all_reduce(out)
                return out

        class Differs(RankScaled):
            pass
        """,
        name="distmod",
    )
    body = "inputs: [{name: x, shape: [3]}]\ndistributed: {world_size: 2}\n"
    passed = one(
        write_spec, "function: distmod:RankScaled\noutputs: [per_rank]\nchecks: [backward, double_backward]\n" + body
    )
    assert passed.status is Status.PASS, str(passed)
    backward, double = passed.checks
    assert [row.name for row in backward.inputs] == ["x@rank0", "x@rank1"]
    assert double.status is Status.SKIP and "checks backward only" in double.message
    differs = one(write_spec, "function: distmod:Differs\noutputs: [replicate]\n" + body)
    assert differs.status is Status.ERROR and differs.error is not None
    assert differs.error.kind is ErrorKind.FORWARD
    assert "replicate output 0 differs between rank 0 and rank 1" in differs.error.message
    counted = one(write_spec, "function: distmod:RankScaled\noutputs: [per_rank, per_rank]\n" + body)
    assert counted.error is not None and counted.error.kind is ErrorKind.SPEC
    assert "forward returns 1 tensor and `outputs` places 2" in counted.error.message


# ---------------------------------------------------------------------------------------- failure paths

FAILING = """
    import os, time
    from pathlib import Path
    import torch
    import torch.distributed as dist

    MARKS = Path({marks!r})

    def mark():
        (MARKS / f"rank{{dist.get_rank()}}.pid").write_text(str(os.getpid()))

    def reduced(x):
        y = x.clone()
        dist.all_reduce(y)
        return y

    class RaisesOnRank1(torch.autograd.Function):
        @staticmethod
        def forward(ctx, x):
            mark()
            if dist.get_rank() == 1:
                raise ValueError("rank one refuses")
            return reduced(x)

        @staticmethod
        def backward(ctx, g):
            return g

    class DiesOnRank1(RaisesOnRank1):
        @staticmethod
        def forward(ctx, x):
            mark()
            return reduced(x)

        @staticmethod
        def backward(ctx, g):
            if dist.get_rank() == 1:
                os._exit(3)
            return reduced(g)

    class SkipsAllReduceOnRank1(DiesOnRank1):
        @staticmethod
        def backward(ctx, g):
            return g if dist.get_rank() == 1 else reduced(g)

    class HangsOnRank1(DiesOnRank1):
        @staticmethod
        def forward(ctx, x):
            mark()
            if dist.get_rank() == 1:
                while True:
                    time.sleep(0.05)
            return reduced(x)
"""


def gone(pid: int) -> bool:
    """Whether process ``pid`` has ended and been reaped."""
    return not Path(f"/proc/{pid}").exists()


@pytest.fixture
def failing(user_module, tmp_path) -> Path:
    marks = tmp_path / "marks"
    marks.mkdir()
    user_module(FAILING.format(marks=str(marks)), name="failmod")
    return marks


@pytest.mark.parametrize(
    "function, kind, words",
    [
        ("RaisesOnRank1", ErrorKind.FORWARD, "rank 1: forward raised ValueError: rank one refuses"),
        ("DiesOnRank1", ErrorKind.CRASH, "rank 1 exited with status 3 (os._exit or a crash) during backward"),
        pytest.param(  # waits out the spec's timeout: the deadlock's only event
            "SkipsAllReduceOnRank1",
            ErrorKind.TIMEOUT,
            "rank 0 made no progress for 5 s (distributed.timeout)",
            marks=pytest.mark.slow,
        ),
        pytest.param(
            "HangsOnRank1",
            ErrorKind.TIMEOUT,
            "rank 1 made no progress for 5 s (distributed.timeout) outside any collective, while the others waited",
            marks=pytest.mark.slow,
        ),
    ],
)
def test_a_failing_rank_ends_every_rank_and_is_an_error_naming_it(write_spec, failing, function, kind, words):
    before = children()
    result = one(
        write_spec,
        f"function: failmod:{function}\ninputs: [{{name: x, shape: [3]}}]\n"
        "distributed: {world_size: 2, timeout: 5}\noutputs: [replicate]\n",
    )
    assert result.status is Status.ERROR and result.error is not None, str(result)
    assert result.error.kind is kind, str(result)
    assert words in result.error.message, result.error.message
    if kind is ErrorKind.FORWARD:
        assert result.error.where is not None and "failmod.py" in result.error.where
    if function == "SkipsAllReduceOnRank1":  # where each rank was: in backward's contract, which runs first
        assert "rank 0: backward, in all_reduce (its collective call 2)" in result.error.message, result.error.message
        assert "rank 1: backward, waiting for the other ranks after 1 collective call" in result.error.message
        assert "mismatched collectives" in result.error.message
    pids = [int(p.read_text()) for p in sorted(failing.glob("rank*.pid"))]
    assert len(pids) == 2
    assert all(gone(pid) for pid in pids)
    assert children() == before


@pytest.mark.parametrize(
    "backend, device, gpus, words",
    [
        ("nccl", "cuda", 1, "world_size 2 with nccl needs 2 GPUs (one per rank); this machine has 1"),
        ("nccl", "cpu", 0, "backend nccl runs on CUDA devices (one GPU per rank): use `--device cuda`"),
        ("gloo", "cuda", 2, "backend gloo runs the ranks on the CPU: use backend nccl for `--device cuda`"),
        ("gloo", "cpu", 0, ""),
    ],
)
def test_a_world_that_cannot_run_here_is_a_skip_with_the_reason(monkeypatch, backend, device, gpus, words):
    import torch

    from gradcheck_cli.distributed import check

    monkeypatch.setattr(torch.cuda, "is_available", lambda: gpus > 0)
    monkeypatch.setattr(torch.cuda, "device_count", lambda: gpus)
    monkeypatch.setattr(torch.distributed, "is_nccl_available", lambda: True)
    found = check.unavailable(backend, device, 2)
    assert words in found if words else found == ""


def test_world_size_1_runs(write_spec):
    result = one(
        write_spec,
        "function: gradcheck_cli.examples.distributed:ColumnParallelLinear\ndistributed: {world_size: 1}\n"
        "inputs: [{name: x, shape: [2, 3]}, {name: w, shape: [4, 3], placement: shard(0)}, {name: b, shape: [4]}]\n"
        "outputs: [shard(-1)]\n",
    )
    assert result.status is Status.PASS, str(result)
    assert [row.name for row in result.checks[0].inputs] == ["x@rank0", "w@rank0", "b@rank0"]


def test_a_backward_that_breaks_its_contract_fails_naming_the_rank(write_spec, user_module):
    """A gather whose backward splits along dim 0 returns a gradient of the wrong shape: autograd would reject it
    on the ranks, and that is the backward check's fail (exit 1) in one process's words, not an error."""
    user_module(
        """
        import torch
        import torch.distributed as dist

        class GatherSplitsDim0(torch.autograd.Function):
            @staticmethod
            def forward(ctx, x):
                parts = [torch.empty_like(x) for _ in range(dist.get_world_size())]
                dist.all_gather(parts, x.contiguous())
                return torch.cat(parts, -1)

            @staticmethod
            def backward(ctx, g):
                return g.chunk(dist.get_world_size(), 0)[dist.get_rank()]
        """,
        name="shapemod",
    )
    result = one(
        write_spec,
        "function: shapemod:GatherSplitsDim0\ninputs: [{name: x, shape: [4, 4], placement: shard(-1)}]\n"
        "distributed: {world_size: 2}\n",
    )
    assert result.status is Status.FAIL and result.error is None, str(result)
    (check,) = result.checks
    assert (
        check.message
        == "ranks 0, 1: backward returned shape [2, 4] for 'x' of shape [4, 2]: a gradient has its input's shape"
    )
    failing = [row for row in check.inputs if row.status is Status.FAIL]
    assert failing and all(row.name in ("x@rank0", "x@rank1") and row.shape == [4, 2] for row in failing)


def test_outputs_that_do_not_require_grad_are_left_out_as_torch_leaves_them_out(write_spec, user_module):
    user_module(
        """
        import torch
        import torch.distributed as dist

        class WithRankMarker(torch.autograd.Function):
            # y = x on each rank (per_rank); a second output, the rank, marked non-differentiable
            @staticmethod
            def forward(ctx, x):
                marker = torch.full((1,), float(dist.get_rank()), dtype=x.dtype)
                ctx.mark_non_differentiable(marker)
                return x.clone(), marker

            @staticmethod
            def backward(ctx, g, _):
                out = g.clone()
                dist.all_reduce(out)
                return out

        class OnlyMarker(torch.autograd.Function):
            @staticmethod
            def forward(ctx, x):
                marker = x.detach().clone()
                ctx.mark_non_differentiable(marker)
                return marker

            @staticmethod
            def backward(ctx, g):
                return g
        """,
        name="markmod",
    )
    body = "inputs: [{name: x, shape: [3]}]\ndistributed: {world_size: 2}\n"
    passed = one(write_spec, "function: markmod:WithRankMarker\noutputs: [per_rank, replicate]\n" + body)
    assert passed.status is Status.PASS, str(passed)
    nothing = one(write_spec, "function: markmod:OnlyMarker\n" + body)
    assert nothing.error is not None and nothing.error.kind is ErrorKind.FORWARD
    assert "no output of forward requires grad" in nothing.error.message


def test_a_port_taken_by_another_process_never_costs_a_verdict(write_spec, monkeypatch):
    """The ranks meet without a TCP port chosen in advance: a port picked free and taken by another process
    before rank 0 binds it (two gradcheck runs, pytest workers, gloo's own connections) was an error, exit 3.
    Here every port the coordinator could be handed is one this test holds."""
    import socket

    from gradcheck_cli.distributed import launch

    held = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    held.bind(("127.0.0.1", 0))
    held.listen()
    try:
        monkeypatch.setattr(launch, "free_port", lambda: held.getsockname()[1], raising=False)
        result = one(
            write_spec,
            "function: gradcheck_cli.examples.distributed:ColumnParallelLinear\ndistributed: {world_size: 2}\n"
            "inputs: [{name: x, shape: [2, 3]}, {name: w, shape: [4, 3], placement: shard(0)}, {name: b, shape: [4], placement: shard(0)}]\n"
            "outputs: [shard(-1)]\n",
        )
    finally:
        held.close()
    assert result.status is Status.PASS, str(result)


def test_a_meeting_place_left_by_a_killed_worker_is_removed_by_the_next_world(tmp_path, monkeypatch):
    """A worker killed mid-world (SIGKILL: the pool's answer to SIGTERM) cannot remove its ranks' folder; the
    next world on the machine removes it once that process is gone, and leaves a live process's folder alone."""
    import subprocess
    import tempfile

    from gradcheck_cli.distributed import launch

    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path))
    gone = subprocess.Popen(["true"])
    gone.wait()
    stale = tmp_path / f"{launch.MEETING}{gone.pid}-abc"
    live = tmp_path / f"{launch.MEETING}{os.getpid()}-def"
    for folder in (stale, live):
        folder.mkdir()
        (folder / "store").write_text("x")
    with launch.meeting() as path:
        assert Path(path).parent.parent == tmp_path and not Path(path).exists()
    assert not stale.exists() and live.exists()
    assert sorted(p.name for p in tmp_path.iterdir()) == [live.name]
