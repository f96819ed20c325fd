"""Compressed finite differences: the numerical columns of a sparse Jacobian, a group at a time.

The analytical Jacobian's non-zero entries are known before the numerical side is made (the sparse
store, see ``rows.SparseRows``). Columns with no analytical row in common are put in one group
(``colouring``), and a group's elements are moved at once (``group_moves``): once by exactly +-eps each,
as an element-by-element check moves each on its own, and once more by +-eps w, a spread weighting: in
each group half the columns take magnitudes log-spaced on [1, 2] with sign +, the others with sign -, in a
random order (from the spec's seed), so that no two columns' weights are closer than ``separation`` of the
group's size (``plan`` cuts a group into pieces where needed, see the miss bound). Where a group would need
so many pieces that K independent random weightings (a magnitude uniform in [1.25, 2) and a random sign
per column) take fewer forwards, it takes those instead.

The rule. A group is accepted, its columns taken as the unit move's quotients at the analytical
entries, when all four predicates hold:

- ``within_tolerance``: every move's quotient at each entry (a weighted one over the element's weight)
  is within atol + rtol |n| of the analytical entry, as ``stats.ArgumentComparison`` compares;
- ``zero_elsewhere``: every move's quotient is exactly 0 in each row where the group has no entry;
- ``moves_agree``: at each entry (row r, column j), every weighted move's quotient equals the unit
  move's, both divided by the step the move really took (the arguments' rounding taken out), to within
  the row's rounding limit R_r = NOISE ulps of the row's own output scale over eps (the scale: |y_r|,
  at least the median |y| of its output tensor; per real component; inf where y_r is not finite);
- or, where they do not agree (a large third derivative moves them apart by the differences'
  third-order term, which grows with the square of the step), ``on_curvature_line``: K_c fresh
  random weightings, each within tolerance and zero elsewhere too, whose gaps to the unit move at each
  entry lie on one line in w^2 - 1, to within CURVED R_r (1 + a_c / a_1).

Any other group is halved (both halves judged by the same rule) down to LEAF columns, whose columns are
then made one by one; columns in doubt (below) go straight to their columns one by one. So every
mismatch, kink and reported element comes from element-by-element columns, with the same numbers.

The miss bound. Rows without an entry and entries whose value is wrong are judged exactly as element by
element (a unit move's quotient there is the element's own column's). What the columns of a group can
hide from each other is a gradient h that backward leaves out at (r, k) beside the entry of column j in
row r: it moves the unit quotient by h and a weighting's by (w_k / w_j) h. With |h| at least twice its
element-wise tolerance (so |h| >= 2 atol) and the gaps' rounding within R_r, ``moves_agree`` misses it
only if |w_k / w_j - 1| <= R_r / atol <= d, d the largest R_r / atol at the columns' entries. A SPREAD
piece holds at most ``widest``(d) columns, so every two of its columns are more than d apart: the miss
cannot happen, whatever the seed (columns with d >= separation(3) = 1/2, where no piece of three is
apart enough, go column by column: DOUBT). A RANDOM group misses it in one weighting with a chance of
at most p = 13 d / 6 (w_k, of density 2/3, must fall within d |w_j| of w_j; E|w_j| = 1.625) and takes
the smallest K with p^K <= MISS / 2 (at most MOST). Moves that disagree get a second chance on the
curvature line, which misses h in one weighting c > 1 with a chance of at most 13 e / 6,
e = (CURVED + 1)(1 + 3 / (1.25^2 - 1)) d / 2, and takes the smallest K_c with that chance^(K_c - 1) <=
MISS / 2 (none where it would take more than MOST). So a single wrong entry of at least twice its
tolerance is missed with a chance of at most MISS = 1e-9 per check (halving keeps the weights: its
pieces are as far apart, its events the same ones). The bound rests on R_r bounding the gaps' rounding;
a limit too small for a Function only rejects its groups (columns one by one, slower), never accepts a
wrong one. ``separation``, ``widest``, ``miss_chances`` compute it; tests/unit/test_compressed_bound.py
draws the weights and measures it.

The cost: 4 forwards per SPREAD piece (2 + 2K per RANDOM group, K of 2 to 6), 2 K_c more for a group
whose moves do not agree; a Linear layer's n x n weight, n x n input and bias take 2n + 1 pieces, an
elementwise function of G elements ceil(G / widest(d)). Pure torch and NumPy.
"""

from __future__ import annotations

import bisect
import math
from collections.abc import Iterator
from functools import partial

import numpy as np
import torch

from ..core.tolerance import within
from .batching import COL_STAGE, GROUP_STAGE_BYTES, Batches, copies, device_cap, same, stage_size, try_batched, vmapped
from .colouring import colour, member_arrays, members
from .columns import Columns
from .differences import call_moved
from .group_moves import LOW, GroupMove, separation, spread, step_factors, weights, widest
from .realify import outputs_vector, real_numel, real_view
from .rows import SparseRows
from .stats import ArgumentComparison
from .transfer import sent

