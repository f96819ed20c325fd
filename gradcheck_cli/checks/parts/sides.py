"""Two computations of the same values, compared elementwise: one side's outputs and gradients (one
forward, one backward for a shared grad_output) against the other's, by rule ``relative`` or
``allclose`` (see ``spec.ReferenceRule``), into a row with its error, baseline and pattern. The
reference check compares the target with a reference implementation, the compile check compiled
code with eager."""

from __future__ import annotations

import math
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field
from typing import Any, Optional

import torch

from ...core.tolerance import ReferenceRule, by_dtype, limit
from ...numerics import as_tuple, is_float_tensor, unravel, vjp
from ...numerics.maps import blocks, per_element, pooled, view_2d
from ...results import ErrorKind, ErrorMap, InputReport, Pattern, Status
from ...sandbox.errors import UserCodeError, guarded
from ...subject.binding import Bound
from ...subject.target import Target
from .argument_rows import INDEX_CAP, MAP_CELLS, dtype_name
from .base import call_forward, fresh_leaves
from .diagnosis import Diagnosis, ratio_text


@dataclass
class Side:
    """One side's outputs, its leaves of the checked arguments, and their gradients."""

    outputs: tuple[Any, ...]
    leaves: list[torch.Tensor]
    grads: list[torch.Tensor] = field(default_factory=list)


def side(
    fn: Target,
    bound: Bound,
    values: Sequence[Any],
    checked: list[int],
    what: str,
    kind: ErrorKind = ErrorKind.FORWARD,
    copied: bool = False,
    eight_bit: bool = False,
) -> Side:
    """``fn``'s outputs on fresh leaves of ``values`` (gradients to come); its errors are of ``kind``.
    ``copied``: ``values`` are fresh leaves already, made for this side (no second copy); ``eight_bit``:
    8-bit float outputs are compared as they are (``call_forward``)."""
    leaves = list(values) if copied else fresh_leaves(list(values))
    outputs = as_tuple(call_forward(fn, bound, leaves, kind, what=what, eight_bit=eight_bit))
    return Side(outputs, [leaves[i] for i in checked])


def gradients(
    side: Side, probes: dict[int, torch.Tensor], what: str, kind: ErrorKind = ErrorKind.BACKWARD
) -> list[torch.Tensor]:
    """The checked arguments' gradients for grad_outputs ``probes`` (output position -> probe),
    zeros where unused; errors of backward are of ``kind``."""
    live = [
        (side.outputs[p], g.to(side.outputs[p].dtype))
        for p, g in probes.items()
        if is_float_tensor(side.outputs[p]) and side.outputs[p].requires_grad
    ]
    if not live or not side.leaves:
        return [torch.zeros_like(x) for x in side.leaves]
    grads = guarded(kind, what, vjp, [o for o, _ in live], side.leaves, [g for _, g in live])
    return [torch.zeros_like(x) if g is None else g for g, x in zip(grads, side.leaves)]


def eps(dtype: torch.dtype) -> float:
    return torch.finfo(dtype).eps


CHUNK = 1 << 22  # reals compared at once: the float64 temporaries are of a chunk, not of a whole tensor


