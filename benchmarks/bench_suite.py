"""gradcheck-cli's engine against torch.autograd.gradcheck on the same Functions and inputs.

torch's slow mode and gradcheck-cli's default check each run in their own process, so peak
memory is its own and a process killed for memory costs one row; gradcheck-cli's runs just
before and just after torch's (the mean is reported: this machine's speed drifts). The fast
engines take milliseconds: they run in one process, alternating, FAST_REPEATS times each, and
the medians are reported. Everything is warmed up on a tiny input first, so first-call costs
(lazy imports inside torch) are not counted. Every process keeps freed memory as the CLI's
workers do. Every engine runs on BENCH_THREADS torch threads (default 1). Not a test: run it by hand,

    python benchmarks/bench_suite.py            # everything (about 20 minutes here), then the batch,
                                                # cold start and watch benchmarks (bench_batch, bench_watch)
    python benchmarks/bench_suite.py --quick    # the small cases only
    python benchmarks/bench_suite.py --only "linear n=64"   # the cases whose name contains this
    python benchmarks/bench_suite.py --profile "linear n=64" [--fast]   # where the time goes
"""

from __future__ import annotations

import json
import os
import resource
import subprocess
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
PAIRED = ("torch-fast", "gradcheck-cli --fast")  # timed together in one process, alternating
FAST_REPEATS = 21  # runs of each fast engine (milliseconds each); the median is reported

FUNCTIONS = '''
import torch

class LinearVmap(torch.autograd.Function):
    """y = x W^T + b, declared vmap-able (setup_context + generate_vmap_rule)"""
    generate_vmap_rule = True
    @staticmethod
    def forward(x, w, b):
        return x @ w.t() + b
    @staticmethod
    def setup_context(ctx, inputs, output):
        ctx.save_for_backward(*inputs)
    @staticmethod
    def backward(ctx, g):
        x, w, b = ctx.saved_tensors
        return g @ w, g.t() @ x, g.sum(0)

class Softplus(torch.autograd.Function):
    """elementwise"""
    @staticmethod
    def forward(ctx, x):
        ctx.save_for_backward(x)
        return torch.nn.functional.softplus(x)
    @staticmethod
    def backward(ctx, g):
        (x,) = ctx.saved_tensors
        return g * torch.sigmoid(x)

class LogSumExp(torch.autograd.Function):
    """a reduction over the last dim"""
    @staticmethod
    def forward(ctx, x):
        y = torch.logsumexp(x, -1)
        ctx.save_for_backward(x, y)
        return y
    @staticmethod
    def backward(ctx, g):
        x, y = ctx.saved_tensors
        return g.unsqueeze(-1) * torch.exp(x - y.unsqueeze(-1))

class SinCos(torch.autograd.Function):
    """two outputs"""
    @staticmethod
    def forward(ctx, x):
        ctx.save_for_backward(x)
        return x.sin(), x.cos()
    @staticmethod
    def backward(ctx, gs, gc):
        (x,) = ctx.saved_tensors
        return gs * x.cos() - gc * x.sin()

class SumOfProducts(torch.autograd.Function):
    """many small inputs: sum_i a_i * b_i"""
    @staticmethod
    def forward(ctx, *xs):
        ctx.save_for_backward(*xs)
        return sum(xs[i] * xs[i + 1] for i in range(0, len(xs), 2))
    @staticmethod
    def backward(ctx, g):
        xs = ctx.saved_tensors
        out = []
        for i in range(0, len(xs), 2):
            out += [g * xs[i + 1], g * xs[i]]
        return tuple(out)
'''

