"""gradcheck-cli on a GPU (issue 30): time and peak device memory of the checks, against
torch.autograd.gradcheck on the same device, and of the reference check against one float64
forward+backward of the reference. Prints Markdown tables.

Everything runs in this one process through the library API (``gradcheck_cli.check``), so the
times are the checks' own, not process start-up; each is synchronised and the median of a few
rounds (one round where a run takes over 2 s). A row predicted to take over ``--budget`` seconds
(from the size before it) is skipped and says so. Not a test: run it by hand from a checkout,

    PYTHONPATH=. python benchmarks/bench_gpu.py                      # cuda, the issue's sizes
    PYTHONPATH=. python benchmarks/bench_gpu.py --device cpu --small  # tiny sizes, anywhere
"""

from __future__ import annotations

import argparse
import contextlib
import statistics
import time
from collections.abc import Callable
from typing import Any, Optional
from unittest import mock

import torch

from gradcheck_cli import check
from gradcheck_cli.examples import broken, kernels
from gradcheck_cli.examples.linear import LinearFunction
from tests.traffic import Traffic

LINEAR = (32, 64, 128, 256, 512)
LINEAR_SMALL = (4, 8)
GELU = ((2, 4096, 1024), (8, 4096, 4096))
GELU_SMALL = ((2, 64, 32), (4, 64, 64))
GROWTH = {"default": 8.0, "fast": 4.0, "torch slow": 5.0, "torch fast": 4.0}  # time x per doubling of n, to predict
SEVERAL = 2.0  # s: a run this long is timed once


class Timing:
    """A measured run: the median time, the rounds, the peak device memory (bytes; None on a CPU) and
    what the run returned (a verdict)."""

    def __init__(self, seconds: float, rounds: int, peak: Optional[int], verdict: str) -> None:
        self.seconds, self.rounds, self.peak, self.verdict = seconds, rounds, peak, verdict


def timed(run: Callable[[], str], device: torch.device, rounds: int = 3) -> Timing:
    """``run`` synchronised on ``device``: once, then ``rounds`` more if it was quick (the median of those)."""
    gpu = device.type == "cuda"

    def once() -> tuple[float, str]:
        if gpu:
            torch.cuda.synchronize(device)
        start = time.perf_counter()
        verdict = run()
        if gpu:
            torch.cuda.synchronize(device)
        return time.perf_counter() - start, verdict

    if gpu:
        torch.cuda.reset_peak_memory_stats(device)
    first, verdict = once()
    times = [first] if first > SEVERAL else [once()[0] for _ in range(rounds)]
    peak = torch.cuda.max_memory_allocated(device) if gpu else None
    return Timing(statistics.median(times), len(times), peak, verdict)


def linear_args(n: int, device: torch.device) -> list[torch.Tensor]:
    gen = torch.Generator().manual_seed(0)
    shapes = ((n, n), (n, n), (n,))
    return [torch.randn(*s, generator=gen, dtype=torch.float64).to(device).requires_grad_() for s in shapes]


def linear_runs(n: int, device: torch.device) -> dict[str, Callable[[], str]]:
    """The four ways to check Linear at n: gradcheck-cli's default check and --fast, torch's slow and fast mode."""
    args = linear_args(n, device)

    def ours(fast: bool) -> Callable[[], str]:
        def run() -> str:
            result = check(LinearFunction, args, fast=fast)
            error = result.error
            return result.status.value + (f" ({error.kind.value})" if error is not None else "")

        return run

    def torch_mode(fast: bool) -> Callable[[], str]:
        def run() -> str:
            ok = torch.autograd.gradcheck(LinearFunction.apply, args, fast_mode=fast, raise_exception=False)
            return "pass" if ok else "fail"

        return run

    return {"default": ours(False), "fast": ours(True), "torch slow": torch_mode(False), "torch fast": torch_mode(True)}