def compare(
    row: InputReport, got: torch.Tensor, want: torch.Tensor, own: Optional[torch.Tensor], rule: ReferenceRule, what: str
) -> None:
    """Fill ``row`` with the target's ``got`` against the reference's ``want`` (and, for rule
    relative, the reference's own ``own`` in the target's dtype). Elementwise in float64 (complex as
    pairs of reals), on ``got``'s device, a chunk at a time: only scalars and the report's few indices
    and values come to the host. Equal non-finite values agree.

    A passing pair costs two passes over its chunks (one for rule allclose): the baseline's, then the
    statistics' (errors, the worst element); the mismatches are counted and placed only where the worst
    element is outside the bound."""
    a, n = _flat(got), _flat(want, got.device)
    real = real_dtype(got)
    if rule.rule == "relative":
        assert own is not None
        pair = _Pair(a, n, _flat(own, got.device), per=2 if got.is_complex() else 1)
        baseline, largest = _bar(pair, row, tuple(got.shape), own.dtype, want.dtype)
        row.baseline_err, row.factor = max(baseline, eps(real) * largest), rule.factor
        row.atol, row.rtol = rule.atol or 0.0, None
        if not math.isfinite(rule.factor * row.baseline_err):
            raise UserCodeError(ErrorKind.REFERENCE, _overflow(row, rule.factor, baseline, own.dtype))
        atol, rtol = rule.factor * row.baseline_err + row.atol, 0.0
    else:
        coarser = max(real, real_dtype(want), key=eps)  # a reference in a lower precision sets the defaults
        close = by_dtype(coarser).close
        row.rtol = rtol = rule.rtol if rule.rtol is not None else close.rtol
        row.atol = atol = rule.atol if rule.atol is not None else close.atol
    pair = _Pair(a, n, None, atol, rtol, 2 if got.is_complex() else 1)
    if not a.numel():
        row.mismatched = 0
        return
    found = _pass(_statistics, pair, combine=_worst)
    if not math.isfinite(found[0]):  # rare: a non-finite difference, so the non-finite values apart
        pair.split = True
        found = _pass(_statistics, pair, combine=_worst)
    max_abs, max_rel, any_big, top, k, at_a, at_n = found
    if pair.split:  # the chunks' values are 0 where not finite: both sides' own values there
        at_a, at_n = (float(t[int(k)]) for t in (pair.a, pair.n))
    row.max_abs_err = max_abs
    row.max_rel_err = max_rel if any_big else None
    row.worst_index = unravel(int(k) // pair.per, tuple(got.shape))
    row.analytical, row.numerical = at_a, at_n
    row.mismatched = 0
    if top > pair.threshold():  # the worst element is outside the bound
        row.status = Status.FAIL
        _mismatch(row, pair, tuple(got.shape), what, real)


@dataclass
class _Pair:
    """Two flat real views to compare (and the reference's own, for the relative rule's baseline), with
    the bound ``atol + rtol |n|``, the reals per element (2: complex), and whether to set non-finite values
    apart (``split``)."""

    a: torch.Tensor
    n: torch.Tensor
    own: Optional[torch.Tensor] = None
    atol: float = 0.0
    rtol: float = 0.0
    per: int = 1
    split: bool = False

    def elementwise(self) -> bool:
        """Whether an element's worst is ranked by its excess over its own bound (``rtol``, or non-finite
        values set apart), else by its error: the bound is one number, ``atol``."""
        return bool(self.rtol) or self.split

    def threshold(self) -> float:
        """What the largest key (``_statistics``) must exceed for an element to be outside the bound."""
        return 0.0 if self.elementwise() else self.atol


@dataclass
class _Chunk:
    """A chunk of a pair: ``n`` in float64, ``a`` and ``own`` in their dtypes (an arithmetic op with ``n``
    computes in float64) or, ``exact``, ``a`` in float64 too. Where the pair is split: ``a`` and ``n`` are 0
    where either is not finite, and ``broken`` is true where they are not finite and disagree (NaN and NaN,
    inf and inf agree); else ``broken`` is None."""

    a: torch.Tensor
    n: torch.Tensor
    own: Optional[torch.Tensor]
    pair: _Pair
    broken: Optional[torch.Tensor]

    def tol(self) -> Any:
        """The bound per real (the relative rule's is one number)."""
        return limit(self.n.abs(), self.pair.atol, self.pair.rtol) if self.pair.rtol else self.pair.atol

    def diff(self) -> torch.Tensor:
        """|a - n|, inf where broken."""
        diff = torch.sub(self.a, self.n).abs_()
        return diff if self.broken is None else diff.masked_fill_(self.broken, math.inf)

    def bad(self, diff: torch.Tensor, tol: Any) -> torch.Tensor:
        """Per real: outside the bound, or broken."""
        bad = diff > tol
        return bad if self.broken is None else bad.logical_or_(self.broken)

    def nonfinite(self) -> torch.Tensor:
        """How many elements are broken (a complex one: either of its reals)."""
        if self.broken is None:
            return torch.zeros((), device=self.a.device)
        return per_element(self.broken, self.pair.per == 2).sum()


def _chunks(pair: _Pair, exact: bool = True) -> Iterator[tuple[int, _Chunk]]:
    """(offset, chunk) over the pair, CHUNK reals at a time (an even number: a complex element stays whole);
    not ``exact``, ``a`` and ``own`` stay in their dtypes (a pass that only subtracts ``n`` from them)."""
    step = max(2, CHUNK + CHUNK % 2)
    for s in range(0, pair.a.numel(), step):
        a, n = pair.a[s : s + step], pair.n[s : s + step].to(torch.float64)
        own = None if pair.own is None else pair.own[s : s + step]
        broken = None
        if exact or pair.split:
            a = a.to(torch.float64)
        if pair.split:
            finite = torch.isfinite(a) & torch.isfinite(n)
            broken = ~finite & ~((a == n) | (a.isnan() & n.isnan()))
            a, n = torch.where(finite, a, 0.0), torch.where(finite, n, 0.0)
        yield s, _Chunk(a, n, own, pair, broken)


Found = list[torch.Tensor]  # a chunk's device scalars


def _pass(
    each: Callable[[_Chunk], Found], pair: _Pair, combine: Optional[Callable[[list[Found], list[int]], Found]] = None
) -> list[float]:
    """``each`` chunk's device scalars, combined across chunks (by default the max of each, NaN
    propagating), brought to the host together: one synchronisation, whatever the number of chunks."""
    found, offsets = [], []
    for s, chunk in _chunks(pair, exact=False):
        found.append(each(chunk))
        offsets.append(s)
    if combine is not None:
        out = combine(found, offsets)
    elif found:
        out = [torch.stack(column).max() for column in zip(*found)]
    else:
        return [0.0, 0.0]
    return [float(v) for v in torch.stack([v.to(torch.float64) for v in out]).tolist()]


def _largest(t: torch.Tensor) -> torch.Tensor:
    """max |t| (NaN propagating) in one read of ``t``."""
    low, high = torch.aminmax(t)
    return torch.maximum(high, low.neg())


def _baseline(c: _Chunk) -> Found:
    """A chunk's largest error of the reference's own in the target's dtype, and its largest value."""
    assert c.own is not None
    return [_largest(torch.sub(c.own, c.n)), _largest(c.n)]


def _bar(pair: _Pair, row: InputReport, shape: tuple[int, ...], low: torch.dtype, high: torch.dtype) -> list[float]:
    """The relative rule's baseline and the reference's largest value, over the elements where the reference
    (run in ``high``) is finite (its non-finite values are compared as they are, by ``_statistics``). Where its
    own run in the target's dtype (``low``) is not finite but it is, the rule has no bar: a ``UserCodeError`` (an
    infinite bar would pass any target, a NaN one every element)."""
    found = _pass(_baseline, pair)
    if all(map(math.isfinite, found)):
        return found
    baseline, largest, count, k, at_own, at_n = _pass(_baseline_apart, pair, combine=_first_unbarred)
    if count:
        raise UserCodeError(
            ErrorKind.REFERENCE,
            f"the reference run in {str(low)[6:]} (the target's dtype) gives {at_own:g} for {_subject(row)} at "
            f"{list(unravel(int(k) // pair.per, shape))} where run in {str(high)[6:]} it gives {at_n:.6g} "
            f"({int(count)} such values): the relative rule's bar, the reference's own error in the target's dtype, "
            "is not finite there; draw inputs where the reference is finite in that dtype, or compare by "
            "`rule: allclose` in `tolerance.reference`",
        )
    return [baseline, largest]


def _overflow(row: InputReport, factor: float, baseline: float, low: torch.dtype) -> str:
    """Why the relative rule has no bar where its own error (``baseline``) times ``factor`` overflows float64."""
    return (
        f"the reference's own error in {str(low)[6:]} (the target's dtype) for {_subject(row)} is {baseline:.3g}, and "
        f"{factor:g}x that is past float64's range: the relative rule's bar is not finite (it would pass any "
        "target); draw inputs where the reference's values are within float64's range, or compare by "
        "`rule: allclose` in `tolerance.reference`"
    )


def _subject(row: InputReport) -> str:
    """What a row compares, in a sentence: the output, or the gradient of an argument."""
    return f"the {row.name}" if row.role == "output" else f"the gradient of '{row.name}'"


def _chunk_start(j: torch.Tensor, offsets: list[int]) -> torch.Tensor:
    """Where chunk ``j`` (a device index) starts: the chunks are equal but the last, so at j times the first's size."""
    return j * (offsets[1] if len(offsets) > 1 else 0)


def _baseline_apart(c: _Chunk) -> Found:
    """``_baseline`` over the chunk's elements where the reference is finite, and where its own is not
    there: how many, the first, and both values there."""
    assert c.own is not None
    finite = torch.isfinite(c.n)
    unbarred = finite & ~torch.isfinite(c.own)
    n = torch.where(finite, c.n, 0.0)
    error = torch.where(finite & ~unbarred, torch.sub(c.own, n), 0.0)
    k = torch.argmax(unbarred.to(torch.uint8))  # the first unbarred real (0 where there is none)
    count = per_element(unbarred, c.pair.per == 2).sum()  # elements
    return [_largest(error), _largest(n), count, k, _at(c.own, k).to(torch.float64), _at(c.n, k)]


def _first_unbarred(found: list[Found], offsets: list[int]) -> Found:
    """The chunks' ``_baseline_apart`` as the whole pair's: maxima, the count, and the first element."""
    baseline, largest, count, k, at_own, at_n = (torch.stack(c) for c in zip(*found))
    j = torch.argmax((count > 0).to(torch.uint8))
    start = _chunk_start(j, offsets)
    return [baseline.max(), largest.max(), count.sum(), start + _at(k, j), _at(at_own, j), _at(at_n, j)]


def _at(t: torch.Tensor, k: torch.Tensor) -> torch.Tensor:
    """``t``'s flat element ``k`` (a device index): no synchronisation, as ``t[k]`` would make."""
    return torch.take(t, k.reshape(1)).reshape(())


def _statistics(c: _Chunk) -> Found:
    """A chunk's max error, max relative error (where the reference is not ~0), whether it has such an
    element, and its worst element with both sides there: the first of the largest key, the error where
    the bound is one number (``_Pair.elementwise``), else the excess over the bound (inf where broken)."""
    diff = torch.sub(c.a, c.n).abs_()
    scale = c.n.abs()
    small = torch.gt(scale, c.pair.atol).logical_not_()  # not "<=": a NaN bound leaves every element small
    key = diff
    if c.pair.elementwise():
        key = torch.sub(diff, limit(scale, c.pair.atol, c.pair.rtol) if c.pair.rtol else c.pair.atol)
        if c.broken is not None:
            # |a - n| and its bound both past float64's range (inf - inf): at the bound, as "inf > inf" judges it
            key.nan_to_num_(nan=0.0, posinf=math.inf, neginf=-math.inf).masked_fill_(c.broken, math.inf)
    max_rel = torch.div(diff, scale, out=scale).masked_fill_(small, 0.0).max()
    k = torch.argmax(key)
    top = _at(key, k)
    max_abs = top if key is diff else diff.max()
    return [max_abs, max_rel, small.all().logical_not_(), top, k, _at(c.a, k), _at(c.n, k)]


def _worst(found: list[Found], offsets: list[int]) -> Found:
    """The chunks' statistics as the whole pair's: maxima, and the worst element of the chunk with the
    largest key (the first of equals, as one argmax over the whole pair picks)."""
    max_abs, max_rel, any_big, top, k, at_a, at_n = (torch.stack(c) for c in zip(*found))
    j = torch.argmax(top)
    start = _chunk_start(j, offsets)
    worst = [_at(top, j), start + _at(k, j), _at(at_a, j), _at(at_n, j)]
    return [max_abs.max(), max_rel.max(), any_big.any(), *worst]


def _mismatch(row: InputReport, pair: _Pair, shape: tuple[int, ...], what: str, real: torch.dtype) -> None:
    """A failing row's how many (its mismatches, and non-finite disagreements), where (its first
    mismatching indices, its error map) and what (the pattern)."""
    complex_ = pair.per == 2
    bads, errors, sums = [], [], []
    for _, c in _chunks(pair):
        diff = c.diff()
        bads.append(per_element(c.bad(diff, c.tol()), complex_))
        errors.append(per_element(diff, complex_))
        sums.append(torch.stack([c.a @ c.a, c.n @ c.n, c.a @ c.n, bads[-1].sum(), c.nonfinite()]))
        del diff, c
    aa, nn, an, mismatched, nonfinite = torch.stack(sums).sum(0).tolist()
    row.mismatched = int(mismatched)
    row.mismatched_indices, row.mismatched_indices_cap = _first(bads, shape), INDEX_CAP
    del bads
    sides = ("the gradients for one random grad_output" if what == "gradient" else "the outputs") + (
        ": the target's, the reference's"
    )
    row.error_map = _picture(errors, shape, None if complex_ else (pair, sides))
    _pattern(pair, aa, nn, an, int(nonfinite), row.mismatched, row.numel, what).put(row)
    if row.pattern in (Pattern.SOME_ELEMENTS, Pattern.NO_PATTERN):
        row.diagnosis = "; ".join(filter(None, [row.diagnosis, _coarser(_typical(pair), real)]))


def _first(bads: list[torch.Tensor], shape: tuple[int, ...]) -> list[list[int]]:
    """The multi-indices of the first INDEX_CAP true elements of the chunks ``bads``, in row-major order,
    found on the device (the smallest indices of each chunk, then of those)."""
    picks, start, end = [], 0, math.prod(shape)
    for bad in bads:
        index = torch.arange(start, start + bad.numel(), device=bad.device)
        key = torch.where(bad, index, end)  # end: not a mismatch, after every index
        picks.append(torch.topk(key, min(INDEX_CAP, key.numel()), largest=False).values)
        start += bad.numel()
    first = torch.cat(picks)
    first = torch.topk(first, min(INDEX_CAP, first.numel()), largest=False).values
    return [unravel(k, shape) for k in first.tolist() if k < end]


def _picture(errors: list[torch.Tensor], shape: tuple[int, ...], sides: Optional[tuple[_Pair, str]]) -> ErrorMap:
    """The error map of the per-element errors (the chunks ``errors``, emptied here: one float64 copy of
    them at a time), each cell the max over its block, reduced on the device; ``sides``: both sides per
    element, kept where the map is not downsampled."""
    rows, cols = view_2d(shape)
    bh, bw = blocks(rows, cols, MAP_CELLS)  # the same picture as numerics.maps.downsample's, made on the device
    grid = (torch.cat(errors) if len(errors) > 1 else errors[0]).reshape(rows, cols)
    errors.clear()
    cells = pooled(grid, bh, bw)
    del grid
    picture = ErrorMap(rows, cols, [bh, bw], cells.reshape(-1).tolist())
    if sides is not None and (bh, bw) == (1, 1):
        kept = [(c.a, c.n) for _, c in _chunks(sides[0])]
        picture.analytical, picture.numerical = (torch.cat(s).tolist() for s in zip(*kept))
        picture.sides = sides[1]
    return picture


def _typical(pair: _Pair) -> Optional[float]:
    """The median relative error where the reference is not ~0 (None: nowhere), over one float64 tensor of
    the relative errors, NaN elsewhere (a boolean selection would synchronise once per chunk)."""
    parts = []
    for _, c in _chunks(pair):
        scale = c.n.abs()
        big = scale > pair.atol
        parts.append(torch.sub(c.a, c.n).abs_().div_(scale).masked_fill_(~big, math.nan))
        del scale, big, c
    rel = torch.cat(parts) if len(parts) > 1 else parts[0]
    del parts
    typical = float(rel.nanmedian())  # the lower median, as median picks
    return None if math.isnan(typical) else typical


def _coarser(typical: Optional[float], dtype: torch.dtype) -> Optional[str]:
    """Relative errors typical of rounding to a lower precision than ``dtype``: say which (a target that
    computes in bfloat16 inside, given float64). ``typical``: their median, where there are any."""
    if typical is None:
        return None
    # rounding to a dtype makes a median relative error of about eps / 4
    lower = [d for d in (torch.float32, torch.float16, torch.bfloat16) if eps(d) > eps(dtype)]
    if not lower or not typical > 0:
        return None
    low = min(lower, key=lambda d: abs(math.log(typical / (eps(d) / 4))))
    if abs(math.log(typical / (eps(low) / 4))) > math.log(4):
        return None
    name = str(low).replace("torch.", "")
    return (
        f"its typical relative error {typical:.1g} is {name}'s rounding: does it compute in {name} inside? "
        f"Check it in {name} (`dtype: {name}`), where the reference's own error sets the bar"
    )


def real_dtype(t: torch.Tensor) -> torch.dtype:
    return t.real.dtype if t.is_complex() else t.dtype


def _flat(t: torch.Tensor, device: Optional[torch.device] = None) -> torch.Tensor:
    """``t`` flattened, a complex element as two reals, in its dtype, on ``device`` (default its own); an 8-bit
    float in float32 (which holds every 8-bit float exactly; torch does no arithmetic across 8-bit dtypes)."""
    t = t.detach().resolve_conj()
    if t.is_floating_point() and t.dtype.itemsize == 1:
        t = t.to(torch.float32)
    flat = (torch.view_as_real(t) if t.is_complex() else t).reshape(-1)
    return flat if device is None else flat.to(device)


def _pattern(
    pair: _Pair, aa: float, nn: float, an: float, nonfinite: int, mismatched: int, numel: int, what: str
) -> Diagnosis:
    """What a mismatch of the target's ``what`` against the reference's shows (``aa``, ``nn``, ``an``: the
    dot products of the sides, non-finite values set to 0): non-finite values, all zeros, a constant
    factor up to what the rule allows, a few elements, or nothing."""
    mine, theirs = f"the target's {what}", "the reference's"
    if nonfinite:
        those = "elements are" if nonfinite != 1 else "element is"
        return Diagnosis(
            Pattern.NONFINITE, f"{nonfinite} {those} NaN or infinite on one side and not the same on the other"
        )
    if aa == 0 and nn > 0:
        culprit = (
            "backward returns zeros or None for it (a missing return, a detached result, or the wrong "
            "position in the returned tuple?)"
            if what == "gradient"
            else "forward returns zeros"
        )
        return Diagnosis(Pattern.ZERO_ANALYTICAL, f"{mine} is all zeros, {theirs} is not: {culprit}")
    if nn == 0 and aa > 0:
        return Diagnosis(Pattern.ZERO_NUMERICAL, f"{theirs} {what} is all zeros, {mine} is not")
    # to 10 digits: the sums' order, and so their last bits, follow torch's thread count, and a report is
    # the same for any number of workers
    r = float(f"{an / nn:.10g}") if nn else 0.0
    if r and _within_ratio(pair, r):
        if abs(r + 1) < 1e-2:
            return Diagnosis(Pattern.SIGN_FLIP, f"sign flipped: {mine} = -{theirs}", r)
        return Diagnosis(Pattern.CONSTANT_RATIO, f"{mine} is {ratio_text(r, 1e-2)} {theirs}", r)
    if mismatched < numel:
        return Diagnosis(
            Pattern.SOME_ELEMENTS, f"{mismatched} of {numel} elements differ from {theirs}, the others match"
        )
    return Diagnosis(Pattern.NO_PATTERN, f"differs from {theirs} everywhere, with no constant ratio or sign flip")


def _within_ratio(pair: _Pair, r: float) -> bool:
    """Whether ``a = r n`` everywhere, up to the bound scaled by ``max(1, |r|)``."""
    out = [((c.a - r * c.n).abs_() <= c.tol() * max(1.0, abs(r))).all() for _, c in _chunks(pair)]
    return bool(torch.stack(out).all())


def output_row(
    p: int, got: tuple[Any, ...], want: tuple[Any, ...], own: Optional[tuple[Any, ...]], rule: ReferenceRule
) -> InputReport:
    """Forward output ``p`` of the target against the reference's."""
    o = got[p]
    name = "output" if len(got) == 1 else f"output[{p}]"
    if not is_float_tensor(o):
        return InputReport(
            p,
            name,
            list(getattr(o, "shape", [])),
            dtype_name(o) if isinstance(o, torch.Tensor) else type(o).__name__,
            Status.SKIP,
            reason="not a floating-point output (not compared)",
            role="output",
        )
    row = InputReport(p, name, list(o.shape), dtype_name(o), Status.PASS, numel=o.numel(), role="output")
    compare(row, o, want[p], own[p] if own else None, rule, "output")
    return row
