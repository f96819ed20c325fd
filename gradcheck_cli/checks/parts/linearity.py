"""Backward's linearity in grad_output, part of backward's contract.

A backward is a vector-Jacobian product, linear in grad_output. Autograd relies on it (it adds the
grad_outputs of an output used twice, and scales them), and so does the backward check, which
reads the Jacobian off one-hot grad_outputs (element by element) or grad_outputs that are 1 at
several elements (compressed rows). A backward that treats some grad_outputs differently (a test
of grad_output's sparsity or size, a clamp, a normalisation) passes one kind and is wrong in use.

One grad_output e, non-zero at one random element of each differentiable output (its value the
norm of a dense random g there, so that its gradient is not lost in the rounding of g's), and g:
backward(e) must equal backward(g + e) - backward(g). Each of the three gradients may be off by
what the Jacobian comparison accepts (atol at the size of the grad_output, rtol at its own size),
and by the rounding of the calls in the gradients' dtype: their sum is the tolerance. Two backward
calls besides g's, which backward's contract call gives.
"""

from __future__ import annotations

import math
from typing import Any, Optional

import torch

from ...core.tolerance import Tolerance
from ...numerics import precision, real_numel, unravel
from ...numerics.realify import Vjp
from .base import probe_like

ROUNDING = 16  # the calls' rounding: this many units in the last place, times sqrt(terms), of the largest value
TF32_EPS = 2.0**-10  # float32 products on a GPU may be taken in TF32 (10 bits)
BF16_EPS = 2.0**-7  # torch.set_float32_matmul_precision("medium") may take them in bfloat16


def examine(
    backward: Vjp,
    live: list[torch.Tensor],
    positions: list[int],
    inputs: list[torch.Tensor],
    names: list[str],
    given: Optional[tuple[list[Any], list[Any]]],
    gen: torch.Generator,
    tol: Tolerance,
) -> tuple[Optional[str], list[int]]:
    """Whether ``backward`` (``vjp``'s signature) is linear in grad_output: the message of a failure (None
    if none) and the indices into ``inputs`` whose gradients broke it. ``live``: the differentiable outputs
    (at ``positions`` among forward's); ``given``: a dense grad_output per live output and the gradients
    backward returned for it, or None (drawn from ``gen`` and called here)."""
    if not live or not inputs:
        return None, []
    if given is None:
        dense = [probe_like(o, gen) for o in live]
        at_dense = list(backward(live, inputs, [g.clone() for g in dense]))
    else:
        dense, at_dense = list(given[0]), list(given[1])
    hot, places = [], []
    for p, g in zip(positions, dense):
        h = torch.zeros(g.shape, dtype=g.dtype, device=g.device)
        if g.numel():
            i = int(torch.randint(g.numel(), (1,), generator=gen))
            h.view(-1)[i] = float(torch.linalg.vector_norm(g)) or 1.0
            places.append(f"output {p} at {list(unravel(i, tuple(g.shape)))}" if g.dim() else f"output {p}")
        hot.append(h)
    size = max((float(h.abs().max()) for h in hot if h.numel()), default=1.0)
    at_hot = list(backward(live, inputs, [h.clone() for h in hot]))
    at_sum = list(backward(live, inputs, [h + g for h, g in zip(hot, dense)]))
    terms = sum(real_numel(o) for o in live)
    phrases: dict[str, list[str]] = {}  # what it returns -> the arguments (a ratio: 'x', 'w' alike)
    bad = []
    for k, x in enumerate(inputs):
        phrase = _compare(x, at_hot[k], at_sum[k], at_dense[k], size, terms, tol)
        if phrase:
            phrases.setdefault(phrase, []).append(f"'{names[k]}'")
            bad.append(k)
    if not bad:
        return None, []
    said = [phrase.format(f"{'s' * (len(args) > 1)} of {', '.join(args)}") for phrase, args in phrases.items()]
    where = ", ".join(places)
    which = "a one-hot grad_output" + (" for each output" if len(places) > 1 else "")
    return (
        f"backward is not linear in grad_output: for {which} ({where}) it returns {'; '.join(said)} "
        "(implied: backward(g + one-hot) - backward(g), g dense and random); autograd adds and scales "
        "grad_outputs, and the Jacobian is read off one-hot rows, so backward must be linear in grad_output: "
        "look for code that depends on grad_output's values (a test of its sparsity or size, a clamp, a "
        "normalisation)"
    ), bad


