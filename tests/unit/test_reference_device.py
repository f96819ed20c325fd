"""The reference and compile checks compare on the tensors' device (issue 30 item 3): in float64 a chunk at a
time, with the same verdicts and numbers whatever the chunk; host synchronisations and values brought to the
host that do not grow with the size; at most two output-sized float64 copies at once."""

from __future__ import annotations

import dataclasses
import os
import subprocess
import sys
import weakref
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any, Callable

import pytest
import torch
from torch.utils._python_dispatch import TorchDispatchMode
from traffic import Traffic

from gradcheck_cli import check
from gradcheck_cli.checks.parts import sides
from gradcheck_cli.checks.parts.argument_rows import locate
from gradcheck_cli.checks.parts.base import probe_like
from gradcheck_cli.core.tolerance import ReferenceRule
from gradcheck_cli.examples import broken, kernels
from gradcheck_cli.results import InputReport, Status

aten = torch.ops.aten
SYNCS = {
    aten._local_scalar_dense.default,
    aten.nonzero.default,
    aten.is_nonzero.default,
    aten.equal.default,
    aten.masked_select.default,
    aten.item.default,
}
RELATIVE = ReferenceRule("relative", 2.0, None, None)
ALLCLOSE = ReferenceRule("allclose", 2.0, None, None)
cuda = pytest.mark.cuda


def tensor(*shape: int, dtype: torch.dtype = torch.float64, seed: int = 0) -> torch.Tensor:
    g = torch.Generator().manual_seed(seed)
    return torch.randn(shape, generator=g, dtype=torch.float64).to(dtype)


def compared(
    got: torch.Tensor, want: torch.Tensor, own: Any = None, rule: ReferenceRule = ALLCLOSE, what: str = "gradient"
) -> InputReport:
    row = InputReport(0, "x", list(got.shape), str(got.dtype)[6:], Status.PASS, numel=got.numel())
    sides.compare(row, got, want, own, rule, what)
    return row


def pairs() -> Iterator[tuple[str, torch.Tensor, torch.Tensor, Any, ReferenceRule]]:
    """Named comparisons: passing and failing, real and complex, both rules, non-finite values, maps with
    and without padding, a 0-d and a long 1-d tensor."""
    n = tensor(70, 130)
    yield "bf16 right", n.to(torch.bfloat16), n, n.to(torch.bfloat16), RELATIVE
    yield "bf16 1.04x", (1.04 * n).to(torch.bfloat16), n, n.to(torch.bfloat16), RELATIVE
    yield "float32 right", n.float(), n, None, ALLCLOSE
    yield "float32 2x", (2 * n).float(), n, None, ALLCLOSE
    few = n.clone()
    few[3, 5], few[60, 129] = 7.0, -7.0
    yield "two elements", few, n, None, ALLCLOSE
    yield "sign flip", -n, n, None, ALLCLOSE
    yield "zeros", torch.zeros_like(n), n, None, ALLCLOSE
    odd = n.clone()
    odd[0, 0], odd[1, 1], odd[2, 2] = float("nan"), float("inf"), 1e300
    want = n.clone()
    want[0, 0], want[1, 1] = float("nan"), float("inf")
    yield "agreeing non-finite", odd, want, None, ALLCLOSE
    odd[5, 5] = float("nan")
    yield "nan on one side", odd, want, None, ALLCLOSE
    c = torch.complex(tensor(33, 65), tensor(33, 65, seed=1))
    yield "complex right", c.to(torch.complex64), c, None, ALLCLOSE
    yield "complex conjugate", c.conj(), c, None, ALLCLOSE
    yield "0-d", torch.tensor(1.5), torch.tensor(1.0, dtype=torch.float64), None, ALLCLOSE
    long = tensor(20000)
    yield "1-d noise", long + 1e-3 * tensor(20000, seed=2), long, None, ALLCLOSE
    yield "small bf16 inside", n.to(torch.bfloat16).double(), n, None, ALLCLOSE


def as_text(row: InputReport) -> str:
    return repr(dataclasses.asdict(row))  # NaN prints alike: the same row reads the same


@pytest.mark.parametrize("chunk", [63, 1000, 1 << 14])  # 63: taken as 64, complex elements stay whole
def test_the_row_is_the_same_whatever_the_chunk(chunk, monkeypatch):
    whole = {name: as_text(compared(a, n, own, rule)) for name, a, n, own, rule in pairs()}
    monkeypatch.setattr(sides, "CHUNK", chunk)
    for name, a, n, own, rule in pairs():
        assert as_text(compared(a, n, own, rule)) == whole[name], name


