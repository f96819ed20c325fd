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
from gradcheck_cli.numerics.compressed import (
    DOUBT,
    MISS,
    MOST,
    RANDOM,
    SPREAD,
    Groups,
    agree_chance,
    curved_chance,
    miss_chances,
    needed,
    plan,
)
from gradcheck_cli.numerics.group_moves import SPAN, separation, spread, weights, widest

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


# ------------------------------------------------ spread weightings: no two columns of a piece within d


def _spread_pairs(size: int, n: int, seed: int) -> tuple[torch.Tensor, torch.Tensor]:
    """The weights of two distinct columns j and k of one group of ``size`` under a spread weighting, over n
    trials: a group drawn as the check draws it every 1,000 trials, a random pair of its columns each trial."""
    g = torch.Generator().manual_seed(seed)
    wj, wk = [], []
    for done in range(0, n, 1000):
        m = min(1000, n - done)
        w = spread(torch.zeros(size, dtype=torch.long), 1, g)
        j = torch.randint(0, size, (m,), generator=g)
        k = (j + torch.randint(1, size, (m,), generator=g)) % size  # another column of the group
        wj.append(w[j])
        wk.append(w[k])
    return torch.cat(wj), torch.cat(wk)


def spread_misses(d: float, size: int, n: int, seed: int, h: float = 2 * ATOL) -> torch.Tensor:
    """Per trial, whether ``moves_agree`` passes a spread weighting's quotient at an entry with h (random sign)
    left out beside it, the two moves' rounding at its worst: each R_r / 2, against the gap."""
    limit = d * ATOL
    wj, wk = _spread_pairs(size, n, seed)
    sign = torch.randint(0, 2, (n,), generator=torch.Generator().manual_seed(seed + 7), dtype=torch.float64) * 2 - 1
    gap = (wk / wj - 1) * h * sign
    worst = -torch.sign(gap) * limit / 2  # the rounding that shrinks the gap the most
    entry = 0.7
    unit = entry + h * sign - worst
    weighted = entry + (wk / wj) * h * sign + worst
    return Groups.moves_agree(weighted, unit, torch.full((n,), limit, dtype=torch.float64))


@pytest.mark.parametrize("size", [1, 2, 3, 4, 5, 17, 64, 129, 1000])
def test_a_spread_weighting_keeps_every_two_columns_of_a_group_apart(size: int) -> None:
    """Every pair of a group (all of them, over 20 draws): |w_k / w_j - 1| >= separation(size), magnitudes in
    [1, SPAN], ceil(size / 2) of sign +."""
    for seed in range(20):
        w = spread(torch.zeros(size, dtype=torch.long), 1, torch.Generator().manual_seed(seed))
        assert bool((w.abs() >= 1).all()) and bool((w.abs() <= SPAN).all())
        assert int((w > 0).sum()) == (size + 1) // 2
        ratio = (w.unsqueeze(0) / w.unsqueeze(1) - 1).abs()
        ratio.fill_diagonal_(math.inf)
        assert float(ratio.min()) >= separation(size) * (1 - 1e-12)
        if size >= 5:  # the bound is met: some pair is at it
            assert float(ratio.min()) <= separation(size) * (1 + 1e-12)


def test_spread_weightings_of_several_groups_are_each_apart() -> None:
    """Groups of different sizes in one weighting, their columns interleaved: each group keeps its separation."""
    colours = torch.randint(0, 6, (600,), generator=torch.Generator().manual_seed(3))
    w = spread(colours, 6, torch.Generator().manual_seed(4))
    for c in range(6):
        mine = w[colours == c]
        ratio = (mine.unsqueeze(0) / mine.unsqueeze(1) - 1).abs()
        ratio.fill_diagonal_(math.inf)
        assert float(ratio.min()) >= separation(len(mine)) * (1 - 1e-12)


@pytest.mark.parametrize("d", [0.0, 1e-5, 1e-4, 0.0035, 0.02, 0.1, 0.3, 0.49, 0.5, 1.0, 1.6, math.inf, math.nan])
def test_widest_is_the_largest_group_whose_columns_are_apart_by_more_than_d(d: float) -> None:
    wide = widest(d)
    assert separation(wide) > d or wide in (1, 2**62)  # 2^62: any size (d <= 0)
    if wide < 2**62:
        assert not separation(wide + 1) > d