def _compare(
    x: torch.Tensor, at_hot: Any, at_sum: Any, at_dense: Any, size: float, terms: int, tol: Tolerance
) -> Optional[str]:
    """What ``at_hot`` is against the gradient of ``x`` that linearity implies (``at_sum - at_dense``), in
    words with a ``{}`` for " of 'x'" (where it differs beyond the tolerance); None where it does not, or
    cannot be compared."""
    grads = [_dense(g, x) for g in (at_hot, at_sum, at_dense)]
    if any(g is None for g in grads):
        return None
    a, s, d = (g for g in grads if g is not None)
    magnitude = a.abs() + s.abs() + d.abs()
    if not magnitude.numel() or not bool(torch.isfinite(magnitude).all()):  # non-finite: the Jacobian says it
        return None
    implied = s - d
    eps = max(
        _eps([x.dtype] + [g.dtype for g in (at_hot, at_sum, at_dense) if isinstance(g, torch.Tensor)], x.device),
        _computed_in([a, s, d]),
    )
    # each gradient as the Jacobian comparison accepts it, plus the calls' rounding (relative to the largest
    # value, as a sum of up to `terms` products cancels) and their nondeterminism
    limit = (
        tol.atol * 3 * size
        + tol.rtol * magnitude
        + ROUNDING * eps * math.sqrt(terms) * float(magnitude.max())
        + 3 * tol.nondet_tol * max(1.0, size)
    )
    err = (a - implied).abs()
    if not bool((err > limit).any()):
        return None
    if not bool((implied.abs() > limit).any()):
        return f"a gradient{{}} (max |value| {float(a.abs().max()):.3g}) where dense grad_outputs imply zero"
    if not bool((a.abs() > limit).any()):
        return f"zero for the gradient{{}}, where dense grad_outputs imply max |value| {float(implied.abs().max()):.3g}"
    ar, ir = _real(a), _real(implied)
    r = float((ar * ir).sum() / (ir * ir).sum())
    if bool(((a - r * implied).abs() <= limit).all()):
        return f"{r:.3g}x the gradient{{}} that dense grad_outputs imply"
    worst = int(torch.argmax(err - limit))
    at = list(unravel(worst, tuple(x.shape)))
    return (
        f"a gradient{{}} off by up to {float(err.max()):.3g} from what dense grad_outputs imply (at {at}: "
        f"{_number(a.reshape(-1)[worst])} where they imply {_number(implied.reshape(-1)[worst])})"
    )


def _dense(g: Any, x: torch.Tensor) -> Optional[torch.Tensor]:
    """A gradient of ``x`` as a strided float64 (complex128) tensor: None as zeros, a sparse one densified;
    None where it is not a tensor of ``x``'s shape (backward's contract says what is wrong with it)."""
    if g is None:
        g = torch.zeros(x.shape, dtype=x.dtype, device=x.device)
    if not isinstance(g, torch.Tensor) or g.shape != x.shape:
        return None
    if g.layout != torch.strided:
        try:
            g = g.to_dense()
        except (RuntimeError, NotImplementedError):
            return None
    g = g.detach().resolve_conj()
    return g.to(torch.complex128 if g.is_complex() else torch.float64)


def _computed_in(grads: list[torch.Tensor]) -> float:
    """The unit roundoff of a coarser grid than their dtype's that all the values of ``grads`` lie on
    (backward computes in bfloat16, float16 or float32 inside and casts back: every value fits in 8 to
    24 significant bits, see ``numerics.precision``); 0 where they show none (integers do not count)."""
    values = torch.cat([_real(g).reshape(-1) for g in grads])
    values = values[torch.isfinite(values) & (values != 0)]
    if values.numel() < 2 or bool((values == values.round()).all()):
        return 0.0
    bits = int(precision.significant_bits(values).max())
    return 2.0 ** (1 - bits) if precision.MIN_BITS <= bits <= 24 else 0.0


def _real(t: torch.Tensor) -> torch.Tensor:
    return torch.view_as_real(t) if t.is_complex() else t


def _number(t: torch.Tensor) -> str:
    v = complex(t) if t.is_complex() else float(t)
    return f"{v:.3g}"


def _eps(dtypes: list[torch.dtype], device: torch.device) -> float:
    """The unit roundoff of the least precise of ``dtypes``, where floating; float32 products as torch
    may take them (TF32 on a GPU where allowed, bfloat16 at matmul precision 'medium')."""
    floating = [d for d in dtypes if d.is_floating_point or d.is_complex]
    eps = max((torch.finfo(d).eps for d in floating), default=torch.finfo(torch.float64).eps)
    if torch.float32 in floating or torch.complex64 in floating:
        precision = torch.get_float32_matmul_precision()
        if precision == "medium":
            eps = max(eps, BF16_EPS)
        elif (
            precision == "high"
            or device.type == "cuda"
            and (torch.backends.cuda.matmul.allow_tf32 or torch.backends.cudnn.allow_tf32)
        ):
            eps = max(eps, TF32_EPS)
    return eps
