"""Seeds: the range a seed takes and the seed after a seed. Plain integers, no torch, imports nothing:
the spec validates a spec's `seed:` with SEEDS, the runner counts --trials' and resampling's seeds.

The random streams drawn from a seed are ``numerics.streams``.
"""

from __future__ import annotations

SEEDS = 2**64  # seeds are 0 <= seed < SEEDS, the range of torch.Generator.manual_seed


def seed_plus(seed: int, step: int) -> int:
    """The seed ``step`` after ``seed`` (--trials' seed + 1, ..., resampling's), wrapped around
    within the seeds torch takes (0 <= seed < 2**64): a valid seed never leads to an invalid one,
    and the seed reported replays the draw."""
    return (seed + step) % SEEDS