@pytest.mark.parametrize("name", [p[0] for p in pairs()])
def test_the_verdict_per_element_is_torch_isclose(name, monkeypatch):
    # an independent count: torch.isclose's |a - n| <= atol + rtol |n| (equal NaNs agreeing) in float64
    monkeypatch.setattr(sides, "CHUNK", 1000)
    _, a, n, own, rule = next(p for p in pairs() if p[0] == name)
    row = compared(a, n, own, rule)
    rtol = row.rtol or 0.0
    atol = row.factor * row.baseline_err + row.atol if row.factor else row.atol
    close = torch.isclose(real(a).double(), real(n).double(), rtol=rtol, atol=atol, equal_nan=True)
    assert row.mismatched == int((~close.all(-1)).sum())
    assert row.status is (Status.FAIL if row.mismatched else Status.PASS)
    if row.mismatched:
        flat = (~close.all(-1)).reshape(-1).nonzero().view(-1)[: len(row.mismatched_indices)].tolist()
        assert [int(torch.tensor(i) @ torch.tensor(strides(a.shape))) for i in row.mismatched_indices] == flat
        assert row.error_map is not None and row.pattern is not None


def real(t: torch.Tensor) -> torch.Tensor:
    """A real per real element, a complex element's two on a last dim."""
    return torch.view_as_real(t.resolve_conj()) if t.is_complex() else t.unsqueeze(-1)


def strides(shape: torch.Size) -> list[int]:
    out, step = [], 1
    for d in reversed(shape):
        out.insert(0, step)
        step *= d
    return out


# ------------------------------------------------------------------ what the comparison costs the host


class HostTraffic(TorchDispatchMode):
    """Host synchronisations (ops that need a value on the host) and values brought to the host
    (Tensor.tolist, item, cpu, numpy, .to('cpu')): on a CPU they are the same calls as on a GPU."""

    def __init__(self) -> None:
        super().__init__()
        self.syncs = 0
        self.values = 0

    def __torch_dispatch__(self, func: Any, types: Any, args: Any = (), kwargs: Any = None) -> Any:
        kwargs = kwargs or {}
        if func in SYNCS or (
            func is aten.index.Tensor and any(i is not None and i.dtype == torch.bool for i in args[1])
        ):
            self.syncs += 1
        return func(*args, **kwargs)


@contextmanager
def host_traffic(monkeypatch: pytest.MonkeyPatch) -> Iterator[HostTraffic]:
    mode = HostTraffic()

    def counted(name: str, size: Callable[..., int]) -> None:
        original = getattr(torch.Tensor, name)

        def wrapper(self: torch.Tensor, *args: Any, **kwargs: Any) -> Any:
            n = size(self, *args, **kwargs)
            if n:
                mode.syncs += 1
                mode.values += n
            return original(self, *args, **kwargs)

        monkeypatch.setattr(torch.Tensor, name, wrapper)

    every = lambda t, *a, **k: t.numel()  # noqa: E731
    for name in ("tolist", "item", "cpu", "numpy"):
        counted(name, every)
    # a move to the host from elsewhere (on a CPU, .to('cpu') is no move: the probes drawn on the host for
    # a CPU target are no host traffic of the comparison)
    counted(
        "to", lambda t, *a, **k: t.numel() if t.device.type != "cpu" and "cpu" in map(str, [*a, *k.values()]) else 0
    )
    with mode:
        yield mode


def traffic(
    fn: type, shape: tuple[int, ...], monkeypatch: pytest.MonkeyPatch, device: str = "cpu"
) -> tuple[int, int, Status]:
    x = tensor(*shape, dtype=torch.bfloat16).to(device).requires_grad_()
    with host_traffic(monkeypatch) as mode:
        result = check(fn, [x], reference=kernels.gelu_reference)
    monkeypatch.undo()
    return mode.syncs, mode.values, result.status


@pytest.mark.parametrize("fn, status", [(kernels.FusedGELU, Status.PASS), (broken.GELUWrongGrad, Status.FAIL)])
def test_host_synchronisations_and_values_do_not_grow_with_the_size(fn, status, monkeypatch):
    counts = []
    for shape in [(64, 128), (128, 512)]:  # 8 and 64 chunks of 2048 reals
        monkeypatch.setattr(sides, "CHUNK", 2048, raising=False)
        syncs, values, got = traffic(fn, shape, monkeypatch)
        assert got is status
        counts.append((syncs, values))
    assert counts[0] == counts[1], counts
    assert counts[0][1] <= 4 * sides.MAP_CELLS  # the error map's cells and a few scalars and indices