def seconds(t: Optional[Timing], why: str = "", quiet: bool = False) -> str:
    """A time as the table shows it, with its rounds where only one, and a verdict other than pass."""
    if t is None:
        return why
    text = f"{t.seconds * 1e3:.1f} ms" if t.seconds < 1 else f"{t.seconds:.2f} s"
    return text + (" (1 round)" if t.rounds == 1 else "") + ("" if t.verdict == "pass" or quiet else f" {t.verdict}")


def ratio(a: Optional[Timing], b: Optional[Timing]) -> str:
    return f"{a.seconds / b.seconds:.3g}x" if a and b and b.seconds else "-"


def gigabytes(*ts: Optional[Timing]) -> str:
    peaks = [t.peak for t in ts if t is not None and t.peak is not None]
    return " / ".join(f"{p / 2**30:.2f}" for p in peaks) if peaks else "-"


def linear_table(sizes: tuple[int, ...], device: torch.device, budget: float) -> None:
    print(f"\nLinear (x, W: n x n, b: n; float64) on {device}, library API in-process (gradcheck_cli.check)\n")
    print("| Linear n | default check | torch slow | ratio | `--fast` (3 probes) | torch fast | ratio | peak GB |")
    print("|---|---|---|---|---|---|---|---|")
    last: dict[str, Optional[Timing]] = {}
    for n in sizes:
        runs = linear_runs(n, device)
        got: dict[str, Optional[Timing]] = {}
        why: dict[str, str] = {}
        for name, run in runs.items():
            before = last.get(name)
            guess = before.seconds * GROWTH[name] if before is not None else 0.0
            if name in last and before is None or guess > budget:
                got[name], why[name] = None, f"skipped (over ~{budget:g} s)"
            else:
                got[name] = timed(run, device)
        last = got
        print(
            f"| {n} | {seconds(got['default'], why.get('default', ''))} "
            f"| {seconds(got['torch slow'], why.get('torch slow', ''))} | {ratio(got['default'], got['torch slow'])} "
            f"| {seconds(got['fast'], why.get('fast', ''))} | {seconds(got['torch fast'], why.get('torch fast', ''))} "
            f"| {ratio(got['fast'], got['torch fast'])} "
            f"| {gigabytes(got['default'], got['torch slow'], got['fast'], got['torch fast'])} |",
            flush=True,
        )


def reference_once(x: torch.Tensor) -> Callable[[], str]:
    """One float64 forward+backward of the reference (GELU), on float64 copies made beforehand."""
    x64 = x.detach().double().requires_grad_()
    g64 = torch.randn_like(x64)

    def run() -> str:
        x64.grad = None
        kernels.gelu_reference(x64).backward(g64)
        return "pass"

    return run


def moved(run: Callable[[], str], base: Callable[[], str]) -> str:
    """The bytes ``run``'s ops read and write (tests/traffic.py), as a multiple of ``base``'s: a memory-bound
    device's time ratio, counted the same on any device (a CPU's estimate of a GPU's)."""
    with Traffic(least=0) as ours:
        run()
    with Traffic(least=0) as theirs:
        base()
    return f"{ours.bytes / theirs.bytes:.3g}x"


def reference_table(shapes: tuple[tuple[int, ...], ...], device: torch.device, budget: float) -> None:
    print(f"\nReference check of a bfloat16 GELU kernel against its PyTorch reference on {device}, library API\n")
    print(
        "| kernel | shape | verdict | reference check | one float64 fwd+bwd of the reference | ratio "
        "| bytes moved, ratio | peak GB |"
    )
    print("|---|---|---|---|---|---|---|---|")
    last: Optional[Timing] = None
    for shape in shapes:
        gen = torch.Generator().manual_seed(0)
        x = torch.randn(*shape, generator=gen, dtype=torch.float32).to(device, torch.bfloat16).requires_grad_()
        base = timed(reference_once(x), device)
        for name, fn in (("FusedGELU", kernels.FusedGELU), ("GELUWrongGrad (1.04x)", broken.GELUWrongGrad)):
            if last is not None and last.seconds * 16 > budget:  # 16x the elements
                print(f"| {name} | {list(shape)} | - | skipped (over ~{budget:g} s) | {seconds(base)} | - | - | - |")
                continue

            def run(fn: Any = fn, x: torch.Tensor = x) -> str:
                return check(fn, [x], reference=kernels.gelu_reference).status.value

            t = timed(run, device)
            print(
                f"| {name} | {list(shape)} | {t.verdict} | {seconds(t, quiet=True)} | {seconds(base)} "
                f"| {ratio(t, base)} | {moved(run, reference_once(x))} | {gigabytes(t)} |",
                flush=True,
            )
            last = t if last is None or t.seconds > last.seconds else last
        del x
        if device.type == "cuda":
            torch.cuda.empty_cache()


