"""The miss bound of compressed finite differences (numerics/compressed.py's docstring), measured over the
weights themselves: the acceptance predicates run on synthetic quotients, a gradient h of twice atol left
out beside an entry, the gaps' rounding anywhere within the row's limit R_r = d atol, the weights drawn as
the check draws them (``group_moves.weights``). A miss is a pass of the predicate; each measured rate must
be within the stated chance, and the weightings' misses independent, so that a group's K weightings miss
with at most chance^K, which the check keeps at MISS / 2 per test."""
from __future__ import annotations

import math

import pytest
import torch

from gradcheck_cli.numerics import compressed
from gradcheck_cli.numerics.compressed import MISS, MOST, Groups, agree_chance, curved_chance, miss_chances, needed
from gradcheck_cli.numerics.group_moves import weights

ATOL = 1e-5
N = 200_000  # draws per measured rate


def _pairs(n: int, seed: int) -> tuple[torch.Tensor, torch.Tensor]:
    """The weights of an entry's column j and of another column k of its group, over n independent draws."""
    g = torch.Generator().manual_seed(seed)
    w = weights(2 * n, g)
    return w[:n], w[n:]


def _noise(n: int, limit: float, seed: int) -> torch.Tensor:
    g = torch.Generator().manual_seed(10**6 + seed)
    return (torch.rand(n, dtype=torch.float64, generator=g) * 2 - 1) * limit


def agree_misses(d: float, n: int, seed: int, h: float = 2 * ATOL) -> torch.Tensor:
    """Per draw, whether ``moves_agree`` passes one weighting's quotient at an entry with h left out beside it."""
    limit = d * ATOL
    wj, wk = _pairs(n, seed)
    entry = 0.7  # the derivative at the entry: it cancels in the gap
    unit = entry + h + _noise(n, limit / 2, seed)
    weighted = entry + (wk / wj) * h + _noise(n, limit / 2, seed + 1)
    return Groups.moves_agree(weighted, unit, torch.full((n,), limit, dtype=torch.float64))


def curved_misses(d: float, n: int, seed: int, h: float = 2 * ATOL, curvature: float = 50.0) -> torch.Tensor:
    """Per draw, whether ``on_curvature_line`` passes two curved weightings' gaps (a third-order term of
    ``curvature`` limits in the step's square, and h left out beside the entry)."""
    limit = d * ATOL
    (wj1, wk1), (wj2, wk2) = _pairs(n, seed), _pairs(n, seed + 1)
    a1, a2 = wj1 * wj1 - 1, wj2 * wj2 - 1
    gap1 = curvature * limit * a1 + (wk1 / wj1 - 1) * h + _noise(n, limit, seed + 2)
    gap2 = curvature * limit * a2 + (wk2 / wj2 - 1) * h + _noise(n, limit, seed + 3)
    return Groups.on_curvature_line([gap1, gap2], [a1, a2], torch.full((n,), limit, dtype=torch.float64))


def _upper(count: int, n: int) -> float:
    """A 5-sigma upper bound of a rate measured as count / n."""
    p = count / n
    return p + 5 * math.sqrt(max(p, 1 / n) * (1 - p) / n)


@pytest.mark.parametrize("d", [0.003, 0.01, 0.03, 0.1])
def test_one_weighting_misses_within_its_stated_chance(d: float) -> None:
    count = int(agree_misses(d, N, 0).sum())
    assert count > 0  # the rate is measured, not assumed
    assert count / N <= agree_chance(d), (count / N, agree_chance(d))


@pytest.mark.parametrize("d", [0.001, 0.003, 0.01])
def test_one_curved_weighting_misses_within_its_stated_chance(d: float) -> None:
    count = int(curved_misses(d, N, 0).sum())
    assert count > 0
    assert count / N <= curved_chance(d), (count / N, curved_chance(d))


def test_a_curved_entry_with_no_gradient_left_out_is_on_the_line() -> None:
    """The other side: the curvature test accepts what only the third-order term and rounding move."""
    assert bool(curved_misses(0.003, N, 0, h=0.0).all())


@pytest.mark.parametrize("d", [0.03, 0.1])
def test_the_weightings_miss_independently(d: float) -> None:
    """Two weightings miss together at the product of their rates: a group's K weightings miss at chance^K."""
    one, two = agree_misses(d, N, 0), agree_misses(d, N, 1)
    joint = int((one & two).sum())
    expected = float(one.double().mean()) * float(two.double().mean()) * N
    assert abs(joint - expected) <= 5 * math.sqrt(expected) + 1


@pytest.mark.parametrize("d", [1e-5, 1e-4, 1e-3, 0.0035, 0.01, 0.02, 0.05])
def test_each_group_takes_enough_weightings_for_the_bound(d: float) -> None:
    k, kc, bound = miss_chances(d)
    assert needed(agree_chance(d)) == k
    if k <= MOST:
        assert agree_chance(d) ** k <= MISS / 2 and (k == 1 or agree_chance(d) ** (k - 1) > MISS / 2)
    if kc <= MOST:
        assert curved_chance(d) ** (kc - 1) <= MISS / 2
    assert bound <= MISS or k > MOST


def test_a_group_beyond_MOST_weightings_is_in_doubt() -> None:
    """Where no MOST weightings reach the bound (a row's limit near atol), the group goes column by column."""
    assert needed(agree_chance(0.2)) > MOST
    assert needed(agree_chance(0.2)) == compressed.MOST + 1


@pytest.mark.slow
def test_no_miss_in_a_million_trials_at_the_weightings_the_check_takes() -> None:
    """10^6 trials (draws of all K weightings of a group at once) at the limits of real checks (d = R_r /
    atol: 0.0035 for a Linear layer's outputs of about 40, 0.02 for outputs of about 200): no miss, where
    a single weighting misses about 1% and 5% of the time."""
    for d in (0.0035, 0.02):
        k, _, bound = miss_chances(d)
        assert bound <= MISS
        missed = torch.ones(10**6, dtype=torch.bool)
        for m in range(k):
            missed &= agree_misses(d, 10**6, 100 * m)
        assert not bool(missed.any())