class Float64Copies(TorchDispatchMode):
    """The most float64 tensors of at least ``numel`` elements, made by the ops run under it (views and
    in-place results of existing tensors apart), alive at once."""

    def __init__(self, numel: int) -> None:
        super().__init__()
        self.numel, self.live, self.peak = numel, 0, 0

    def _gone(self) -> None:
        self.live -= 1

    def __torch_dispatch__(self, func: Any, types: Any, args: Any = (), kwargs: Any = None) -> Any:
        kwargs = kwargs or {}
        out = func(*args, **kwargs)
        given = {
            t.untyped_storage().data_ptr()
            for t in [*args, *kwargs.values(), *(a for a in args if isinstance(a, (list, tuple)) for a in a)]
            if isinstance(t, torch.Tensor)
        }
        for t in out if isinstance(out, (tuple, list)) else [out]:
            if (
                isinstance(t, torch.Tensor)
                and t.dtype == torch.float64
                and t.numel() >= self.numel
                and t.untyped_storage().data_ptr() not in given
            ):
                self.live += 1
                self.peak = max(self.peak, self.live)
                weakref.finalize(t, self._gone)
        return out


@pytest.mark.parametrize("fn", [kernels.FusedGELU, broken.GELUWrongGrad, kernels.GELUBf16Inside])
@pytest.mark.parametrize("rule", [None, {"rule": "allclose"}])
def test_the_comparison_holds_at_most_two_output_sized_float64_copies(fn, rule, monkeypatch):
    shape = (64, 130)  # not a power of 2: the error map is padded
    numel = shape[0] * shape[1]
    peaks = []
    compare = sides.compare

    def measured(*args: Any) -> None:
        with Float64Copies(numel) as mode:
            compare(*args)
        peaks.append(mode.peak)

    monkeypatch.setattr(sides, "CHUNK", 2048, raising=False)
    monkeypatch.setattr("gradcheck_cli.checks.reference.compare", measured)
    monkeypatch.setattr("gradcheck_cli.checks.parts.sides.compare", measured)
    x = tensor(*shape, dtype=torch.bfloat16).requires_grad_()
    result = check(fn, [x], reference=kernels.gelu_reference, reference_tolerance=rule)
    assert result.status is (Status.FAIL if fn is broken.GELUWrongGrad else Status.PASS) or rule is not None
    assert len(peaks) == 2 and max(peaks) <= 2, peaks  # the gradient and the output


# ------------------------------------------------------------------------------------------ on a GPU


@cuda
@pytest.mark.parametrize("fn, status", [(kernels.FusedGELU, Status.PASS), (broken.GELUWrongGrad, Status.FAIL)])
def test_on_a_gpu_host_synchronisations_and_values_do_not_grow_with_the_size(fn, status, monkeypatch):
    counts = []
    for shape in [(64, 128), (128, 512)]:
        monkeypatch.setattr(sides, "CHUNK", 2048)
        syncs, values, got = traffic(fn, shape, monkeypatch, "cuda")
        assert got is status
        counts.append((syncs, values))
    assert counts[0] == counts[1], counts
    assert counts[0][1] <= 4 * sides.MAP_CELLS


@cuda
def test_on_a_gpu_the_rows_are_the_cpus():
    for name, a, n, own, rule in pairs():
        on_cpu = compared(a, n, own, rule)
        on_gpu = compared(a.cuda(), n.cuda(), None if own is None else own.cuda(), rule)
        assert as_text(on_gpu) == as_text(on_cpu), name


@cuda
@pytest.mark.parametrize("fn, status", [(kernels.FusedGELU, Status.PASS), (broken.GELUWrongGrad, Status.FAIL)])
def test_on_a_gpu_the_reference_check_keeps_its_verdict_and_its_work_on_the_device(fn, status):
    x = tensor(8, 1024, 1024, dtype=torch.bfloat16).cuda().requires_grad_()  # 2 chunks
    torch.cuda.reset_peak_memory_stats()
    result = check(fn, [x], reference=kernels.gelu_reference)
    assert result.status is status
    # the reference's own float64 run holds its input, grad_output, output and gradient, the kernel its float32
    # values; the comparison adds a few chunks, and on a failure two float64 copies (the issue measured the
    # comparison on the host at 23 float64 copies' worth of GPU memory at (8, 4096, 4096))
    assert torch.cuda.max_memory_allocated() <= 16 * 8 * x.numel()


# ---------------------------------------------------------------------------------- benchmarks/bench_gpu.py