CASES = {  # name: (function, input shapes)
    **{f"linear n={n}": ("linear", [(n, n), (n, n), (n,)]) for n in (16, 32, 64, 96, 128)},
    **{f"linear-vmap n={n}": ("LinearVmap", [(n, n), (n, n), (n,)]) for n in (64, 128)},
    "elementwise 64x64": ("Softplus", [(64, 64)]),
    "reduction 32x64": ("LogSumExp", [(32, 64)]),
    "two outputs 48x48": ("SinCos", [(48, 48)]),
    "12 small inputs 4x4": ("SumOfProducts", [(4, 4)] * 12),
}
QUICK = (
    "linear n=16",
    "linear n=32",
    "linear n=64",
    "linear-vmap n=64",
    "elementwise 64x64",
    "reduction 32x64",
    "two outputs 48x48",
    "12 small inputs 4x4",
)


def _setup(case: str) -> tuple:
    """In the child process: the case's Function and input shapes, and a fresh-input maker."""
    import torch

    from gradcheck_cli.run.pool import keep_freed_memory

    keep_freed_memory()  # as in the CLI's worker processes; for every engine, so all run alike
    # every engine on the same number of torch threads (BENCH_THREADS, default 1: on this shared
    # 2-core machine a second thread that waits for its time slice stalls every parallel op)
    torch.set_num_threads(int(os.environ.get("BENCH_THREADS", "1")))
    name, shapes = CASES[case]
    if name == "linear":
        from gradcheck_cli.examples.linear import LinearFunction as fn
    else:
        namespace: dict = {}
        exec(FUNCTIONS, namespace)  # our own benchmark Functions, from the source above
        fn = namespace[name]
    gen = torch.Generator().manual_seed(0)

    def inputs(shapes: list) -> list:
        return [torch.randn(*s, generator=gen, dtype=torch.float64).requires_grad_() for s in shapes]

    return fn, shapes, inputs


def _verdict(engine: str, fn: object, args: list) -> bool:
    import torch

    from gradcheck_cli import FAST_PROBES, check

    if engine.startswith("gradcheck-cli"):
        return (
            check(
                fn,
                args,
                probes=FAST_PROBES if engine.endswith("--fast") else 0,
                compress=not engine.endswith("--no-compress"),
            ).status.value
            == "pass"
        )
    return torch.autograd.gradcheck(fn.apply, args, fast_mode=engine == "torch-fast", raise_exception=False)


def one(engine: str, case: str) -> dict:
    """In the child process: check one case with one engine, once; wall time and peak memory."""
    fn, shapes, inputs = _setup(case)
    _verdict(engine, fn, inputs([tuple(min(d, 2) for d in s) for s in shapes]))  # warm-up: first-call costs
    args = inputs(shapes)
    start = time.perf_counter()
    verdict = _verdict(engine, fn, args)
    wall = time.perf_counter() - start
    return {
        "pass": verdict,
        "wall_s": wall,
        "peak_mb": _peak_mb(),
        "floor_s": floor(fn, shapes) if engine == "gradcheck-cli" else None,
        "batched_floor_s": batched_floor(fn, shapes) if engine == "gradcheck-cli" else None,
    }