PIECE = 2**16  # entries folded at once into the statistics (their temporaries stay in cache)
LEAF = 32  # a group not accepted of at most this many columns has them made one by one; a larger one is halved
NOISE = 5  # ulps of a row's output scale, over eps: how far the moves' step-corrected quotients may differ
CURVED = 3  # how far off one line the curved moves' gaps may be, in R_r (1 + a_c / a_1)
MISS = 1e-9  # the chance, per check, of missing one wrong entry of at least twice its tolerance
MOST = 8  # weightings at most, for either test; a group that would need more goes column by column
SPREAD, RANDOM, DOUBT = 0, 1, 2  # a group's weighting: one spread one, K independent random ones, or none


def agree_chance(d: float) -> float:
    """The chance that one weighting's ``moves_agree`` misses a left-out gradient h (|h| >= 2 atol) in a
    row whose limit is d atol: P(|w_k / w_j - 1| <= d) <= 2/3 * 2 d E|w_j| = 13 d / 6."""
    return min(1.0, 13 * d / 6)


def curved_chance(d: float) -> float:
    """The chance that one more curved weighting's ``on_curvature_line`` misses it: 13 e / 6 (see above)."""
    return min(1.0, 13 / 6 * (CURVED + 1) * (1 + 3 / (LOW * LOW - 1)) * d / 2)


def needed(chance: float, share: float = MISS / 2) -> int:
    """The fewest independent weightings whose joint chance chance^K is at most ``share`` (MOST + 1: too many)."""
    if chance <= 0:
        return 1
    if chance >= 1:
        return MOST + 1
    return min(MOST + 1, max(1, math.ceil(math.log(share) / math.log(chance) - 1e-12)))


def miss_chances(d: float) -> tuple[int, int, float]:
    """For a group whose largest limit is d atol: its weightings K, its curved weightings K_c (MOST + 1:
    none offered), and the bound on missing a single wrong entry of at least twice its tolerance."""
    k = needed(agree_chance(d))
    kc = needed(curved_chance(d)) + 1
    bound = agree_chance(d) ** k + (curved_chance(d) ** (kc - 1) if kc <= MOST else 0.0)
    return k, kc, bound


def row_limits(outputs: list[torch.Tensor], inputs: list[torch.Tensor], eps: float) -> torch.Tensor:
    """R_r per row (realified output element): NOISE ulps (the arguments' dtype, or the output's where
    coarser) of the row's scale, over eps. The scale is |y_r|, at least the median |y| of its output
    tensor (a row summed to near zero rounds like its neighbours); inf where y_r is not finite."""
    ulp_in = max((torch.finfo(x.dtype).eps for x in inputs), default=torch.finfo(torch.float64).eps)
    parts = []
    for o in outputs:
        y = real_view(o.detach()).reshape(-1).to("cpu", torch.float64).abs()
        ulp = max(ulp_in, torch.finfo(o.dtype).eps) if o.is_floating_point() or o.is_complex() else ulp_in
        floor = float(y.median()) if y.numel() else 0.0
        scale = y.clamp(min=floor if math.isfinite(floor) else 0.0)
        parts.append(torch.where(torch.isfinite(y), scale, math.inf) * (NOISE * ulp / eps))
    return torch.cat(parts) if parts else torch.zeros(0, dtype=torch.float64)


def plan(colours: torch.Tensor, n_groups: int, d: torch.Tensor) -> tuple[torch.Tensor, int, list[int]]:
    """Each group's weighting, from its columns' ``d`` (each column's largest R_r over atol). Columns with
    d >= separation(3) go column by column (DOUBT: no piece of more than two columns is apart enough, and two
    columns one by one take as many forwards as a group). The others, by d: cut into SPREAD pieces (one
    weighting, 4 forwards a piece), each of at most ``widest`` of its largest d, so that no two columns of a
    piece are closer than its d; or, where 2 + 2K forwards are fewer (K from ``needed``), one RANDOM group.
    Returns a group per column (the SPREAD pieces first, then the RANDOM groups, then those in doubt), their
    number, and each one's kind."""
    sizes = torch.bincount(colours, minlength=n_groups) if len(colours) else torch.zeros(n_groups, dtype=torch.long)
    if not len(colours) or widest(float(d.max())) >= max(3, int(sizes.max())):  # every group one piece
        return colours, n_groups, [SPREAD] * n_groups
    found: dict[int, list[np.ndarray]] = {SPREAD: [], RANDOM: [], DOUBT: []}
    dn = d.numpy()
    for cols in members(colours, n_groups):
        c = cols.numpy()
        c = c[np.argsort(dn[c], kind="stable")]
        ds = dn[c]
        t = int(np.searchsorted(ds, separation(3)))  # the columns from t on are in doubt
        if t < len(c):
            found[DOUBT].append(c[t:])
        pieces, i = [], 0
        while i < t:  # the longest run from i whose size is within the widest of its last (largest) d
            lo, hi = i, t - 1
            while lo < hi:
                mid = (lo + hi + 1) // 2
                lo, hi = (mid, hi) if mid - i + 1 <= widest(float(ds[mid])) else (lo, mid - 1)
            pieces.append(c[i : lo + 1])
            i = lo + 1
        k = needed(agree_chance(float(ds[t - 1]))) if t else MOST + 1
        if k <= MOST and 2 + 2 * k < 4 * len(pieces):
            found[RANDOM].append(c[:t])
        else:
            found[SPREAD] += pieces
    new = np.empty(len(colours), dtype=np.int64)
    kinds: list[int] = []
    for kind in (SPREAD, RANDOM, DOUBT):
        for group in found[kind]:
            new[group] = len(kinds)
            kinds.append(kind)
    return torch.from_numpy(new), len(kinds), kinds