STAGES = (128, 256)
STAGES_SMALL = (8,)


def stage_table(sizes: tuple[int, ...], device: torch.device) -> None:
    """Issue 30 item 2: the default check of Linear with the compressed stages capped as on a CPU (the caps
    tuned to its caches), as on this device (``batching.device_cap``: a share of its free memory) under the
    default ``--max-memory`` (512), and under ``--max-memory 4096``: fewer, larger stages."""
    from gradcheck_cli.numerics import batching, compressed, row_groups, rows

    sites = (batching, compressed, row_groups, rows)
    print(f"\nStages of the default check of Linear on {device}: the CPU's caps against the device's\n")
    print("| Linear n | CPU caps, 512 MB | device caps, 512 MB | device caps, 4096 MB | peak GB |")
    print("|---|---|---|---|---|")
    for n in sizes:
        args = linear_args(n, device)
        got = []
        for cpu_caps, memory in ((True, 512), (False, 512), (False, 4096)):
            with contextlib.ExitStack() as caps:
                for site in sites if cpu_caps else ():
                    caps.enter_context(mock.patch.object(site, "device_cap", lambda cap, device: cap))

                def run(args: list[torch.Tensor] = args, memory: int = memory) -> str:
                    return check(LinearFunction, args, max_memory=memory).status.value

                got.append(timed(run, device))
        print(f"| {n} | " + " | ".join(seconds(t) for t in got) + f" | {gigabytes(*got)} |", flush=True)


SYNCS = (32, 64, 128)
SYNCS_SMALL = (4, 8)


def sync_table(sizes: tuple[int, ...], device: torch.device) -> None:
    """Issue 30 item 1 on the device: the host's waits for it during the default check of Linear, as the CUDA
    runtime makes them (the profiler's ``cudaStreamSynchronize``, ``cudaDeviceSynchronize`` and friends), and
    the copies between host and device: a count that does not grow with n is a constant number of waits."""
    from torch.profiler import ProfilerActivity
    from torch.profiler import profile as torch_profile

    print(f"\nWaits for the device during the default check of Linear on {device} (the CUDA runtime's calls)\n")
    print("| Linear n | synchronisations | copies host to device | copies device to host | kernel launches |")
    print("|---|---|---|---|---|")
    for n in sizes:
        args = linear_args(n, device)
        check(LinearFunction, args)
        if device.type != "cuda":
            print(f"| {n} | - | - | - | - |")
            continue
        with torch_profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA]) as prof:
            check(LinearFunction, args)
            torch.cuda.synchronize(device)
        counts = [(e.key, e.count) for e in prof.key_averages()]

        def count(match: Callable[[str], bool], counts: list[tuple[str, int]] = counts) -> int:
            return sum(c for key, c in counts if match(key))

        print(
            f"| {n} | {count(lambda k: 'Synchronize' in k)} | {count(lambda k: 'HtoD' in k)} "
            f"| {count(lambda k: 'DtoH' in k)} | {count(lambda k: k == 'cudaLaunchKernel')} |",
            flush=True,
        )