@pytest.mark.slow
def test_the_gpu_benchmark_runs_on_a_cpu_at_tiny_sizes_and_prints_its_tables():
    root = Path(__file__).resolve().parents[2]
    env = {**os.environ, "PYTHONPATH": str(root)}
    command = [sys.executable, "benchmarks/bench_gpu.py", "--device", "cpu", "--small"]
    done = subprocess.run(command, cwd=root, env=env, capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stderr
    rows = [[c.strip() for c in line.strip("|").split("|")] for line in done.stdout.splitlines() if line[:2] == "| "]
    linear = {r[0]: r for r in rows if r[0].isdigit() and len(r) == 8}
    assert sorted(linear) == ["4", "8"]
    stages = [r for r in rows if r[0].isdigit() and len(r) == 5 and r[1] != "-"]  # n, three ways to stage, peak
    waits = [r for r in rows if r[0].isdigit() and len(r) == 5 and r[1] == "-"]  # the CUDA runtime's: none here
    assert [r[0] for r in waits] == ["4", "8"] and all(set(r[1:]) == {"-"} for r in waits)
    assert [r[0] for r in stages] == ["8"] and all(t.endswith(" ms") or t.endswith(" s") for t in stages[0][1:4])
    for r in linear.values():  # default, torch slow, ratio, --fast, torch fast, ratio, peak
        assert all(t.endswith(" ms") or t.endswith(" s") or "round" in t for t in (r[1], r[2], r[4], r[5])), r
        assert r[3].endswith("x") and r[6].endswith("x") and r[7] == "-", r  # every verdict pass; no GPU memory
    kernels_ = [(r[0], r[1], r[2]) for r in rows if "GELU" in r[0]]
    assert kernels_ == [
        ("FusedGELU", "[2, 64, 32]", "pass"),
        ("GELUWrongGrad (1.04x)", "[2, 64, 32]", "fail"),
        ("FusedGELU", "[4, 64, 64]", "pass"),
        ("GELUWrongGrad (1.04x)", "[4, 64, 64]", "fail"),
    ]
    assert all(r[5].endswith("x") and r[6].endswith("x") for r in rows if "GELU" in r[0])  # time, bytes
    assert "library API" in done.stdout


def test_a_probe_drawn_on_the_device_has_the_host_probes_values_and_its_seed_replays_it():
    from gradcheck_cli.checks.reference import drawn_there

    like = torch.zeros(64, 256, dtype=torch.bfloat16)
    draw = [drawn_there(like, torch.Generator().manual_seed(s)) for s in (0, 0, 1)]
    assert torch.equal(draw[0], draw[1]) and not torch.equal(draw[0], draw[2])
    assert draw[0].dtype == torch.bfloat16 and draw[0].shape == like.shape
    exact = drawn_there(like.double(), torch.Generator().manual_seed(0))
    steps = exact * 2**15 - 0.5  # an int16 k as (k + 0.5) / 2^15: signed_uniform's values
    assert torch.equal(steps, steps.round()) and steps.min() >= -(2**15) and steps.max() < 2**15
    host = probe_like(like.double(), torch.Generator().manual_seed(0))
    assert abs(float(exact.mean())) < 0.02 and float(exact.std()) == pytest.approx(float(host.std()), rel=0.02)


@pytest.mark.parametrize("shape", [(), (7,), (5000,), (70, 130), (64, 64), (3, 300, 17), (1, 9000), (9000, 1)])
def test_the_map_and_indices_made_on_the_device_are_those_of_rows_locate(shape, monkeypatch):
    # rows.locate (the Jacobian checks') moves the whole error to the host; the comparison's own are made on
    # the device a chunk at a time: the same cells, blocks and first indices
    monkeypatch.setattr(sides, "CHUNK", 1000)
    error = tensor(*shape).abs().reshape(-1)
    bad = error > 1.0
    row = InputReport(0, "x", list(shape), "float64", Status.FAIL)
    locate(row, bad, error, shape)
    chunks = [error[s : s + 1000] for s in range(0, error.numel(), 1000)]
    picture = sides._picture(list(chunks), shape, None)
    assert row.error_map is not None
    assert (picture.rows, picture.cols, picture.block, picture.error) == (
        row.error_map.rows,
        row.error_map.cols,
        row.error_map.block,
        row.error_map.error,
    )
    assert sides._first([bad[s : s + 1000] for s in range(0, bad.numel(), 1000)], shape) == row.mismatched_indices


# ------------------------------------------------------------------------ what the comparison costs the device


def test_the_reference_check_moves_at_most_17x_the_bytes_of_one_float64_run_of_its_reference():
    # a GPU comparing kernel-sized tensors is memory-bound: bytes read and written are its time (issue 30: at
    # most 20x the time of one float64 forward+backward of the reference). The check runs the kernel, the
    # reference in float64 and in the kernel's dtype, and compares outputs and gradients: 25x before the lean
    # comparison, 16x after (the kernel, a float32-inside stand-in, is 4x of it)
    x = tensor(4, 256, 256, dtype=torch.bfloat16).requires_grad_()
    x64, g64 = x.detach().double().requires_grad_(), tensor(4, 256, 256, seed=1)
    with Traffic() as once:
        kernels.gelu_reference(x64).backward(g64)
    with Traffic() as ours:
        assert check(kernels.FusedGELU, [x], reference=kernels.gelu_reference).status is Status.PASS
    assert ours.bytes <= 17 * once.bytes, (ours.bytes / once.bytes, ours.by_op.most_common(12))
