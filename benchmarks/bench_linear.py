"""Time and peak memory of checking a Linear Function: gradcheck-cli vs torch.autograd.gradcheck.

Each (engine, n) runs in its own process so peak memory is its own and an out-of-memory kill
of one does not stop the rest. Not a test: run it by hand, e.g.

    python benchmarks/bench_linear.py 64 128
"""

from __future__ import annotations

import json
import resource
import subprocess
import sys
import time

ENGINES = ("torch-slow", "torch-fast", "gradcheck-cli")


def one(engine: str, n: int) -> dict:
    """Run in the child process: check LinearFunction with x, W: n x n and b: n."""
    import torch

    from gradcheck_cli import check
    from gradcheck_cli.examples.linear import LinearFunction

    gen = torch.Generator().manual_seed(0)
    args = [torch.randn(*s, generator=gen, dtype=torch.float64).requires_grad_() for s in ((n, n), (n, n), (n,))]
    start = time.perf_counter()
    if engine == "gradcheck-cli":
        verdict = check(LinearFunction, args).status.value == "pass"
    else:
        verdict = torch.autograd.gradcheck(
            LinearFunction.apply, args, fast_mode=engine == "torch-fast", raise_exception=False
        )
    wall = time.perf_counter() - start
    peak_mb = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
    return {"engine": engine, "n": n, "pass": verdict, "wall_s": round(wall, 3), "peak_mb": round(peak_mb)}


def main(sizes: list[int], timeout: float = 1200) -> None:
    print(f"{'engine':15} {'n':>4} {'verdict':>8} {'wall s':>8} {'peak MB':>8}")
    for n in sizes:
        for engine in ENGINES:
            try:
                proc = subprocess.run(
                    [sys.executable, __file__, "--one", engine, str(n)], capture_output=True, text=True, timeout=timeout
                )
                row = (
                    json.loads(proc.stdout)
                    if proc.returncode == 0
                    else {
                        "engine": engine,
                        "n": n,
                        "pass": f"died ({proc.returncode})",
                        "wall_s": None,
                        "peak_mb": None,
                    }
                )
            except subprocess.TimeoutExpired:
                row = {"engine": engine, "n": n, "pass": "timeout", "wall_s": None, "peak_mb": None}
            print(
                f"{row['engine']:15} {n:>4} {str(row['pass']):>8} {str(row['wall_s']):>8} {str(row['peak_mb']):>8}",
                flush=True,
            )


if __name__ == "__main__":
    if sys.argv[1:2] == ["--one"]:
        print(json.dumps(one(sys.argv[2], int(sys.argv[3]))))
    else:
        main([int(a) for a in sys.argv[1:]] or [16, 32, 64])