def paired(case: str) -> dict:
    """In the child process: the fast engines (milliseconds each) on the same inputs, alternating
    run by run, so that the machine's drift (large here) hits both alike; medians of FAST_REPEATS."""
    fn, shapes, inputs = _setup(case)
    small = inputs([tuple(min(d, 2) for d in s) for s in shapes])
    args = inputs(shapes)
    walls: dict = {e: [] for e in PAIRED}
    verdicts = {}
    for engine in PAIRED:
        _verdict(engine, fn, small)
        _verdict(engine, fn, args)  # warm-up at full size too: allocator, lazy kernels
    for _ in range(FAST_REPEATS):
        for engine in PAIRED:
            start = time.perf_counter()
            verdicts[engine] = _verdict(engine, fn, args)
            walls[engine].append(time.perf_counter() - start)
    return {
        e: {"pass": verdicts[e], "wall_s": sorted(walls[e])[len(walls[e]) // 2], "peak_mb": _peak_mb(), "floor_s": None}
        for e in PAIRED
    }


def profile(case: str, fast: bool) -> None:
    """Where gradcheck-cli's time goes on one case: pyinstrument's call tree of one check after
    the warm-up (needs ``pip install pyinstrument``)."""
    from pyinstrument import Profiler

    engine = "gradcheck-cli --fast" if fast else "gradcheck-cli"
    fn, shapes, inputs = _setup(case)
    _verdict(engine, fn, inputs(shapes))  # warm-up at full size: the profile shows the steady state
    args = inputs(shapes)
    profiler = Profiler(interval=0.0002 if fast else 0.002)
    profiler.start()
    for _ in range(100 if fast else 1):
        _verdict(engine, fn, args)
    profiler.stop()
    print(profiler.output_text(unicode=False, color=False))


def _peak_mb() -> float:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024


def floor(fn: object, shapes: list) -> float:
    """The cost floor of an element-wise check: 2N forwards (N input elements), one at a time."""
    import torch

    args = [torch.randn(*s, dtype=torch.float64) for s in shapes]
    calls = 2 * sum(a.numel() for a in args)
    start = time.perf_counter()
    with torch.no_grad():
        for _ in range(calls):
            fn.apply(*args)
    return time.perf_counter() - start


def batched_floor(fn: object, shapes: list) -> float:
    """The arithmetic floor of the element-wise check without compression: every one of the 2N
    perturbed forwards and M one-hot backward calls made, batched through vmap (stages of 256),
    nothing compared; timed in the same process."""
    import torch

    from gradcheck_cli.subject.target import Target

    body = Target("floor", fn, True).body
    args = [torch.randn(*s, dtype=torch.float64) for s in shapes]
    leaves = [a.clone().requires_grad_() for a in args]
    one = torch.ones(1, dtype=torch.float64, requires_grad=True)  # torch.autograd.grad's first call with a
    torch.autograd.grad(one * 2, one, torch.ones(1, dtype=torch.float64))  # grad_output imports sympy: not timed
    start = time.perf_counter()
    with torch.no_grad():
        for i, a in enumerate(args):
            for k0 in range(0, 2 * a.numel(), 256):
                k = min(256, 2 * a.numel() - k0)
                batch = a.expand(k, *a.shape).clone()
                batch.view(k, -1)[torch.arange(k), (k0 + torch.arange(k)) // 2] += 1e-6
                torch.func.vmap(lambda xb, i=i: body([*args[:i], xb, *args[i + 1 :]]))(batch)
    out = fn.apply(*leaves)
    outs = out if isinstance(out, tuple) else (out,)
    for o in outs:
        for r0 in range(0, o.numel(), 256):
            k = min(256, o.numel() - r0)
            one_hot = torch.zeros(k, o.numel(), dtype=o.dtype)
            one_hot[torch.arange(k), r0 + torch.arange(k)] = 1
            torch.func.vmap(
                lambda g, o=o: torch.autograd.grad(
                    o, leaves, g.view(o.shape), retain_graph=True, materialize_grads=True
                )
            )(one_hot)
    return time.perf_counter() - start


def child(*args: str, timeout: float = 1200) -> dict:
    """``one`` (args: "--one", engine, case) or ``paired`` (args: "--paired", case) in a fresh process."""
    try:
        proc = subprocess.run([sys.executable, __file__, *args], capture_output=True, text=True, timeout=timeout)
    except subprocess.TimeoutExpired:
        return {"pass": "timeout", "wall_s": None, "peak_mb": None}
    if proc.returncode != 0:
        reason = "killed" if proc.returncode in (-9, 137) else f"died ({proc.returncode})"  # -9: out of memory
        return {"pass": reason, "wall_s": None, "peak_mb": None}
    return json.loads(proc.stdout)


def measure(case: str) -> dict:
    """Every engine on one case. gradcheck-cli's default check runs just before and just after
    torch's slow mode and reports the mean of the two, so that drift during the long torch run
    does not favour either; the fast engines run in one process, alternating."""
    before = child("--one", "gradcheck-cli", case)
    slow = child("--one", "torch-slow", case)
    after = child("--one", "gradcheck-cli", case)
    plain = child("--one", "gradcheck-cli --no-compress", case)
    ours = dict(after)
    if isinstance(before["wall_s"], float) and isinstance(after["wall_s"], float):
        ours["wall_s"] = (before["wall_s"] + after["wall_s"]) / 2
        ours["floor_s"] = (before["floor_s"] + after["floor_s"]) / 2
        ours["batched_floor_s"] = (before["batched_floor_s"] + after["batched_floor_s"]) / 2
        ours["peak_mb"] = max(before["peak_mb"], after["peak_mb"])
    fast = child("--paired", case)
    pair = fast if "pass" not in fast else dict.fromkeys(PAIRED, fast)  # a failed child: both rows say so
    return {
        "torch-slow": slow,
        "torch-fast": pair["torch-fast"],
        "gradcheck-cli": ours,
        "gradcheck-cli --no-compress": plain,
        "gradcheck-cli --fast": pair["gradcheck-cli --fast"],
    }


def _ratio(wall: object, reference: object) -> str:
    return f"{wall / reference:.3f}x" if isinstance(wall, float) and isinstance(reference, float) else "-"


def fmt(value: object, spec: str) -> str:
    return format(value, spec) if isinstance(value, (int, float)) and not isinstance(value, bool) else str(value)


def main(quick: bool, only: str = "") -> None:
    print(
        f"{'case':22} {'engine':27} {'verdict':>9} {'wall s':>8} {'peak MB':>8} {'vs torch slow':>14} "
        f"{'vs torch fast':>14} {'vs 2N fwd':>10} {'vs floor':>9} {'vs plain':>9}"
    )
    for case in [c for c in (QUICK if quick else CASES) if only in c]:
        rows = measure(case)
        for engine, row in rows.items():
            ratios = [_ratio(row["wall_s"], rows[ref]["wall_s"]) for ref in ("torch-slow", "torch-fast")]
            ours = engine == "gradcheck-cli"
            to_floor = _ratio(row["wall_s"], row.get("floor_s")) if ours else ""
            to_batched = _ratio(row["wall_s"], row.get("batched_floor_s")) if ours else ""
            to_plain = _ratio(row["wall_s"], rows["gradcheck-cli --no-compress"]["wall_s"]) if ours else ""
            print(
                f"{case:22} {engine:27} {fmt(row['pass'], ''):>9} {fmt(row['wall_s'], '.3f'):>8} "
                f"{fmt(row['peak_mb'], '.0f'):>8} {ratios[0]:>14} {ratios[1]:>14} {to_floor:>10} "
                f"{to_batched:>9} {to_plain:>9}",
                flush=True,
            )
    print(
        "vs 2N fwd: the default check against 2N forwards one at a time (N input elements); vs floor: against "
        "the arithmetic floor of the uncompressed method (2N perturbed forwards and M one-hot backward calls, "
        "batched through vmap); vs plain: against --no-compress; all timed in the same process"
    )
    if not quick and not only:  # the batch, cold-start and watch rows, in the same run
        subprocess.run(
            [sys.executable, str(REPO / "benchmarks" / "bench_batch.py"), "100", "--rounds", "3"], check=False
        )
        subprocess.run([sys.executable, str(REPO / "benchmarks" / "bench_watch.py"), "10"], check=False)


if __name__ == "__main__":
    if sys.argv[1:2] == ["--one"]:
        print(json.dumps(one(sys.argv[2], sys.argv[3])))
    elif sys.argv[1:2] == ["--paired"]:
        print(json.dumps(paired(sys.argv[2])))
    elif sys.argv[1:2] == ["--profile"]:
        profile(sys.argv[2], "--fast" in sys.argv)
    else:
        main("--quick" in sys.argv, sys.argv[sys.argv.index("--only") + 1] if "--only" in sys.argv else "")