def profile_linear(n: int, device: torch.device, path: str) -> None:
    """Where the time of the default check of Linear at ``n`` goes, as ``profile`` for the reference check."""

    def run() -> None:
        check(LinearFunction, linear_args(n, device))

    write_profile(run, device, path, f"default check of Linear n={n} on {device}")


def write_profile(run: Callable[[], None], device: torch.device, path: str, title: str) -> None:
    """``run`` once untimed, then under torch.profiler (ops by their own device, else CPU, time) and under
    cProfile (Python functions by cumulative time), both tables into ``path``."""
    import cProfile
    import io
    import pstats

    from torch.profiler import ProfilerActivity
    from torch.profiler import profile as torch_profile

    run()
    activities = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if device.type == "cuda" else [])
    with torch_profile(activities=activities) as prof:
        run()
        if device.type == "cuda":
            torch.cuda.synchronize(device)
    key = "self_device_time_total" if device.type == "cuda" else "self_cpu_time_total"
    python = cProfile.Profile()
    python.enable()
    run()
    if device.type == "cuda":
        torch.cuda.synchronize(device)
    python.disable()
    text = io.StringIO()
    pstats.Stats(python, stream=text).sort_stats("cumulative").print_stats(40)
    with open(path, "w") as f:
        f.write(f"{title}\n\n" + prof.key_averages().table(sort_by=key, row_limit=30) + "\n\n" + text.getvalue())
    print(f"\nprofile of the {title}: {path}")


def warm_up(device: torch.device) -> None:
    """One of each kind of run, untimed: imports, the device's context and first kernels are no check's cost."""
    for run in linear_runs(2, device).values():
        run()
    x = torch.randn(2, 8, device=device).to(torch.bfloat16).requires_grad_()
    check(kernels.FusedGELU, [x], reference=kernels.gelu_reference)
    reference_once(x)()


def profile(shape: tuple[int, ...], device: torch.device, path: str) -> None:
    """Where the time of one reference check of the kernel at ``shape`` goes (``write_profile``)."""
    x = torch.randn(*shape, dtype=torch.float32).to(device, torch.bfloat16).requires_grad_()

    def run() -> None:
        check(kernels.FusedGELU, [x], reference=kernels.gelu_reference)

    write_profile(run, device, path, f"reference check of FusedGELU at {list(shape)} on {device}")


def main(argv: Optional[list[str]] = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--device", default="cuda", help="cuda (default), cuda:N or cpu")
    parser.add_argument("--small", action="store_true", help="tiny sizes (a smoke run on a CPU)")
    parser.add_argument(
        "--profile",
        metavar="PATH",
        help="write where the largest reference check's time goes (and Linear's, beside it)",
    )
    parser.add_argument("--budget", type=float, default=30.0, help="skip a row predicted to take longer (s)")
    args = parser.parse_args(argv)
    device = torch.device(args.device)
    if device.type == "cuda" and not torch.cuda.is_available():
        parser.error("no CUDA device here: run with --device cpu (and --small for tiny sizes)")
    name = torch.cuda.get_device_name(device) if device.type == "cuda" else "CPU"
    print(f"# bench_gpu: {name}, torch {torch.__version__}, {torch.get_num_threads()} CPU threads")
    print("times: synchronised, median of 3 rounds after a first one (one round where it takes over 2 s)")
    warm_up(device)
    linear_table(LINEAR_SMALL if args.small else LINEAR, device, args.budget)
    shapes = GELU_SMALL if args.small else GELU
    reference_table(shapes, device, args.budget)
    stage_table(STAGES_SMALL if args.small else STAGES, device)
    sync_table(SYNCS_SMALL if args.small else SYNCS, device)
    if args.profile:
        profile(shapes[-1], device, args.profile)
        stem, dot, ext = args.profile.rpartition(".")
        for n in (8,) if args.small else (128, 256):
            profile_linear(n, device, f"{stem}-linear-{n}.{ext}" if dot else f"{args.profile}-linear-{n}")


if __name__ == "__main__":
    main()