class _At:
    """Where a stage's analytical entries are: store places (``entries``), columns (``col``), groups within the
    stage (``group``), places in a groups x rows array (``place``), values (``want``) and limits R_r. Made from
    the groups' structure on the host (no value read): only the entries' places and rows are handed to the
    device of the stage's quotients, the rest is made there (the values gathered where the store holds them)."""

    def __init__(self, groups: Groups, k0: int, k1: int, m: int) -> None:
        cols = np.concatenate(groups.members_np[k0:k1]) if k1 > k0 else np.zeros(0, dtype=np.int64)
        entries, counts = groups._entries_of(cols)
        self.n = k1 - k0
        mine = groups.colours_np[cols] - k0
        sizes = np.bincount(mine, weights=counts, minlength=self.n)  # each (group, row): one entry at most, so
        self.rows_left = bool((sizes < m).any())  # rows without one exist where a group has fewer: they must be zero
        at = torch.from_numpy(entries)
        put = partial(sent, device=groups.device)
        rows = put(groups.store.rows.index_select(0, at)).long()
        per_col, total = put(counts), len(entries)
        self.entries = put(at)
        self.group = torch.repeat_interleave(put(mine), per_col, output_size=total)
        self.col = torch.repeat_interleave(put(cols), per_col, output_size=total)
        self.place = self.group * m + rows
        vals = groups.store.vals  # where they were sorted, or on the host (a store built there)
        there = vals.device == groups.device
        self.want = vals.index_select(0, self.entries) if there else put(vals.index_select(0, at))
        self.limits = groups.limits_there.index_select(0, rows)

    def groups(self, failed: torch.Tensor) -> torch.Tensor:
        """Per group of the stage, whether an entry of it ``failed``."""
        return _groups(failed, self.group, self.n)