@pytest.mark.parametrize("d", [0.0035, 0.02, 0.1])
def test_a_spread_weighting_misses_nothing_at_its_widest_group_and_misses_wider(d: float) -> None:
    """At the widest group the check cuts for d, the worst rounding never hides h = 2 atol (this is the bound,
    deterministic: no chance at all); at a group twice as wide, some pairs are closer than d and are missed:
    the trial can fail."""
    wide = widest(d)
    assert not bool(spread_misses(d, wide, N, 0).any())
    assert bool(spread_misses(d, 2 * wide, N, 0).any())


def test_plan_cuts_each_group_to_its_widest_or_takes_random_weightings_where_fewer_forwards() -> None:
    """A group of G columns and limits d: SPREAD pieces, each of at most widest(its largest d), where 4 forwards a
    piece are fewer than 2 + 2K; else RANDOM; the columns with d >= 0.5 in DOUBT (one large output beside small
    ones: that column alone)."""
    outlier = torch.full((100,), 3e-4, dtype=torch.float64)
    outlier[37] = 1100.0
    cases = [
        (torch.full((4096,), 4e-4, dtype=torch.float64), [SPREAD, SPREAD]),
        (torch.full((64,), 0.0035, dtype=torch.float64), [SPREAD]),
        (torch.full((100_000,), 1e-3, dtype=torch.float64), [RANDOM]),
        (torch.linspace(0, 0.1, 300, dtype=torch.float64), [SPREAD] * 12),  # pieces of 14 at d = 0.1
        (torch.full((10,), 0.6, dtype=torch.float64), [DOUBT]),
        (outlier, [SPREAD, DOUBT]),
    ]
    colours = torch.cat([torch.full((len(dg),), c) for c, (dg, _) in enumerate(cases)])
    d = torch.cat([dg for dg, _ in cases])
    new, n_groups, kinds = plan(colours, len(cases), d)
    assert sorted(kinds) == kinds  # the SPREAD pieces first, then RANDOM, then DOUBT
    assert n_groups == len(kinds) == sum(len(k) for _, k in cases)
    for c, (_, want) in enumerate(cases):
        mine = new[colours == c].unique()
        assert sorted(kinds[int(g)] for g in mine) == want
        for g in mine.tolist():
            if kinds[g] == SPREAD:
                assert int((new == g).sum()) <= widest(float(d[new == g].max()))
            if kinds[g] == DOUBT:
                assert float(d[new == g].min()) >= 0.5
    assert int(new[colours == 5][37]) != int(new[colours == 5][0])


def test_a_linear_layers_groups_take_one_spread_weighting_each(monkeypatch: pytest.MonkeyPatch) -> None:
    """The speed the spread buys: a 32 x 32 Linear layer's 65 column groups take 4 forwards each (the unit move
    and one weighting), where independent random weightings took 2 + 2K (K = 4 here), and it still passes."""
    from gradcheck_cli import check
    from gradcheck_cli.examples.linear import LinearFunction

    staged: list[int] = []
    stage = Groups._stage
    monkeypatch.setattr(
        Groups,
        "_stage",
        lambda self, k0, k1, moves: staged.append(2 * len(moves) * (k1 - k0)) or stage(self, k0, k1, moves),
    )
    g = torch.Generator().manual_seed(0)
    args = [torch.randn(*s, dtype=torch.float64, generator=g).requires_grad_() for s in ((32, 32), (32, 32), (32,))]
    assert check(LinearFunction, args).status.value == "pass"
    assert sum(staged) == 4 * 65


@pytest.mark.slow
@pytest.mark.parametrize("d", [0.0035, 0.02, 0.1])
def test_no_miss_in_a_million_trials_of_a_spread_weighting(d: float) -> None:
    """10^6 trials at the widest group for d, and 10^6 at a Linear layer's 64 columns (where d allows),
    the rounding at its worst: no miss."""
    assert not bool(spread_misses(d, widest(d), 10**6, 1).any())
    if widest(d) >= 64:
        assert not bool(spread_misses(d, 64, 10**6, 2).any())
