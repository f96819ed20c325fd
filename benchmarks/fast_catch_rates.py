"""How often the fast modes let a wrong gradient pass, over many seeds.

The wrong gradients are those of tests/agreement/test_fast_mode.py (64x64 inputs): a rolled or flipped
gradient, a 1% sign pattern, one tripled element, a swapped pair, and one that torch's fast mode
catches (errors of one sign). For each seed, gradcheck-cli's --fast decision (its probes; the
element-by-element comparison a failing probe sends the check to is skipped, since its verdict
is "fail" anyway) and torch.autograd.gradcheck(fast_mode=True) on the same input. Random probes
catch a wrong element with a probability, so this counts. Not a test: run it by hand,

    python benchmarks/fast_catch_rates.py            # 100 seeds (about a minute here)
    python benchmarks/fast_catch_rates.py --seeds 20
"""

from __future__ import annotations

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "tests"))  # the corpus test_fast_mode imports
sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "tests" / "agreement"))  # test_fast_mode

import test_fast_mode as bugs  # the wrong gradients under test (tests/ is on sys.path above)

from gradcheck_cli import FAST_PROBES, check
from gradcheck_cli.checks import backward

TORCH_CATCHES = 10  # seeds for torch's fast mode on the wrong gradient it catches


class Escalated(Exception):
    """A probe failed: the check went on to compare element by element."""


def _no_escalation(*args: object, **kwargs: object) -> None:
    raise Escalated


def main(seeds: int) -> None:
    backward.compare = _no_escalation  # count the probes' decision only
    print(f"{'wrong gradient':30} {'--fast missed':>14} {'torch fast missed':>18}")
    for fn in bugs.MISSED_BY_TORCH_FAST + bugs.CAUGHT_BY_TORCH_FAST:
        # torch's fast mode explains a failure in slow mode (seconds here): fewer seeds where it fails
        torch_seeds = seeds if fn in bugs.MISSED_BY_TORCH_FAST else min(seeds, TORCH_CATCHES)
        ours = torch_fast = 0
        for seed in range(seeds):
            x = bugs._x(seed)
            ours += check(fn, [x], probes=FAST_PROBES, seed=seed).status.value == "pass"
            if seed < torch_seeds:
                torch_fast += bugs._torch_fast(fn, x, seed)
        print(f"{fn.__name__:30} {f'{ours} of {seeds}':>14} {f'{torch_fast} of {torch_seeds}':>18}", flush=True)


if __name__ == "__main__":
    main(int(sys.argv[sys.argv.index("--seeds") + 1]) if "--seeds" in sys.argv else 100)