class Groups:
    """The groups of one check's numerical columns, each evaluated and accepted or not (see the module's rule);
    ``fold`` gives an ``ArgumentComparison`` the numerical columns of a span, from the groups or made one by one
    (``Folding``)."""

    def __init__(
        self,
        columns: Columns,
        store: SparseRows,
        atol: float,
        rtol: float,
        gen: torch.Generator,
        outputs: list[torch.Tensor],
    ) -> None:
        self.columns, self.store, self.layout = columns, store, columns.layout
        self.atol, self.rtol = atol, rtol
        found = colour(store, self.layout.n_rows)
        self.coloured = found is not None  # else too many column patterns to colour: not worthwhile
        self.colours, self.n_groups = found if found is not None else (torch.zeros(0, dtype=torch.long), 0)
        n = self.layout.n_cols
        # R_r at each entry, and each column's d (its largest R_r over atol): what its group's bound rests on
        self.row_limits = row_limits(outputs, self.layout.inputs, columns.eps)
        col_limit = _column_max(self.row_limits.index_select(0, store.rows), store.bounds, n)
        self.d = col_limit / atol if atol > 0 else torch.where(col_limit > 0, math.inf, 0.0)
        self.kinds: list[int] = []  # per group: SPREAD, RANDOM or DOUBT (see ``plan``)
        if self.coloured and n:
            self.colours, self.n_groups, self.kinds = plan(self.colours, self.n_groups, self.d)
        wanted = [needed(agree_chance(float(d))) for d, kind in zip(self._group_d(), self.kinds) if kind == RANDOM]
        self.k = max(wanted, default=0)  # random weightings, for the RANDOM groups
        self.spread = spread(self.colours, self.n_groups, gen) if self.coloured else torch.ones(n, dtype=torch.float64)
        self.weightings = [weights(n, gen) for _ in range(self.k)]
        self.curved_weightings = [weights(n, gen) for _ in range(MOST)]  # for groups whose moves do not agree
        self.colours_np = self.colours.numpy()  # the same memory: ``narrow`` renumbers in place
        self.starts_np = np.asarray(store.starts, dtype=np.int64)
        self.d_np = self.d.numpy()
        # the stages' quotients, verdicts and numerical entries stay on the arguments' device, and so do the
        # statistics folded from them; the structure (colours, members, where the entries are) is on the host
        self.device = self.layout.inputs[0].device if self.layout.inputs else torch.device("cpu")
        self.limits_there = sent(self.row_limits, self.device)  # looked up a stage at a time
        self.bounds_there = sent(store.bounds, self.device)  # the folds' spans, sliced there
        self._on_device: dict[int, torch.Tensor] = {}  # per weighting (its id), its copy on ``device``
        self.x0 = (
            torch.cat([real_view(x.detach()).reshape(-1).to("cpu", torch.float64) for x in self.layout.inputs])
            if self.layout.inputs
            else torch.zeros(0, dtype=torch.float64)
        )
        self.factors: dict[int, torch.Tensor] = {}  # per move (id of its weights; -1: unit), see ``_factor``
        self.batched: bool | None = None if columns.batched else False
        self.members: list[torch.Tensor] = []  # the columns of each group, once evaluated
        self.members_np: list[np.ndarray] = []  # the same, as NumPy arrays
        self.ok = torch.zeros(0, dtype=torch.bool)  # per group evaluated (``members``), whether it was accepted
        self._why = torch.zeros(0, dtype=torch.int8)  # per group evaluated: the first predicate it failed (``why``)
        self._reasons = [""]  # the predicates, by their number in ``_why`` (0: accepted)
        self._far: list[tuple[int, int, torch.Tensor]] = []  # stages with groups whose moves disagree (``_accepted``)
        self.numerical = torch.zeros(0, dtype=torch.float64)  # per analytical entry, once evaluated
        self._host_numerical: torch.Tensor | None = None  # the same on the host, once asked (``_numerical_on_host``)

    @property
    def why(self) -> list[str]:
        """Per group evaluated: the first predicate it failed ('' where accepted)."""
        return [self._reasons[c] for c in self._why.tolist()]

    def _dev(self, w: torch.Tensor) -> torch.Tensor:
        """Weighting ``w`` (made on the host, from the spec's seed) on ``device``, copied once."""
        if id(w) not in self._on_device:
            self._on_device[id(w)] = sent(w, self.device)
        return self._on_device[id(w)]

    def _group_d(self) -> list[float]:
        """Per group, its largest d (R_r over atol at its entries)."""
        group_d = torch.zeros(max(1, self.n_groups), dtype=torch.float64)
        if self.n_groups and len(self.colours):
            group_d.scatter_reduce_(0, self.colours, self.d, "amax")
        return group_d.tolist()[: self.n_groups]

    def moves(self, kind: int) -> list[torch.Tensor | None]:
        """The moves of a group of ``kind``: the unit move (None), then its weightings."""
        return [None, self.spread] if kind == SPREAD else [None, *self.weightings] if kind == RANDOM else []

    @property
    def forwards(self) -> int:
        """Forwards of ``evaluate``: two per group and move (a group in doubt: none, its columns two each after)."""
        sizes = torch.bincount(self.colours, minlength=self.n_groups).tolist() if self.n_groups else []
        return sum(2 * len(self.moves(kind)) or 2 * size for kind, size in zip(self.kinds, sizes))

    @property
    def accepted(self) -> torch.Tensor:
        """Per column, whether its latest group (after ``evaluate``, and ``narrow``) was accepted."""
        return self.ok[self.colours]

    def worthwhile(self) -> bool:
        """Coloured, and fewer forwards than two per column. Its memory is the store's (with the numerical
        value at each entry) and a few values per column; the groups' quotients are made a stage of groups at a
        time, within a stage's share of the budget (``_evaluate``), however many groups there are."""
        return self.coloured and self.forwards < 2 * self.layout.n_cols

    def evaluate(self) -> None:
        """Every group's forwards and its verdict: ``accepted`` per column, and ``numerical`` per
        analytical entry the unit moves' quotient there (the numerical Jacobian's entries where a group
        is accepted: its other entries are exactly zero)."""
        self.members_np = member_arrays(self.colours_np, self.n_groups)
        self.members = [torch.from_numpy(m) for m in self.members_np]
        self.numerical = torch.empty(len(self.store.vals), dtype=torch.float64, device=self.device)
        self.ok = sent(self.ok, self.device)
        self._why = sent(self._why, self.device)
        self._evaluate(0)

    def narrow(self) -> None:
        """Halve each group that was not accepted and has more than LEAF columns (not one in doubt: halving
        leaves its rows' limits as they are), evaluate the halves as groups (the same forwards, weights and
        rule: a subset of a group is a group, its weights as far apart), and again for the halves not
        accepted: a wrong gradient in a few elements of a large group leaves only those elements' columns to
        be made one by one, not the whole group's. Where most elements are wrong, about a sixth more forwards
        than the columns one by one."""
        first = 0
        while True:
            ok = self.ok[first:].tolist()  # one read a round, of every group's verdict
            failed = [
                k
                for k in range(first, len(self.members))
                if not ok[k - first] and self.kinds[k] != DOUBT and len(self.members[k]) > LEAF
            ]
            if not failed:
                self._verdicts_to_host()
                return
            first = len(self.members)
            for k in sorted(failed, key=lambda k: self.kinds[k]):  # one kind after the other: fewer stages
                cols = self.members_np[k]
                for half in (cols[: len(cols) // 2], cols[len(cols) // 2 :]):
                    self.colours_np[half] = len(self.members)  # the same memory as ``colours``
                    self.members.append(torch.from_numpy(half))
                    self.members_np.append(half)
                    self.kinds.append(self.kinds[k])
            self._evaluate(first)

    def _verdicts_to_host(self) -> None:
        """The groups' verdicts, once evaluated, to the host, where the folds' structure reads them (the
        numerical entries stay where they were made: the statistics are folded there)."""
        self.ok = self.ok.cpu()

    def _evaluate(self, first: int) -> None:
        """Groups ``first``.. of ``members``, a stage of groups at a time: their verdicts into ``ok``."""
        g, m = len(self.members), self.layout.n_rows
        ok = torch.zeros(g - first, dtype=torch.bool, device=self.device)
        row_bytes = 16 * (sum(real_numel(x) for x in self.layout.inputs) + 2 * m)
        size = stage_size(COL_STAGE, row_bytes, self.columns.memory_bytes, device_cap(GROUP_STAGE_BYTES, self.device))
        doubt = self._reason("in doubt: no weighting reaches its bound")
        codes = [doubt if self.kinds[k] == DOUBT else 0 for k in range(first, g)]
        self._why = torch.cat([self._why[:first], sent(codes, self.device, torch.int8)])
        k0 = first
        with torch.no_grad():
            while k0 < g:  # a run of groups of one kind at a time (not evaluated: the groups in doubt)
                end = next((k for k in range(k0, g) if self.kinds[k] != self.kinds[k0]), g)
                moves = self.moves(self.kinds[k0])
                step = max(1, size // max(1, len(moves)))
                for s0 in range(k0, end, step) if moves else []:
                    s1 = min(end, s0 + step)
                    ok[s0 - first : s1 - first] = self._accepted(s0, s1, moves, self._stage(s0, s1, moves))
                k0 = end
            self.ok = torch.cat([self.ok[:first], ok])
            self._settle_far()

    def _settle_far(self) -> None:
        """The groups whose moves did not agree (``_accepted``), all stages' at once: one read says which groups
        they are, and those groups are accepted where their curved weightings hold (``_curved``)."""
        fars, self._far = self._far, []
        if not fars:
            return
        read = torch.cat([far for _, _, far in fars]).tolist()  # every stage's, in order
        first = 0
        for k0, k1, far in fars:
            is_far, first = read[first : first + k1 - k0], first + k1 - k0
            if any(is_far):
                at = _At(self, k0, k1, self.layout.n_rows)
                base = self.numerical.index_select(0, at.entries) * self._factor(None).index_select(0, at.col)
                self.ok[k0:k1] |= self._curved(k0, k1, far, is_far, at, base)

    def _reason(self, why: str) -> int:
        """The number of predicate ``why`` in ``_why``."""
        if why not in self._reasons:
            self._reasons.append(why)
        return self._reasons.index(why)

    def _factor(self, w: torch.Tensor | None) -> torch.Tensor:
        """Per column, 2 eps over the step that move ``w`` (None: the unit move) really takes (``step_factors``)."""
        key = -1 if w is None else id(w)
        if key not in self.factors:
            starts = self.layout.col_starts
            made = torch.cat(
                [
                    step_factors(
                        self.x0[starts[i] : starts[i + 1]],
                        real_view(x.detach()).dtype,
                        self.columns.eps,
                        None if w is None else w[starts[i] : starts[i + 1]],
                    )
                    for i, x in enumerate(self.layout.inputs)
                ]
            )
            self.factors[key] = sent(made, self.device)
        return self.factors[key]

    def _accepted(self, k0: int, k1: int, moves: list[torch.Tensor | None], quotients: torch.Tensor) -> torch.Tensor:
        """Whether each of groups k0..k1 holds the module's rule, given its ``moves``' quotients (moves x groups x
        rows: the unit move, then each weighting); their entries' unit quotients into ``numerical``, and the
        first predicate each rejected group failed into ``why``."""
        n = k1 - k0
        at = _At(self, k0, k1, quotients.shape[2])
        got = quotients[0].reshape(-1).index_select(0, at.place)
        self.numerical.index_copy_(0, at.entries, got)
        base = got * self._factor(None).index_select(0, at.col)  # the unit move over its real step
        scaled: list[torch.Tensor] = [got]
        apart = torch.zeros(len(got), dtype=torch.bool, device=got.device)
        for move, w in zip(quotients[1:], moves[1:]):
            assert w is not None  # the unit move is the first alone
            moved = move.reshape(-1).index_select(0, at.place)
            scaled.append(moved / self._dev(w).index_select(0, at.col))
            apart |= ~self.moves_agree(moved * self._factor(w).index_select(0, at.col), base, at.limits)
        verdicts = [("not within the tolerance", at.groups(~self.within_tolerance(at.want, scaled)))]
        if at.rows_left:
            verdicts.append(("not zero elsewhere", self.zero_elsewhere(quotients, at, scaled)))
        bad = torch.zeros(n, dtype=torch.bool, device=got.device)
        for why, failed in verdicts:
            self._tell(k0, failed & ~bad, why)
            bad |= failed
        # a gradient left out beside an entry, or a curvature, moves them apart: such groups are taken where their
        # curved weightings hold, for every stage at once after the last (``_settle_far``)
        far = at.groups(apart) & ~bad
        self._far.append((k0, k1, far))
        return ~bad & ~far

    def _tell(self, k0: int, failed: torch.Tensor, why: str) -> None:
        """Each group of ``failed`` (from k0 on) rejected for ``why``, where it had no reason yet."""
        mine = self._why[k0 : k0 + len(failed)]
        mine.masked_fill_(failed & (mine == 0), self._reason(why))

    def within_tolerance(self, want: torch.Tensor, scaled: list[torch.Tensor]) -> torch.Tensor:
        """Per entry, whether every move's quotient (over the element's weight) is within atol + rtol |n| of
        the analytical entry ``want``, as ``stats.ArgumentComparison`` compares (NaN is within nothing)."""
        ok = torch.ones(len(want), dtype=torch.bool, device=want.device)
        for q in scaled:
            ok &= within(want, q, self.atol, self.rtol)
        return ok

    @staticmethod
    def zero_elsewhere(quotients: torch.Tensor, at: _At, scaled: list[torch.Tensor]) -> torch.Tensor:
        """Per group, whether some move is not exactly zero in a row where the group has no analytical entry
        (its non-zero rows counted, less those at its entries)."""
        bad = torch.zeros(at.n, dtype=torch.bool, device=at.group.device)
        for moved, at_entries in zip(quotients, scaled):
            at_rows = torch.zeros(at.n, dtype=torch.long, device=bad.device)
            bad |= (moved != 0).sum(1) != at_rows.index_add_(0, at.group, (at_entries != 0).long())
        return bad

    @staticmethod
    def moves_agree(corrected: torch.Tensor, base: torch.Tensor, limits: torch.Tensor) -> torch.Tensor:
        """Per entry, whether a weighting's quotient over its real step equals the unit move's to within the
        row's rounding limit R_r: a gradient h left out beside the entry puts them (w_k / w_j - 1) h apart."""
        return torch.sub(corrected, base).abs_() <= limits

    @staticmethod
    def on_curvature_line(gaps: list[torch.Tensor], a: list[torch.Tensor], limits: torch.Tensor) -> torch.Tensor:
        """Per entry, whether the curved weightings' gaps to the unit move (over their real steps) lie on one
        line through 0 in a = w_j^2 - 1, as the differences' third-order term puts them (the third derivative
        times eps^2 a / 6), to within CURVED R_r (1 + a_c / a_1) each, the first weighting's gap fixing the
        line: a gradient h left out beside the entry adds (w_k / w_j - 1) h instead, off that line."""
        ok = torch.ones(len(limits), dtype=torch.bool, device=limits.device)
        for gap, ac in zip(gaps[1:], a[1:]):
            ratio = ac / a[0]
            ok &= torch.sub(gap, gaps[0] * ratio).abs_() <= (ratio + 1) * limits * CURVED
        return ok

    def _curved(
        self, k0: int, k1: int, far: torch.Tensor, is_far: list[bool], at: _At, base: torch.Tensor
    ) -> torch.Tensor:
        """Per group of a stage whose moves do not agree at some entry (``far``; ``is_far``: the same, read),
        whether K_c curved weightings (fresh: independent of those that were apart) are within the tolerance,
        zero elsewhere and on the curvature line at every entry. None is offered where its bound needs more
        than MOST."""
        kc = [
            needed(curved_chance(float(self.d_np[self.members_np[k0 + k]].max()))) + 1 if one else 0
            for k, one in enumerate(is_far)
        ]
        offered = sent([0 < c <= MOST for c in kc], far.device, torch.bool)
        self._tell(k0, far & ~offered, "its moves disagree (its curvature bound needs more weightings than MOST)")
        if not any(0 < c <= MOST for c in kc):
            return offered
        moves = self.curved_weightings[: max(c for c in kc if c <= MOST)]
        quotients = self._stage(k0, k1, list(moves))
        gaps, a, scaled = [], [], []
        for move, w in zip(quotients, moves):
            moved = move.reshape(-1).index_select(0, at.place)
            wj = self._dev(w).index_select(0, at.col)
            scaled.append(moved / wj)
            gaps.append(moved * self._factor(w).index_select(0, at.col) - base)
            a.append(wj * wj - 1)
        checks = [
            ("its curved moves are not within the tolerance", at.groups(~self.within_tolerance(at.want, scaled))),
            ("its moves disagree, off the curvature line", at.groups(~self.on_curvature_line(gaps, a, at.limits))),
        ]
        if at.rows_left:
            checks.append(("its curved moves are not zero elsewhere", self.zero_elsewhere(quotients, at, scaled)))
        good = far & offered
        for why, failed in checks:
            self._tell(k0, failed & good, why)
            good &= ~failed
        return good

    def _entries_of(self, cols: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """The places in the store of the entries of columns ``cols``, column by column, and each column's
        number of entries (from the host's copy of where each column's entries start)."""
        starts = self.starts_np[cols]
        counts = self.starts_np[cols + 1] - starts
        offset = np.repeat(starts - (np.cumsum(counts) - counts), counts)
        return np.arange(len(offset)) + offset, counts

    def fold(self, entry: ArgumentComparison, lo: int, hi: int, probe: torch.Tensor, chunk: int) -> None:
        """Columns lo..hi (one argument's) into ``entry``, from the groups or made one by one (see ``Folding``)."""
        Folding(self).fold(entry, lo, hi, probe, chunk)

    def _numerical_on_host(self, p: int, q: int) -> torch.Tensor:
        """The numerical entries of columns p..q on the host, for the folds made there (entries not finite, a
        failing argument's per-column errors, columns made one by one): all of them copied there once."""
        if self._host_numerical is None:
            on_host = self.numerical.device.type == "cpu"  # (no .cpu() call there: a count of copies sees none)
            self._host_numerical = self.numerical if on_host else self.numerical.cpu()
        return self._host_numerical[self.store.starts[p] : self.store.starts[q]]

    def _stage(self, k0: int, k1: int, moves: list[torch.Tensor | None]) -> torch.Tensor:
        """Groups k0..k1's quotients (moves x groups x rows) for each of ``moves`` (None: every element by
        eps; else by eps times its weight there): batched, or two single calls per group and move."""
        got, self.batched = try_batched(
            self.batched, partial(self._batched, k0, k1, moves), partial(self._groups_agree, k0, moves)
        )
        if got is not None:
            return got
        return torch.stack([torch.stack([self._single(k, weights) for k in range(k0, k1)]) for weights in moves])

    def _groups_agree(self, k0: int, moves: list[torch.Tensor | None], got: torch.Tensor) -> bool:
        """A batched stage's quotients are single calls' quotients: compared on its first group."""
        single = torch.stack([self._single(k0, weights) for weights in moves])
        return same(got[:, 0], single)

    def _parts(self, k: int, weights: torch.Tensor | None) -> list[tuple[torch.Tensor, torch.Tensor, torch.Tensor]]:
        """(argument, real indices, weights: ones for None) of group ``k``'s elements, argument by argument."""
        cols = self.members_np[k]
        starts = self.layout.col_starts
        parts = []
        for i, x in enumerate(self.layout.inputs):
            mine = cols[(cols >= starts[i]) & (cols < starts[i + 1])]
            if len(mine):
                at = sent(mine, x.device)
                if weights is None:
                    w = torch.ones(len(mine), dtype=torch.float64, device=x.device)
                else:
                    w = self._dev(weights)[at]
                parts.append((x, at - starts[i], w))
        return parts

    def _single(self, k: int, weights: torch.Tensor | None) -> torch.Tensor:
        """Group ``k``'s difference quotient from two single calls; NaN where a call raises (the weighted
        move goes up to 2 eps: past a domain edge that a column's own move of eps does not reach), so
        that the group is not accepted and its columns are made one by one, where a forward that
        fails there too fails the check as without compression."""
        move = GroupMove(self._parts(k, weights))
        read = lambda outs: outputs_vector(outs, self.layout.outputs)  # noqa: E731
        try:
            minus = call_moved(self.columns.call, self.columns.values, move.to(-self.columns.eps), read)
            plus = call_moved(self.columns.call, self.columns.values, move.to(self.columns.eps), read)
        except Exception:  # noqa: BLE001 - any failure of a group's call: its columns one by one
            return torch.full((self.layout.n_rows,), math.nan, dtype=torch.float64, device=self.device)
        return (plus - minus) / (2 * self.columns.eps)

    def _batched(self, k0: int, k1: int, moves: list[torch.Tensor | None]) -> torch.Tensor:
        """Groups k0..k1's quotients (moves x groups x rows) from one vmapped forward: batch row
        2 M (k - k0) + 2 m + plus moves group k by move m (M moves)."""
        per = 2 * len(moves)
        n, eps = per * (k1 - k0), self.columns.eps
        batches: Batches = {}
        cols = np.concatenate(self.members_np[k0:k1])  # where each element goes: the host's structure
        base = per * (self.colours_np[cols] - k0)
        starts = self.layout.col_starts
        for i, x in enumerate(self.layout.inputs):
            mine = (cols >= starts[i]) & (cols < starts[i + 1])
            if mine.any():
                put = partial(sent, device=x.device)
                index, row, at = put(cols[mine] - starts[i]), put(base[mine]), put(cols[mine])
                batch = copies(batches, x, n)
                x0 = batch[0, index].to(torch.float64)  # every batch row is a copy of the argument
                for m, weights in enumerate(moves):
                    step = eps if weights is None else eps * self._dev(weights)[at]
                    batch[row + 2 * m, index] = (x0 - step).to(batch.dtype)
                    batch[row + 2 * m + 1, index] = (x0 + step).to(batch.dtype)
        assert self.columns.batched is not None  # self.batched is False without it
        flat = vmapped(self.columns.batched, self.columns.values, batches, self.layout.outputs)  # float64, there
        quotients = torch.empty(len(moves), k1 - k0, flat.shape[1], dtype=torch.float64, device=flat.device)
        for m in range(len(moves)):
            torch.sub(flat[2 * m + 1 :: per], flat[2 * m :: per], out=quotients[m]).div_(2 * eps)
        return quotients


class Folding:
    """The groups' results folded into an argument's statistics (``stats.ArgumentComparison``), as the element-by-
    element check folds its columns. The rule: columns lo..hi go in in column order, a chunk of ``chunk`` columns at
    a time (the chunks of the check without compression, whose sums start anew at each). A run of chunks whose
    columns were all accepted goes in as their analytical entries and the unit moves' quotients there alone (every
    other entry is exactly zero on both sides: ``zero_elsewhere``), in pieces of whole chunks of about PIECE
    entries, by ``ArgumentComparison.fold_agreed`` (every entry agrees: ``within_tolerance``), its per-column errors
    and projections deferred (``ArgumentComparison.defer``) and, where an entry is not finite, the piece folded
    instead by ``ArgumentComparison.update_entries``. A chunk with a column not accepted goes in whole by
    ``ArgumentComparison.update_sparse`` once the pieces before it are flushed, the accepted columns from the
    quotients and the others made one by one (``Columns.columns``). The statistics are folded where the store's
    values are: on the device with the numerical entries, or on the host (a store built there) with one host copy of
    them."""

    def __init__(self, groups: Groups) -> None:
        self.groups = groups
        self.store, self.layout = groups.store, groups.layout

    def fold(self, entry: ArgumentComparison, lo: int, hi: int, probe: torch.Tensor, chunk: int) -> None:
        """Columns lo..hi (one argument's) into ``entry``, by the class's rule."""
        groups = self.groups
        groups._verdicts_to_host()
        held = self.store.vals.device
        there = held == groups.numerical.device  # else a store built on the host: folded there
        bad = (~groups.accepted[lo:hi]).nonzero().view(-1).add_(lo).floor_divide_(chunk).unique().tolist()
        c0 = lo
        for k in [*bad, None]:
            end = hi if k is None else max(lo, k * chunk)
            for p, q in self._pieces(c0, end, chunk):  # accepted, as their entries alone: all agree
                first, last = self.store.starts[p], self.store.starts[q]
                at = slice((p // chunk + 1) * chunk, q, chunk)
                spans = self.store.bounds[at] - first
                entry.fold_agreed(
                    self.store.vals[first:last],
                    groups.numerical[first:last] if there else groups._numerical_on_host(p, q),
                    (q - p, self.layout.n_rows),
                    p - lo,
                    partial(self._place, p),
                    partial(self._not_finite, p, q, p - lo, probe, spans),
                    spans=spans,
                    spans_there=groups.bounds_there[at] - first if held.type != "cpu" else None,
                )
                entry.defer(partial(self._extras, p, q, p - lo, probe))
            if k is not None:
                c0 = min(hi, (k + 1) * chunk)
                entry.flush()  # the blocks before it first, in order
                self._fold_made(entry, max(lo, k * chunk), c0, lo, probe)
        entry.flush()

    def _not_finite(
        self, p: int, q: int, col0: int, probe: torch.Tensor, spans: torch.Tensor, entry: ArgumentComparison
    ) -> None:
        """Columns p..q, accepted, folded with their entries where one is not finite (see
        ``ArgumentComparison.fold_agreed``), on the host."""
        c, r, v = self.store.entries(p, q)
        n = self.groups._numerical_on_host(p, q)
        entry.update_entries(c, r, v, n, (q - p, self.layout.n_rows), col0, probe, spans=spans, extras=False)

    def _place(self, p: int, k: int) -> tuple[int, int]:
        """ArgumentComparison k of the columns from p on: its column (less p) and its row."""
        at = self.store.starts[p] + k
        return bisect.bisect_right(self.store.starts, at) - 1 - p, int(self.store.rows[at])

    def _extras(self, p: int, q: int, col0: int, probe: torch.Tensor, entry: ArgumentComparison) -> None:
        """The per-column errors and the probe's projections of columns p..q, folded without them (the
        columns and rows read from the store again rather than kept: 16 bytes an entry)."""
        c, r, v = self.store.entries(p, q)
        entry.add_extras(c, r, v, self.groups._numerical_on_host(p, q), q - p, col0, probe)

    def _pieces(self, c0: int, end: int, chunk: int) -> Iterator[tuple[int, int]]:
        """Columns c0..end in pieces of whole chunks holding about PIECE entries at most (one chunk at least):
        the statistics' temporaries are a dozen copies of a piece."""
        starts = self.store.starts
        while c0 < end:
            most = bisect.bisect_right(starts, starts[c0] + PIECE, c0, end + 1) - 1  # columns c0..most fit
            q = min(end, max((most // chunk) * chunk, (c0 // chunk + 1) * chunk))
            yield c0, q
            c0 = q

    def _fold_made(self, entry: ArgumentComparison, lo: int, hi: int, first: int, probe: torch.Tensor) -> None:
        """Columns lo..hi into ``entry`` (the argument's columns start at ``first``), those of the groups
        not accepted made one by one."""
        c, r, v = self.store.entries(lo, hi)
        ok = self.groups.accepted[lo:hi]
        n = torch.zeros(hi - lo, self.layout.n_rows, dtype=torch.float64)
        mine = ok[c]
        n[c[mine], r[mine]] = self.groups._numerical_on_host(lo, hi)[mine]
        for j0, j1 in _runs((~ok).nonzero().view(-1).tolist()):
            n[j0:j1] = self.groups.columns.columns(lo + j0, lo + j1)
        entry.update_sparse(c, r, v, n, lo - first, probe)


def _column_max(values: torch.Tensor, bounds: torch.Tensor, n: int) -> torch.Tensor:
    """Per column (its entries ``bounds[j]``..``bounds[j + 1]`` of ``values``, in column order), their largest; 0
    for a column without entries."""
    counts = torch.diff(bounds).numpy()
    out = np.zeros(n, dtype=np.float64)
    full = counts > 0
    if bool(full.any()):  # each non-empty column's run ends where the next non-empty one starts
        out[full] = np.maximum.reduceat(values.numpy(), bounds[:-1].numpy()[full])
    return torch.from_numpy(out)


def _groups(failed: torch.Tensor, group: torch.Tensor, n: int) -> torch.Tensor:
    """Per group of a stage (``n`` of them), whether an entry of it (entries' groups: ``group``) ``failed``."""
    return torch.zeros(n, dtype=torch.int32, device=failed.device).index_add_(0, group, failed.to(torch.int32)) > 0


def _runs(cols: list[int]) -> list[tuple[int, int]]:
    """Sorted column numbers as runs (first, end) of consecutive ones."""
    runs: list[tuple[int, int]] = []
    for j in cols:
        if runs and runs[-1][1] == j:
            runs[-1] = (runs[-1][0], j + 1)
        else:
            runs.append((j, j + 1))
    return runs
