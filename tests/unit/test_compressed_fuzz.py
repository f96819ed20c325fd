"""A seeded differential fuzz of the compressed check (numerics/compressed.py, row_groups.py): random
Functions with structured sparse Jacobians, right and wrong, each checked compressed and element by
element (``compress=False``); the two reports must be the same, verdict, rows and numbers (README,
"Compressed": "the report is identical").

A generated Function is y_k = phi_k(z_k + c_k), z_k = sum of linear pieces of the inputs (masked
matmuls with random, banded, block-diagonal, permutation patterns, dense and empty rows and
columns; broadcasting; elementwise scaling; rolls; gathers with repeats), phi_k elementwise
(identity, tanh, x|x|, relu and sin away from their kinks), several inputs and outputs of any shape
(0-d and size-1 dimensions included), sometimes a non-tensor argument, and a forward that vmap
refuses (NumPy, ``.item()``) for the single-call fallback. The true Jacobian of each piece is taken
once, when the case is made; backward computes the gradients with its own copies of those matrices,
where the bugs are put: one wrong element around the tolerance, an entry forgotten or invented, a
transposed block, a sign flipped in a block, an argument's or an output's gradient doubled, a NaN or
an infinity, pairs of errors that cancel in a unit move, a gradient given to the wrong element,
errors in the columns of one colour group only, a wrong derivative of phi.

Every compressed check here must really be compressed (``compressed.Groups.evaluate`` counted),
small Jacobians included (``jacobians.SMALL`` set to 0, as in test_compressed.py). Two comparisons:
with every forward a single call (``_single_calls``), the reports must be identical, number for
number; with the batched (vmapped) forwards, whose matmuls round each batch row differently, the
verdicts and mismatched elements must be the same (where the differences' rounding is well below
atol). A subset of the cases is also judged by ``torch.autograd.gradcheck`` (slow mode), where the
bug is far from the tolerance either way.

It found a wrong pass, now fixed (the tests after "the discrepancies found"): an entry that backward
forgets, in an output element where a column of the same group has an analytical entry, was absorbed
into that entry's tolerance (atol + rtol |row|) instead of its own (atol + rtol |entry|), so the
compressed check passed where element by element fails; a group is now accepted only where its two
moves agree to within the forwards' rounding in the rows with an entry. What is left (strict xfails):
report numbers that differ in their last bits, and one ill-conditioned case whose batched rounding is
about atol.
"""

from __future__ import annotations

import math
import os
import random
from dataclasses import dataclass, field
from typing import Any, Callable, Optional

import numpy as np
import pytest
import torch

from gradcheck_cli import check
from gradcheck_cli.numerics import compressed
from gradcheck_cli.numerics.rows import SparseRows

try:  # tests/ on sys.path (rootdir-style collection) or tests/ as a package
    from corpus import determined, report_rows
except ImportError:  # pragma: no cover
    from tests.corpus import determined, report_rows

F64 = torch.float64
ATOL, RTOL = 1e-5, 1e-3

FAST_SEEDS = range(24)  # the default run: a few dozen cases (about 0.1 s each)
# the sweep, @pytest.mark.slow (GRADCHECK_FUZZ_SEEDS=START:STOP to hunt further)
SLOW_SEEDS = range(*(int(v) for v in os.environ.get("GRADCHECK_FUZZ_SEEDS", "24:424").split(":")))
# seeds of the sweep whose case is a known discrepancy (see the xfail tests at the end), as found by the sweep
KNOWN: dict[int, str] = {}  # none of the default seeds (a misattributed gradient found at an earlier draw's seed
# 247 is test_a_gradient_given_to_the_wrong_element_is_caught_for_every_seed)


def _seeds(seeds: range) -> list[Any]:
    return [
        pytest.param(s, marks=pytest.mark.xfail(strict=True, raises=AssertionError, reason=KNOWN[s]))
        if s in KNOWN
        else s
        for s in seeds
    ]


# ------------------------------------------------------------------------------- comparing reports


_rows = report_rows  # a result as JSON, without its times


def _first_difference(a: Any, b: Any, path: str = "") -> Optional[str]:
    """Where two JSON values first differ (None where they are equal), for a readable failure."""
    if isinstance(a, dict) and isinstance(b, dict):
        for k in sorted(set(a) | set(b), key=str):
            if k not in a or k not in b:
                return f"{path}.{k}: only in {'compressed' if k in a else 'element by element'}"
            found = _first_difference(a[k], b[k], f"{path}.{k}")
            if found:
                return found
        return None
    if isinstance(a, list) and isinstance(b, list):
        if len(a) != len(b):
            return f"{path}: {len(a)} items against {len(b)}"
        for i, (x, y) in enumerate(zip(a, b)):
            found = _first_difference(x, y, f"{path}[{i}]")
            if found:
                return found
        return None
    return None if a == b else f"{path}: compressed {a!r}, element by element {b!r}"


def assert_same_report(got: Any, plain: Any, label: str) -> None:
    a, b = _rows(got), _rows(plain)
    diff = _first_difference(a, b)
    assert diff is None and a == b, f"{label}\n  first difference: {diff}\n--- compressed:\n{got}\n--- plain:\n{plain}"


# ------------------------------------------------------------------------------------ the fixtures


@pytest.fixture(autouse=True)
def compress_small_checks_too(monkeypatch: pytest.MonkeyPatch) -> None:
    """The generated Jacobians are a few hundred rows and columns, which the default takes whole."""
    from gradcheck_cli.numerics import jacobians

    monkeypatch.setattr(jacobians, "SMALL", 0)


@pytest.fixture
def used(monkeypatch: pytest.MonkeyPatch) -> dict[str, int]:
    """Counts the checks whose numerical side was compressed."""
    count = {"n": 0}
    evaluate = compressed.Groups.evaluate

    def counted(self: compressed.Groups) -> None:
        count["n"] += 1
        return evaluate(self)

    monkeypatch.setattr(compressed.Groups, "evaluate", counted)
    return count


# --------------------------------------------------------------------------------- linear pieces


@dataclass
class Piece:
    """A linear map of input ``inp`` to output ``out``'s flat elements, written with real torch ops."""

    kind: str
    inp: int
    out: int
    mat: Optional[torch.Tensor] = None  # matmul: m x n (zeros where the mask is)
    coef: Optional[torch.Tensor] = None  # scale: per element
    shift: int = 0  # roll
    index: Optional[torch.Tensor] = None  # gather
    shape: tuple[int, ...] = ()  # broadcast: the output's shape

    def __call__(self, x: torch.Tensor) -> torch.Tensor:
        if self.kind == "matmul":
            assert self.mat is not None
            return self.mat @ x.reshape(-1)
        if self.kind == "broadcast":
            return x.expand(self.shape).reshape(-1)
        if self.kind == "scale":
            assert self.coef is not None
            return self.coef * x.reshape(-1)
        if self.kind == "roll":
            return x.reshape(-1).roll(self.shift)
        assert self.index is not None
        return x.reshape(-1)[self.index]


@dataclass
class Product:
    """x_i[index] * x_j[index2] into output ``out``'s flat elements (i may be j): its Jacobian depends on
    the inputs, and is zero where they are (an entry the analytical pattern leaves out, whose move
    still changes the output at second order). ``swapped``: backward's bug, each factor's gradient
    taken with itself instead of the other factor."""

    out: int
    i: int
    j: int
    index: torch.Tensor
    index2: torch.Tensor
    swapped: bool = False

    def __call__(self, xs: tuple[torch.Tensor, ...]) -> torch.Tensor:
        return xs[self.i].reshape(-1)[self.index] * xs[self.j].reshape(-1)[self.index2]

    def grads(self, xs: tuple[torch.Tensor, ...], gz: torch.Tensor, grads: list[torch.Tensor]) -> None:
        a, b = xs[self.i].reshape(-1)[self.index], xs[self.j].reshape(-1)[self.index2]
        if self.swapped:
            a, b = b, a
        grads[self.i] = grads[self.i].index_add(0, self.index, gz * b)
        grads[self.j] = grads[self.j].index_add(0, self.index2, gz * a)

    def jacobians(self, xs: tuple[torch.Tensor, ...], mats: list[torch.Tensor], backward: bool) -> None:
        a, b = xs[self.i].reshape(-1)[self.index], xs[self.j].reshape(-1)[self.index2]
        if backward and self.swapped:
            a, b = b, a
        rows = torch.arange(len(self.index))
        mats[self.i].index_put_((rows, self.index), b, accumulate=True)
        mats[self.j].index_put_((rows, self.index2), a, accumulate=True)


PHIS: dict[str, tuple[Callable[[torch.Tensor], torch.Tensor], Callable[[torch.Tensor], torch.Tensor], Any]] = {
    # name: (phi, its derivative, the NumPy phi)
    "id": (lambda z: z, lambda z: torch.ones_like(z), lambda z: z),
    "tanh": (torch.tanh, lambda z: 1 - torch.tanh(z) ** 2, np.tanh),
    "xabs": (lambda z: z * z.abs(), lambda z: 2 * z.abs(), lambda z: z * np.abs(z)),
    "relu": (torch.relu, lambda z: (z > 0).to(z.dtype), lambda z: np.maximum(z, 0.0)),
    "sin": (torch.sin, torch.cos, np.sin),
}
KINKED = ("xabs", "relu")  # z + c kept at least 0.2 from 0


@dataclass
class Case:
    """A generated Function, its arguments, and what was done to its backward."""

    seed: int
    fn: Any  # an autograd.Function class
    args: tuple[Any, ...]
    generator: str
    bug: str
    clear: bool  # the bug (or none) is far from the tolerance: torch.autograd.gradcheck's verdict is known
    wrong: bool  # the bug is above the tolerance somewhere (element by element must fail)
    vmappable: bool
    notes: dict[str, Any] = field(default_factory=dict)
    model: Optional[Model] = field(default=None, repr=False)

    def inputs(self) -> tuple[torch.Tensor, ...]:
        """The arguments checked (detached): the tensors that need gradients."""
        return tuple(a.detach() for a in self.args if isinstance(a, torch.Tensor) and a.requires_grad)

    def __str__(self) -> str:
        return (
            f"seed {self.seed}: {self.generator}, bug {self.bug} {self.notes}, "
            f"shapes {[tuple(a.shape) if isinstance(a, torch.Tensor) else a for a in self.args]}"
        )


def _shape(rng: random.Random, lo: int, hi: int) -> tuple[int, ...]:
    """A shape of lo..hi elements, sometimes with size-1 dimensions; () is 1 element."""
    n = rng.randint(lo, hi)
    if n == 1:
        return rng.choice([(), (1,), (1, 1)])
    form = rng.random()
    divisors = [d for d in range(2, n) if n % d == 0]
    if form < 0.35 or not divisors:
        return rng.choice([(n,), (1, n), (n, 1)])
    d = rng.choice(divisors)
    if form < 0.8:
        return (d, n // d)
    return rng.choice([(d, 1, n // d), (1, d, n // d)])


def _numel(shape: tuple[int, ...]) -> int:
    return math.prod(shape)


def _mask(rng: random.Random, g: torch.Generator, m: int, n: int, density: float) -> torch.Tensor:
    """A sparsity pattern m x n of about ``density``: random, banded, block-diagonal or a permutation,
    with sometimes a few dense columns, dense rows over a few columns, and empty rows and columns."""
    kind = rng.choice(["random", "banded", "block", "permutation", "random"])
    if kind == "random":
        mask = torch.rand(m, n, generator=g) < density
    elif kind == "banded":
        width = rng.randint(0, 2)
        r = torch.arange(m)[:, None] * n // max(1, m)
        mask = (torch.arange(n)[None, :] - r).abs() <= width
    elif kind == "block":
        blocks = rng.randint(6, 16)
        rb, cb = torch.arange(m) * blocks // max(1, m), torch.arange(n) * blocks // max(1, n)
        mask = (rb[:, None] == cb[None, :]) & (torch.rand(m, n, generator=g) < 0.6)
    else:
        mask = torch.zeros(m, n, dtype=torch.bool)
        mask[torch.arange(m), torch.randint(0, n, (m,), generator=g)] = True
    if rng.random() < 0.25 and n > 1:  # a few dense columns
        mask[:, torch.randint(0, n, (rng.randint(1, 2),), generator=g)] = True
    if rng.random() < 0.25 and m > 1:  # a few rows dense over a few columns
        cols = torch.randperm(n, generator=g)[: min(n, rng.randint(2, 10))]
        rows = torch.randint(0, m, (rng.randint(1, 2),), generator=g)
        mask[rows[:, None], cols[None, :]] = True
    if rng.random() < 0.3:  # empty rows and columns
        mask[torch.randint(0, m, (max(1, m // 8),), generator=g)] = False
        mask[:, torch.randint(0, n, (max(1, n // 8),), generator=g)] = False
    return mask


def _values(rng: random.Random, g: torch.Generator, shape: tuple[int, ...]) -> torch.Tensor:
    """Non-zero values, of mixed scales now and then."""
    v = torch.randn(shape, generator=g, dtype=F64)
    v = v.sign() * (v.abs() + 0.1)  # none near 0: a mask's zero is a structural zero
    if rng.random() < 0.2:
        v = v * torch.tensor([1e-2, 1.0, 1e2], dtype=F64)[torch.randint(0, 3, shape, generator=g)]
    return v


# ---------------------------------------------------------------------------------- the generator


class Model:
    """The generated map: inputs' and outputs' shapes, pieces, phis, offsets; the true matrices A[k][i]
    (z_k's Jacobian in x_i) and backward's B[k][i]."""

    def __init__(
        self,
        in_shapes: list[tuple[int, ...]],
        out_shapes: list[tuple[int, ...]],
        pieces: list[Piece],
        phis: list[str],
        alpha: Optional[float],
    ) -> None:
        self.in_shapes, self.out_shapes, self.pieces, self.phis = in_shapes, out_shapes, pieces, phis
        self.alpha = alpha  # a non-tensor argument scaling every z (None: not passed)
        self.offsets = [torch.zeros(_numel(s), dtype=F64) for s in out_shapes]
        self.A = [[torch.zeros(_numel(so), _numel(si), dtype=F64) for si in in_shapes] for so in out_shapes]
        for p in pieces:  # linear: the Jacobian of a piece is its image of the identity
            eye = torch.eye(_numel(in_shapes[p.inp]), dtype=F64)
            self.A[p.out][p.inp] += torch.stack([p(e.reshape(in_shapes[p.inp])) for e in eye], 1)
        self.B = [[a.clone() for a in row] for row in self.A]
        self.products: list[Product] = []
        self.const: Optional[torch.Tensor] = None  # a 0-d tensor argument that needs no gradient, added to z_0
        self.index_output = False  # a last output z_0.argmax(), not differentiable
        self.dphi_bug: Optional[tuple[int, int, float]] = None  # (output, element, factor)
        self.nan: Optional[tuple[str, int, int, int, int]] = None  # (how, output, row, input, column)

    def make_args(self, xs: tuple[torch.Tensor, ...]) -> tuple[Any, ...]:
        """The arguments of the Function at inputs ``xs``: xs, the constant tensor, alpha."""
        const = () if self.const is None else (self.const,)
        return (*xs, *const, *(() if self.alpha is None else (self.alpha,)))

    def z(
        self, xs: tuple[torch.Tensor, ...], alpha: float = 1.0, const: Optional[torch.Tensor] = None
    ) -> list[torch.Tensor]:
        const = self.const if const is None else const
        zs = []
        for k in range(len(self.out_shapes)):
            z = self.offsets[k].clone() if k or const is None else self.offsets[k] + const
            for p in self.pieces:
                if p.out == k:
                    z = z + p(xs[p.inp])
            for q in self.products:
                if q.out == k:
                    z = z + q(xs)
            zs.append(z * alpha)
        return zs

    def dphi(self, k: int, z: torch.Tensor) -> torch.Tensor:
        d = PHIS[self.phis[k]][1](z)
        if self.dphi_bug is not None and self.dphi_bug[0] == k:
            d = d.clone()
            d[self.dphi_bug[1]] *= self.dphi_bug[2]
        return d

    def function(self, numpy: bool, item: bool) -> type:
        model = self

        class Generated(torch.autograd.Function):
            @staticmethod
            def forward(ctx: Any, *args: Any) -> Any:
                n = len(model.in_shapes)
                xs = tuple(args[:n])
                const = args[n] if model.const is not None else None
                alpha = args[-1] if model.alpha is not None else 1.0
                ctx.save_for_backward(*xs)
                ctx.alpha, ctx.const = alpha, const
                outs = []
                zs = model.z(xs, alpha, const)
                for k, z in enumerate(zs):
                    if item and float(z.abs().max().item()) > 1e12:  # .item(): vmap refuses the forward
                        raise ValueError("too large")
                    if numpy:
                        y = torch.from_numpy(np.asarray(PHIS[model.phis[k]][2](z.detach().numpy()), dtype=np.float64))
                    else:
                        y = PHIS[model.phis[k]][0](z)
                    outs.append(y.reshape(model.out_shapes[k]))
                if model.index_output:
                    outs.append(zs[0].argmax())
                    ctx.mark_non_differentiable(outs[-1])
                return outs[0] if len(outs) == 1 else tuple(outs)

            @staticmethod
            def backward(ctx: Any, *gs: torch.Tensor) -> Any:
                xs = ctx.saved_tensors
                zs = model.z(xs, ctx.alpha, ctx.const)
                grads = [torch.zeros(_numel(s), dtype=F64) for s in model.in_shapes]
                for k, (g, z) in enumerate(zip(gs, zs)):
                    gz = g.reshape(-1) * model.dphi(k, z) * ctx.alpha
                    for i in range(len(xs)):
                        grads[i] = grads[i] + model.B[k][i].t() @ gz
                    for q in model.products:
                        if q.out == k:
                            q.grads(xs, gz, grads)
                    if model.nan is not None and model.nan[1] == k:
                        how, _, r, i, c = model.nan
                        if how == "nan_where":  # NaN where this output element's gradient reaches
                            grads[i][c] = grads[i][c] + torch.where(gz[r] != 0, math.nan, 0.0)
                        else:  # 0 * inf: NaN in every row, inf in its own
                            grads[i][c] = grads[i][c] + gz[r] * math.inf
                out = [gr.reshape(s) for gr, s in zip(grads, model.in_shapes)]
                return (*out, *[None] * (len(model.make_args(xs)) - len(out)))

        return Generated

    def rounding(self, xs: tuple[torch.Tensor, ...], eps: float = 1e-6) -> float:
        """The largest rounding error of a central difference of an output element: a few ulps of the
        largest sum that makes its z (offsets that cancel large terms leave z small, and its rounding
        not), through phi', over 2 eps."""
        alpha = abs(self.alpha if self.alpha is not None else 1.0)
        worst = 0.0
        for k, z in enumerate(self.z(xs, self.alpha if self.alpha is not None else 1.0)):
            size = self.offsets[k].abs() + (0 if self.const is None or k else abs(float(self.const)))
            for i, x in enumerate(xs):
                size = size + self.A[k][i].abs() @ x.reshape(-1).abs()
            for q in self.products:
                if q.out == k:
                    size = size + q(tuple(x.abs() for x in xs))
            slope = PHIS[self.phis[k]][1](z).abs() + (2 * z.abs() if self.phis[k] == "xabs" else 0)
            worst = max(worst, float((4 * 2.2e-16 * size * alpha * slope.clamp(min=1)).max()) / (2 * eps))
        return worst

    def true_jacobian(self, xs: tuple[torch.Tensor, ...], backward: bool = False) -> torch.Tensor:
        """The whole Jacobian (rows: every output's elements; columns: every input's), true or backward's
        (without its NaN), at ``xs``."""
        alpha = self.alpha if self.alpha is not None else 1.0
        zs = self.z(xs, alpha)
        blocks = []
        for k, z in enumerate(zs):
            d = (self.dphi(k, z) if backward else PHIS[self.phis[k]][1](z)) * alpha
            mats = [m.clone() for m in (self.B[k] if backward else self.A[k])]
            for q in self.products:
                if q.out == k:
                    q.jacobians(xs, mats, backward)
            blocks.append(torch.cat([d[:, None] * m for m in mats], 1))
        return torch.cat(blocks, 0)


def _layout_of(model: Model) -> tuple[list[int], list[int]]:
    rows = [0]
    for s in model.out_shapes:
        rows.append(rows[-1] + _numel(s))
    cols = [0]
    for s in model.in_shapes:
        cols.append(cols[-1] + _numel(s))
    return rows, cols


def colours_of(jac: torch.Tensor) -> torch.Tensor:
    """The colour (group) of each column the compressed check gives the pattern of ``jac`` (rows x cols)."""
    r, c = jac.nonzero(as_tuple=True)
    found = compressed.colour(SparseRows(c, r, jac[r, c], jac.shape[1]), jac.shape[0])
    assert found is not None
    return found[0]


def compressible(jac: torch.Tensor) -> bool:
    """Whether the check of a Function with this Jacobian is compressed (with a margin): its non-zero
    entries kept (at most an eighth of them) and fewer forwards by groups than by columns."""
    n_rows, n_cols = jac.shape
    nnz = int((jac != 0).sum())
    return 0 < nnz <= n_rows * n_cols // 10 and 4 * (int(colours_of(jac).max()) + 1) < 1.5 * n_cols


def make_model(rng: random.Random, g: torch.Generator, square: bool = False) -> Model:
    """Random inputs, outputs and pieces (see the module)."""
    n_in, n_out = rng.choice([1, 1, 2, 2, 3]), rng.choice([1, 1, 2])
    in_shapes = [_shape(rng, 24, 150) for _ in range(n_in)]
    if n_in > 1 and rng.random() < 0.3:
        in_shapes[rng.randrange(n_in)] = _shape(rng, 1, 6)  # a small one: a 0-d, a bias
    out_shapes = [_shape(rng, 24, 150) for _ in range(n_out)]
    if n_out > 1 and rng.random() < 0.3:
        out_shapes[-1] = rng.choice([(), (1,), (3,), (2, 1)])  # a tiny output (one-hot rows)
    if square:  # a square block for a transposed gradient
        out_shapes[0] = (_numel(in_shapes[0]),)
    density = rng.choice([0.01, 0.02, 0.04, 0.08])
    pieces: list[Piece] = []
    for k, so in enumerate(out_shapes):
        m = _numel(so)
        for i, si in enumerate(in_shapes):
            n = _numel(si)
            if not ((square and k == 0 and i == 0) or rng.random() < 0.7):
                continue
            options = ["matmul", "matmul"]
            try:
                torch.broadcast_shapes(si, so)
                if torch.broadcast_shapes(si, so) == tuple(so) and n < m:
                    options.append("broadcast")
            except RuntimeError:
                pass
            if n == m:
                options += ["scale", "roll"]
            options.append("gather")
            kind = "matmul" if square and k == 0 and i == 0 else rng.choice(options)
            if kind == "matmul":
                mat = _mask(rng, g, m, n, density) * _values(rng, g, (m, n))
                pieces.append(Piece("matmul", i, k, mat=mat))
            elif kind == "broadcast":
                pieces.append(Piece("broadcast", i, k, shape=tuple(so)))
            elif kind == "scale":
                pieces.append(Piece("scale", i, k, coef=_values(rng, g, (m,))))
            elif kind == "roll":
                pieces.append(Piece("roll", i, k, shift=rng.randint(-3, 3)))
            else:
                pieces.append(Piece("gather", i, k, index=torch.randint(0, n, (m,), generator=g)))
        if not any(p.out == k for p in pieces):  # every output depends on something
            i = rng.randrange(n_in)
            mat = _mask(rng, g, m, _numel(in_shapes[i]), density) * _values(rng, g, (m, _numel(in_shapes[i])))
            pieces.append(Piece("matmul", i, k, mat=mat))
    phis = [rng.choice(list(PHIS)) for _ in out_shapes]
    alpha = rng.choice([None, None, None, 0.5, 2.0])
    model = Model(in_shapes, out_shapes, pieces, phis, alpha)
    if rng.random() < 0.3:  # a product of two inputs' elements (or of one input's)
        k, i, j = rng.randrange(n_out), rng.randrange(n_in), rng.randrange(n_in)
        m = _numel(out_shapes[k])
        index, index2 = (torch.randint(0, _numel(in_shapes[t]), (m,), generator=g) for t in (i, j))
        model.products.append(Product(k, i, j, index, index2))
    return model


def _inputs(model: Model, g: torch.Generator, zeros: bool) -> tuple[torch.Tensor, ...]:
    xs = []
    for s in model.in_shapes:
        x = torch.randn(s, generator=g, dtype=F64)
        if zeros and x.numel() > 4:  # exact zeros: a product's analytical entries there are 0
            x.view(-1)[torch.randperm(x.numel(), generator=g)[: x.numel() // 10]] = 0.0
        xs.append(x)
    return tuple(xs)


def _keep_off_kinks(model: Model, xs: tuple[torch.Tensor, ...], rng: random.Random, g: torch.Generator) -> None:
    """Offsets that put z + c at 0.2..1.2 from 0 (either sign) for the kinked phis, and at a random
    place for the others (tanh saturates beyond a few units)."""
    alpha = model.alpha if model.alpha is not None else 1.0
    zs = model.z(xs, 1.0)
    for k, z in enumerate(zs):
        target = torch.rand(z.shape, generator=g, dtype=F64) + 0.2
        target = target * torch.where(torch.rand(z.shape, generator=g) < 0.5, -1.0, 1.0)
        if model.phis[k] in KINKED or model.phis[k] == "tanh" or rng.random() < 0.5:
            model.offsets[k] = target / alpha - z  # (z + c) alpha = target
        else:
            model.offsets[k] = torch.zeros_like(z)


def _tol(v: torch.Tensor | float) -> float:
    return ATOL + RTOL * abs(float(v))


GENERATORS = [
    "patterns",
    "wrong_element",
    "extra_entry",
    "transposed",
    "sign_block",
    "scaled_argument",
    "scaled_output",
    "nonfinite",
    "cancel_pair",
    "misattributed",
    "group_rows",
    "omitted",
    "wrong_dphi",
    "product_swapped",
]


def make_case(seed: int, generator: Optional[str] = None, zeros: bool = True) -> Case:
    """Case ``seed``: its generator (one of GENERATORS, by the seed unless given), its model, inputs and
    bug; drawn again until the compressed check applies to it (sparse enough, few enough groups, both
    for the true Jacobian and backward's). ``zeros``: some inputs of a product may be exactly 0."""
    rng = random.Random(seed)
    g = torch.Generator().manual_seed(seed)
    generator = generator or GENERATORS[seed % len(GENERATORS)]
    for _ in range(30):
        case = _draw(rng, g, seed, generator, zeros)
        assert case.model is not None
        xs = case.inputs()
        if all(compressible(case.model.true_jacobian(xs, backward=b).nan_to_num(1.0)) for b in (False, True)):
            return case
    raise AssertionError(f"seed {seed}: no compressible case drawn")


def _draw(rng: random.Random, g: torch.Generator, seed: int, generator: str, zeros: bool) -> Case:
    model = make_model(rng, g, square=generator == "transposed")
    some_zeros = rng.random() < (0.5 if model.products else 0.1)  # drawn either way: the same case but for them
    xs = _inputs(model, g, zeros=zeros and some_zeros)
    _keep_off_kinks(model, xs, rng, g)
    numpy, item = rng.random() < 0.15, rng.random() < 0.1
    rows, cols = _layout_of(model)
    jac = model.true_jacobian(xs)
    notes: dict[str, Any] = {"phis": model.phis, "numpy": numpy, "item": item}
    bug, clear, wrong = "none", True, False

    def entries(where: torch.Tensor) -> list[tuple[int, int]]:
        r, c = where.nonzero(as_tuple=True)
        return list(zip(r.tolist(), c.tolist()))

    def place(r: int, c: int) -> tuple[int, int, int, int]:
        """Global (row, column) -> (output, its element, input, its element)."""
        k = max(j for j in range(len(model.out_shapes)) if rows[j] <= r)
        i = max(j for j in range(len(model.in_shapes)) if cols[j] <= c)
        return k, r - rows[k], i, c - cols[i]

    def shift_entry(r: int, c: int, delta: float) -> None:
        """backward's entry (r, c) moved by ``delta`` (phi' and alpha included)."""
        k, rr, i, cc = place(r, c)
        alpha = model.alpha if model.alpha is not None else 1.0
        d = float(PHIS[model.phis[k]][1](model.z(xs, alpha)[k])[rr]) * alpha
        model.B[k][i][rr, cc] += delta / d

    nonzero = entries(jac.abs() > 0.05)
    if generator == "patterns" or not nonzero:
        pass
    elif generator == "wrong_element":
        r, c = rng.choice(nonzero)
        factor = rng.choice([1e-3, 0.5, 0.9, 1.1, 2.0, 10.0, 1e4])
        shift_entry(r, c, rng.choice([-1, 1]) * factor * _tol(jac[r, c]))
        bug, wrong, clear = f"entry x{factor} of its tolerance", factor > 1, factor <= 1e-3 or factor >= 10
    elif generator == "extra_entry":
        zero = entries((jac == 0) & (jac.abs().sum(1, keepdim=True) > 0))
        if zero:
            r, c = rng.choice(zero)
            v = rng.choice([1e-9, 0.5 * ATOL, 3 * ATOL, 1.0])
            k, rr, i, cc = place(r, c)
            alpha = model.alpha if model.alpha is not None else 1.0
            d = float(PHIS[model.phis[k]][1](model.z(xs, alpha)[k])[rr]) * alpha
            if d != 0:
                model.B[k][i][rr, cc] = v / d
                bug, wrong, clear = f"invented entry {v:g}", v > ATOL, v <= 1e-9 or v >= 1.0
    elif generator == "transposed":
        model.B[0][0] = model.A[0][0].t().clone()
        bug = "transposed block"
        wrong = not torch.allclose(model.A[0][0], model.B[0][0])
    elif generator == "sign_block":
        k, i = rng.randrange(len(model.out_shapes)), rng.randrange(len(model.in_shapes))
        b = model.B[k][i]
        r0, c0 = rng.randrange(b.shape[0]), rng.randrange(b.shape[1])
        b[r0 : r0 + rng.randint(1, 12), c0 : c0 + rng.randint(1, 12)] *= -1
        bug, wrong = "sign flipped in a block", not torch.equal(model.A[k][i], b)
    elif generator == "scaled_argument":
        i = rng.randrange(len(model.in_shapes))
        for k in range(len(model.out_shapes)):
            model.B[k][i] *= 2
        bug, wrong = f"argument {i} doubled", bool(jac[:, cols[i] : cols[i + 1]].abs().max() > 0.05)
    elif generator == "scaled_output":
        k = rng.randrange(len(model.out_shapes))
        for i in range(len(model.in_shapes)):
            model.B[k][i] *= 2
        bug, wrong = f"output {k} doubled", bool(jac[rows[k] : rows[k + 1]].abs().max() > 0.05)
    elif generator == "nonfinite":
        r, c = rng.choice(nonzero)
        k, rr, i, cc = place(r, c)
        model.nan = (rng.choice(["nan_where", "inf_times"]), k, rr, i, cc)
        bug, wrong = model.nan[0], True
    elif generator in ("cancel_pair", "group_rows", "misattributed", "omitted"):
        colours = colours_of(jac)
        if generator == "cancel_pair":  # +e and -e at two columns of one group
            by_group: dict[int, list[tuple[int, int]]] = {}
            for r, c in nonzero:
                by_group.setdefault(int(colours[c]), []).append((r, c))
            pairs = [v for v in by_group.values() if len({c for _, c in v}) > 1]
            if pairs:
                members = rng.choice(pairs)
                (r1, c1) = rng.choice(members)
                (r2, c2) = rng.choice([e for e in members if e[1] != c1])
                e = rng.choice([2.0, 50.0, 1e4]) * max(_tol(jac[r1, c1]), _tol(jac[r2, c2]))
                shift_entry(r1, c1, e)
                shift_entry(r2, c2, -e)
                bug, wrong = f"+-{e:.3g} in group {int(colours[c1])}", True
        elif generator == "group_rows":  # errors in the columns of one group only
            group = int(colours[rng.choice(nonzero)[1]])
            mine = [(r, c) for r, c in nonzero if int(colours[c]) == group]
            factor = rng.choice([0.5, 3.0, 100.0])
            for r, c in rng.sample(mine, min(len(mine), rng.randint(1, 20))):  # no two as far off: no ties
                shift_entry(r, c, rng.choice([-1, 1]) * factor * rng.uniform(1, 1.5) * _tol(jac[r, c]))
            bug, wrong, clear = f"group {group} x{factor} of tolerance", factor > 1, factor != 3.0
        else:
            # the gradient of an entry (r, c2) forgotten (omitted) or given to (r, c1) (misattributed):
            # large (far above the tolerance of every entry of its row: the unit move sees it)
            big = [(r, c) for r, c in nonzero if abs(float(jac[r, c])) > 100 * _tol(jac[r].abs().max())]
            if big:
                r, c2 = rng.choice(big)
                k, rr, i2, cc2 = place(r, c2)
                value = float(jac[r, c2])
                model.B[k][i2][rr, cc2] = 0.0
                others = [c for rr_, c in nonzero if rr_ == r and c != c2]
                if generator == "misattributed" and others:
                    shift_entry(r, rng.choice(others), value)
                    bug = f"entry {value:.3g} given to another column"
                else:
                    bug = f"entry {value:.3g} forgotten"
                wrong = True
    elif generator == "product_swapped":
        if not model.products:
            k, i, j = rng.randrange(len(model.out_shapes)), rng.randrange(len(model.in_shapes)), 0
            m = _numel(model.out_shapes[k])
            index, index2 = (torch.randint(0, _numel(model.in_shapes[t]), (m,), generator=g) for t in (i, j))
            model.products.append(Product(k, i, j, index, index2))
            _keep_off_kinks(model, xs, rng, g)
            jac = model.true_jacobian(xs)
        model.products[0].swapped = True
        diff = (model.true_jacobian(xs, backward=True) - jac).abs()
        bug = "product's factors swapped"
        wrong = bool((diff > 10 * (ATOL + RTOL * jac.abs())).any())
        clear = wrong or bool((diff < 0.5 * (ATOL + RTOL * jac.abs())).all())
    elif generator == "wrong_dphi":
        k = rng.randrange(len(model.out_shapes))
        rr = rng.randrange(_numel(model.out_shapes[k]))
        factor = rng.choice([1.0005, 0.5, -1.0, 3.0])
        model.dphi_bug = (k, rr, factor)
        row = jac[rows[k] + rr]
        big_enough = bool((row.abs() * abs(factor - 1) > 10 * (ATOL + RTOL * row.abs())).any())
        small_enough = bool((row.abs() * abs(factor - 1) < 0.5 * (ATOL + RTOL * row.abs())).all())
        bug, wrong, clear = f"phi' x{factor} at output {k}[{rr}]", big_enough, big_enough or small_enough
    if model.nan is None:  # what the bug does, read from both Jacobians: each entry's error in its tolerance
        excess = float(((model.true_jacobian(xs, backward=True) - jac).abs() / (ATOL + RTOL * jac.abs())).max())
        wrong, clear = excess > 1, excess > 10 or excess < 0.5
        notes["excess"] = float(f"{excess:.3g}")
    if rng.random() < 0.15:  # a tensor argument that needs no gradient (z_0 moved by less than the kinks' margin)
        model.const = torch.tensor(rng.uniform(-0.05, 0.05), dtype=F64)
    model.index_output = rng.random() < 0.1
    xs = tuple(x.t().contiguous().t() if x.dim() == 2 and rng.random() < 0.2 else x for x in xs)  # strided
    fn = model.function(numpy, item)
    args = model.make_args(tuple(x.requires_grad_() for x in xs))
    return Case(seed, fn, args, generator, bug, clear, wrong, not (numpy or item), notes, model)


# ------------------------------------------------------------------------------------ the checks


def _single_calls(monkeypatch: pytest.MonkeyPatch) -> None:
    """Every forward of the numerical side a single call, compressed or not: vmap's batched matmuls round
    each batch row differently (see ``test_batched_forwards_round_each_row_differently``), so the
    identity of the reports is asserted where a column's quotient is one number however it is made."""
    from gradcheck_cli.numerics import columns

    def never(state: Any, batched: Any, verify: Any) -> tuple[None, bool]:
        return None, False

    monkeypatch.setattr(columns, "try_batched", never)
    monkeypatch.setattr(compressed, "try_batched", never)


@pytest.fixture
def single_calls(monkeypatch: pytest.MonkeyPatch) -> None:
    _single_calls(monkeypatch)


def well_conditioned(case: Case) -> bool:
    """Whether the central differences' rounding is well below atol: else the batched forwards, which round
    each batch row differently, may put the same correct entry within atol compressed and beyond it
    element by element (seed 1861 of the sweep, forwards summing terms of 1e5 to ~1: an argument that
    passes element by element fails compressed), as single calls at other points would: the verdict is the
    rounding's there, and such cases are compared with single-call forwards only."""
    assert case.model is not None
    return case.model.rounding(case.inputs()) < ATOL  # (the estimate is about 10x the errors seen)


def forced(case: Case) -> Any:
    """``case`` checked compressed wherever the colouring allows it (see ``checks_of``)."""
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(compressed.Groups, "worthwhile", lambda self: self.coloured)
        return check(case.fn, case.args, seed=case.seed)


def checks_of(case: Case, used: dict[str, int]) -> tuple[Any, Any]:
    """``case`` checked compressed (asserted to be compressed) and element by element. Compression is
    forced where the colouring allows it, also where its weightings would cost more forwards than the
    columns one by one (``Groups.worthwhile`` then declines it in a real run): the acceptance rule is
    what this fuzz tests, whatever the cost."""
    before = used["n"]
    got = forced(case)
    assert used["n"] > before, f"not compressed: {case}"  # a fuzz that never compresses tests nothing
    after = used["n"]
    plain = check(case.fn, case.args, seed=case.seed, compress=False)
    assert used["n"] == after
    assert plain.status.value in ("pass", "fail"), f"{case}\n{plain}"
    if case.wrong and case.clear:
        assert plain.status.value == "fail", f"a clear bug passed element by element: {case}\n{plain}"
    if case.bug == "none":
        assert plain.status.value == "pass", f"a right Function failed element by element: {case}\n{plain}"
    return got, plain


def verdicts(result: Any) -> Any:
    """What a report says, without its numbers: the verdicts, and each argument's mismatched elements
    (the comparison for batched forwards, whose numbers differ in rounding: see ``_single_calls``)."""
    out = _rows(result)
    return (
        out["status"],
        out["error"],
        [
            (
                c["check"],
                c["status"],
                [
                    (r["name"], r["status"], r["reason"], r["mismatched"], r["mismatched_indices"], r["at_kinks"])
                    for r in c["inputs"]
                ],
            )
            for c in out["checks"]
        ],
    )


@pytest.mark.parametrize("seed", _seeds(FAST_SEEDS))
def test_fuzz_reports_are_identical_with_single_call_forwards(
    seed: int, used: dict[str, int], single_calls: None
) -> None:
    case = make_case(seed, zeros=False)
    got, plain = checks_of(case, used)
    assert_same_report(got, plain, str(case))


@pytest.mark.parametrize("seed", _seeds(FAST_SEEDS))
def test_fuzz_reports_agree_up_to_rounding_with_batched_forwards(seed: int, used: dict[str, int]) -> None:
    case = make_case(seed)
    got, plain = checks_of(case, used)
    if not well_conditioned(case):  # see test_fuzz_sweep
        return
    assert verdicts(got) == verdicts(plain), f"{case}\n--- compressed:\n{got}\n--- plain:\n{plain}"


@pytest.mark.slow
@pytest.mark.parametrize("seed", _seeds(SLOW_SEEDS))
def test_fuzz_sweep(seed: int, used: dict[str, int], monkeypatch: pytest.MonkeyPatch) -> None:
    """Both comparisons on hundreds of seeds."""
    case = make_case(seed)
    got, plain = checks_of(case, used)
    if well_conditioned(case):  # else the rounding of the batched forwards may reach atol: see ``well_conditioned``
        assert verdicts(got) == verdicts(plain), f"{case}\n--- compressed:\n{got}\n--- plain:\n{plain}"
    _single_calls(monkeypatch)
    case = make_case(seed, zeros=False)
    got, plain = checks_of(case, used)
    assert_same_report(got, plain, str(case))


def test_the_generators_cover_what_they_say(used: dict[str, int]) -> None:
    """Over the default seeds: every generator, right and wrong Functions, several inputs and outputs,
    a non-tensor argument, a 0-d or size-1 shape, products with exact zeros, a forward vmap refuses."""
    cases = [make_case(s) for s in FAST_SEEDS]
    assert {c.generator for c in cases} == set(GENERATORS)
    assert any(c.bug == "none" for c in cases) and sum(c.wrong for c in cases) >= len(cases) // 3
    tensors = [[a for a in c.args if isinstance(a, torch.Tensor)] for c in cases]
    assert any(len(t) > 1 for t in tensors) and any(len(t) < len(c.args) for t, c in zip(tensors, cases))
    assert any(c.model is not None and len(c.model.out_shapes) > 1 for c in cases)
    assert any(1 in a.shape or a.dim() == 0 for t in tensors for a in t)
    assert any(
        c.model is not None and c.model.products and any(bool((a == 0).any()) for a in t)
        for c, t in zip(cases, tensors)
    )
    assert any(not c.vmappable for c in cases)
    assert any(c.model is not None and c.model.const is not None for c in cases)
    assert any(c.model is not None and c.model.index_output for c in cases)
    assert any(not a.is_contiguous() for t in tensors for a in t)


def test_the_comparisons_see_one_changed_number(used: dict[str, int]) -> None:
    """Both comparisons fail on a report with one row's number changed, or its verdict."""
    case = make_case(1, "wrong_element")
    got = check(case.fn, case.args, seed=case.seed)
    report = _rows(got)
    for change in ("number", "status"):
        changed = _rows(got)
        if change == "number":
            row = next(r for r in changed["checks"][0]["inputs"] if r["max_abs_err"])
            row["max_abs_err"] *= 1.001
        else:
            changed["status"] = "pass" if report["status"] == "fail" else "fail"
        with pytest.raises(AssertionError):
            assert_same_report(report, changed, "changed")
        if change == "status":
            assert verdicts(report) != verdicts(changed)
    changed = _rows(got)
    changed["checks"][0]["inputs"][0]["mismatched"] += 1
    assert verdicts(report) != verdicts(changed)
    assert_same_report(report, _rows(got), "unchanged")
    assert verdicts(report) == verdicts(_rows(got))


# -------------------------------------------------------------------------- against torch's verdict


TORCH_SEEDS = range(0, 39, 2)


def torch_verdict(case: Case) -> bool:
    tensors = [a for a in case.args if isinstance(a, torch.Tensor)]
    extra = case.args[len(tensors) :]
    inputs = tuple(t.detach().clone().requires_grad_(t.requires_grad) for t in tensors)
    return bool(
        torch.autograd.gradcheck(lambda *xs: case.fn.apply(*xs, *extra), inputs, raise_exception=False, fast_mode=False)
    )


@pytest.mark.parametrize("seed", TORCH_SEEDS)
def test_fuzz_verdicts_agree_with_torch_gradcheck(seed: int, used: dict[str, int]) -> None:
    """Where the bug (or none) is far from the tolerance, the compressed check's verdict is torch's."""
    case = make_case(seed)
    if not case.clear:
        pytest.skip(f"the bug is near the tolerance: {case}")
    before = used["n"]
    got = forced(case)
    assert used["n"] > before
    assert (got.status.value == "pass") == torch_verdict(case), f"{case}\n{got}"


# ------------------------------------------------------------------- the discrepancies found (xfail)


def _forward_only_entry(model: Model, xs: tuple[torch.Tensor, ...], r: int, c: int, value: float) -> None:
    """A Jacobian entry ``value`` at global (r, c) in the forward only: backward (B) leaves it out."""
    rows, cols = _layout_of(model)
    k = max(j for j in range(len(model.out_shapes)) if rows[j] <= r)
    i = max(j for j in range(len(model.in_shapes)) if cols[j] <= c)
    alpha = model.alpha if model.alpha is not None else 1.0
    d = float(PHIS[model.phis[k]][1](model.z(xs, alpha)[k])[r - rows[k]]) * alpha
    mat = torch.zeros(_numel(model.out_shapes[k]), _numel(model.in_shapes[i]), dtype=F64)
    mat[r - rows[k], c - cols[i]] = value / d
    model.pieces.append(Piece("matmul", i, k, mat=mat))
    model.A[k][i] += mat


def omitted_below_row_tolerance(seed: int) -> tuple[Case, float]:
    """A random right Function, then one entry e added to its forward alone, at (r, j): j's column is in
    the group of a column k with an analytical entry |J[r, k]| >= 0.5 in the same row r, and e is
    above its own tolerance (atol + rtol |e|) but well within the row's (atol + rtol |J[r, k]|), even
    moved with weights up to 2."""
    rng = random.Random(seed)
    for _ in range(50):
        case = make_case(rng.randrange(10**6), "patterns", zeros=False)
        model = case.model
        assert model is not None
        xs = case.inputs()
        jac = model.true_jacobian(xs)
        colours = colours_of(jac)
        places = [
            (r, j, float(jac[r, k]))
            for r, k in zip(*(v.tolist() for v in (jac.abs() >= 0.5).nonzero(as_tuple=True)))
            for j in (colours == colours[k]).nonzero().view(-1).tolist()
            if j != k and jac[r, j] == 0
        ]
        if places:
            r, j, big = rng.choice(places)
            e = rng.choice([-1, 1]) * rng.uniform(3 * ATOL, (ATOL + RTOL * abs(big)) / 3)
            _forward_only_entry(model, xs, r, j, e)
            fn = model.function(numpy=False, item=False)
            args = model.make_args(tuple(x.requires_grad_() for x in xs))
            return Case(
                seed,
                fn,
                args,
                "omitted below the row's tolerance",
                f"entry {e:.3g} forgotten at ({r}, {j})",
                True,
                True,
                True,
                {"row": big},
                model,
            ), e
    raise RuntimeError("no place found")


@pytest.mark.parametrize("seed", range(6))
def test_fuzz_omitted_entries_below_the_rows_tolerance(seed: int, used: dict[str, int]) -> None:
    """A wrong pass until groups had to agree between their moves to within the rounding (6 of 6 seeds)."""
    case, _ = omitted_below_row_tolerance(seed)
    before = used["n"]
    got = check(case.fn, case.args, seed=seed)
    plain = check(case.fn, case.args, seed=seed, compress=False)
    if used["n"] != before + 1 or plain.status.value != "fail":  # not what this test is about: not an xfail
        raise RuntimeError(f"{case}: compressed {used['n'] - before}, element by element {plain.status.value}")
    assert got.status.value == plain.status.value, f"{case}\n--- compressed:\n{got}\n--- plain:\n{plain}"


class ForgetsCoupling(torch.autograd.Function):
    """y = x + 3e-4 roll(x, -1), backward forgetting the small coupling (returns g)."""

    @staticmethod
    def forward(ctx: Any, x: torch.Tensor) -> torch.Tensor:
        return x + 3e-4 * x.roll(-1)

    @staticmethod
    def backward(ctx: Any, g: torch.Tensor) -> torch.Tensor:
        return g.clone()


def test_a_forgotten_small_coupling_fails_compressed_as_element_by_element(
    monkeypatch: pytest.MonkeyPatch, used: dict[str, int]
) -> None:
    """At the default sizes (a Jacobian of 1000 x 1000 is compressed without patching SMALL); torch's
    gradcheck fails it too."""
    from gradcheck_cli.numerics import jacobians

    monkeypatch.setattr(jacobians, "SMALL", 2**17)
    x = torch.randn(1000, dtype=F64, generator=torch.Generator().manual_seed(0)).requires_grad_()
    plain = check(ForgetsCoupling, (x,), compress=False)
    if plain.status.value != "fail" or torch.autograd.gradcheck(
        ForgetsCoupling.apply, (x[:40].detach().clone().requires_grad_(),), raise_exception=False
    ):
        raise RuntimeError("expected element by element and torch to fail it")
    got = check(ForgetsCoupling, (x,))
    if used["n"] != 1:
        raise RuntimeError("not compressed")
    assert got.status.value == "fail", str(got)


class MisattributedAt7(torch.autograd.Function):
    """y = x + b e_7 x_8 (output 7 depends on x_8 too), backward giving b to x_7 instead of x_8."""

    b = 0.0

    @staticmethod
    def forward(ctx: Any, x: torch.Tensor) -> torch.Tensor:
        y = x.clone()
        y[7] = y[7] + MisattributedAt7.b * x[8]
        return y

    @staticmethod
    def backward(ctx: Any, g: torch.Tensor) -> torch.Tensor:
        grad = g.clone()
        grad[7] = grad[7] + MisattributedAt7.b * g[7]
        return grad


def test_a_gradient_given_to_the_wrong_element_is_caught_for_every_seed(used: dict[str, int]) -> None:
    """A wrong pass for 11 of 40 check seeds until groups had to agree between their moves to within the
    rounding (the unit move cancels the error; the weighted one moved it by b |1 - w_8 / w_7|, judged
    against the row's tolerance)."""
    x = torch.randn(300, dtype=F64, generator=torch.Generator().manual_seed(0)).requires_grad_()
    MisattributedAt7.b = 5 * (ATOL + RTOL * 1.0)
    missed = []
    for seed in range(40):
        plain = check(MisattributedAt7, (x,), seed=seed, compress=False)
        got = check(MisattributedAt7, (x,), seed=seed)
        if plain.status.value != "fail":
            raise RuntimeError("expected element by element to fail it")
        if got.status.value != "fail":
            missed.append(seed)
    if used["n"] != 40:
        raise RuntimeError("not compressed")
    assert not missed, f"passed compressed with check seeds {missed} of 40"


class UnusedInput(torch.autograd.Function):
    """sin(M x) and an input ``u`` it does not depend on, whose gradient backward invents at one element."""

    M = torch.randn(142, 54, dtype=F64, generator=torch.Generator().manual_seed(0)) * (
        torch.rand(142, 54, generator=torch.Generator().manual_seed(1)) < 0.08
    )

    @staticmethod
    def forward(ctx: Any, x: torch.Tensor, u: torch.Tensor) -> torch.Tensor:
        ctx.save_for_backward(x)
        return torch.sin(UnusedInput.M @ x.reshape(-1)).reshape(1, 142)

    @staticmethod
    def backward(ctx: Any, g: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        (x,) = ctx.saved_tensors
        z = UnusedInput.M @ x.reshape(-1)
        gx = (UnusedInput.M.t() @ (g.reshape(-1) * torch.cos(z))).reshape(x.shape)
        gu = torch.zeros(65, 1, dtype=F64)
        gu[16] = 3e-5
        return gx, gu


def test_batched_forwards_round_each_row_differently() -> None:
    """Why the reports are compared up to rounding where the forwards are batched: the rows of one
    batched matmul of identical inputs differ in their last bits (this CPU's BLAS)."""
    m = torch.randn(69, 115, dtype=F64, generator=torch.Generator().manual_seed(0))
    xs = torch.randn(115, dtype=F64, generator=torch.Generator().manual_seed(1)).expand(8, -1).contiguous()
    ys = xs @ m.t()  # what a vmapped m @ x may become
    if bool((ys == ys[0]).all()) and torch.equal(ys[0], m @ xs[0]):
        pytest.skip("this BLAS rounds every batch row alike")
    assert not bool((ys == ys[0]).all()) or not torch.equal(ys[0], m @ xs[0])


def test_an_unused_input_gets_the_same_diagnosis_with_batched_forwards(used: dict[str, int]) -> None:
    """Element by element, the batched forwards (Columns._batched_columns) give an input the outputs do not
    depend on a numerical gradient of rounding noise (about 1e-10); the compressed groups give exact zeros.
    The diagnosis said '1 of 65 elements are wrong' against 'the outputs do not depend on it' until a
    numerical gradient below atol / 1000 counted as zero for it (diagnosis.ROUNDING)."""
    g = torch.Generator().manual_seed(2)
    x, u = torch.randn(27, 2, dtype=F64, generator=g).requires_grad_(), torch.randn(65, 1, dtype=F64, generator=g)
    args = (x, u.requires_grad_())
    got, plain = check(UnusedInput, args), check(UnusedInput, args, compress=False)
    if used["n"] != 1 or got.status.value != "fail" or plain.status.value != "fail":
        raise RuntimeError("expected both to fail, the first compressed")
    assert got.checks[0].inputs[1].diagnosis == plain.checks[0].inputs[1].diagnosis


def test_an_unused_input_gets_the_same_report_with_single_call_forwards(
    used: dict[str, int], single_calls: None
) -> None:
    g = torch.Generator().manual_seed(2)
    x, u = torch.randn(27, 2, dtype=F64, generator=g).requires_grad_(), torch.randn(65, 1, dtype=F64, generator=g)
    args = (x, u.requires_grad_())
    got, plain = check(UnusedInput, args), check(UnusedInput, args, compress=False)
    assert used["n"] == 1 and got.status.value == "fail"
    assert_same_report(got, plain, "UnusedInput")
    assert "do not depend on it" in str(got.checks[0].inputs[1].diagnosis)


class SinProduct(torch.autograd.Function):
    """sin(z x), with a wrong gradient of z at element 5 (so that z's error map is reported)."""

    @staticmethod
    def forward(ctx: Any, z: torch.Tensor, x: torch.Tensor) -> torch.Tensor:
        ctx.save_for_backward(z, x)
        return torch.sin(z * x)

    @staticmethod
    def backward(ctx: Any, g: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        z, x = ctx.saved_tensors
        c = g * torch.cos(z * x)
        gz = c * x
        gz[5] = 2 * gz[5]
        return gz, c * z


def test_an_exactly_zero_factor_gives_the_same_numbers(used: dict[str, int], single_calls: None) -> None:
    g = torch.Generator().manual_seed(0)
    z, x = torch.randn(2, 1000, dtype=F64, generator=g)
    z[::10] = 0.0
    args = (z.requires_grad_(), x.requires_grad_())
    got, plain = check(SinProduct, args), check(SinProduct, args, compress=False)
    if (
        used["n"] != 1
        or got.status.value != "fail"
        or _rows(got)["checks"][0]["inputs"][1] != _rows(plain)["checks"][0]["inputs"][1]
    ):
        raise RuntimeError("expected both to fail, the first compressed, x's rows the same")
    # A known rounding discrepancy, stated without being required: where z_i = 0, dy_i/dx_i = 0 leaves x_i's
    # column empty, coloured with z_i's group: their joint unit move computes (x_i + eps) eps - (x_i - eps)(-eps),
    # which can differ from z_i's own column's quotient in the last bits (compressed.Groups._accepted takes it as
    # that column's). So the verdicts and counts agree exactly, z's numbers to the last bits.
    assert verdicts(got) == verdicts(plain)
    for a, b in zip(got.checks[0].inputs, plain.checks[0].inputs):
        assert determined(a) == determined(b)
        for name in ("max_abs_err", "max_rel_err", "analytical", "numerical"):
            assert getattr(a, name) == pytest.approx(getattr(b, name), rel=1e-12, abs=1e-15), (a.name, name)


def test_an_ill_conditioned_case_differs_with_batched_forwards_only_where_rounding_decides(
    used: dict[str, int],
) -> None:
    """A known rounding discrepancy, stated without being required. Where the central differences' rounding is
    near atol (seed 1861: forwards summing terms of 1e5 to ~1), the batched forwards' rounding, which differs
    between the compressed groups (Groups._batched) and the columns (Columns._batched_columns), can decide an
    argument's verdict: on some CPUs arg1 passes element by element (largest error 2.06e-05 of a tolerance of
    2.5e-3) and fails compressed (8 entries of 0 against -2.9e-05); on others (AVX-512) both pass; with
    single-call forwards both agree everywhere. So: the verdicts agree, or they differ only in arguments whose
    every error, on either side, is within the case's rounding estimate."""
    case = make_case(1861)
    if well_conditioned(case):
        raise RuntimeError("expected sweep seed 1861 to be the ill-conditioned case it was")
    got, plain = checks_of(case, used)
    if verdicts(got) == verdicts(plain):
        return
    assert case.model is not None
    noise = case.model.rounding(case.inputs())
    pairs = list(zip(got.checks, plain.checks))
    assert [(c.check) for c, _ in pairs] == [p.check for p in plain.checks] and len(got.checks) == len(plain.checks)
    for compressed_check, plain_check in pairs:
        for a, b in zip(compressed_check.inputs, plain_check.inputs):
            if (a.status, a.mismatched) != (b.status, b.mismatched):
                assert max(a.max_abs_err or 0.0, b.max_abs_err or 0.0) <= noise, f"{a}\n{b}\nrounding {noise}"


@pytest.mark.slow
@pytest.mark.parametrize("seed", SLOW_SEEDS[::3])
def test_fuzz_sweep_verdicts_agree_with_torch_gradcheck(seed: int, used: dict[str, int]) -> None:
    test_fuzz_verdicts_agree_with_torch_gradcheck(seed, used)


# --------------------------------------- large outputs, forgotten couplings, weight coincidences (issue 27)


FACTORS = (1.5, 2.0, 10.0, 100.0)  # the forgotten coupling, in atol
COUPLING_SEEDS = range(int(os.environ.get("GRADCHECK_COUPLING_SEEDS", "200")))  # the slow sweep's


@dataclass
class Coupled:
    """A Function that backward gets wrong at one entry by ``factor`` atol, and its inputs."""

    fn: Any
    args: tuple[Any, ...]
    label: str


def coupled_case(seed: int) -> Coupled:
    """Seed -> either an elementwise map a x (float64 or complex128) with a coupling h x[k] added to y[r]
    and forgotten by backward, beside one large constant output element or a large second output
    (1e4 to 1e8), or a 32 x 32 Linear layer forgetting h x[i1, j1] in y[i0, j0] (two of its columns in one
    group: a weight coincidence would hide it)."""
    rng = random.Random(seed)
    g = torch.Generator().manual_seed(seed)
    h = rng.choice(FACTORS) * ATOL * rng.choice([-1, 1])
    if rng.random() < 0.3:
        i0, j0, i1 = rng.randrange(32), rng.randrange(32), rng.randrange(32)
        i1 = (i0 + 1 + i1 % 31) % 32
        j1 = rng.randrange(32)

        class LinearForgets(torch.autograd.Function):
            @staticmethod
            def forward(ctx: Any, x: torch.Tensor, w: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
                ctx.save_for_backward(x, w)
                y = x @ w.t() + b
                y[i0, j0] = y[i0, j0] + h * x[i1, j1]
                return y

            @staticmethod
            def backward(ctx: Any, gy: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
                x, w = ctx.saved_tensors
                return gy @ w, gy.t() @ x, gy.sum(0)

        args = tuple(torch.randn(*s, dtype=F64, generator=g).requires_grad_() for s in ((32, 32), (32, 32), (32,)))
        return Coupled(LinearForgets, args, f"linear forgets {h:.3g} x[{i1},{j1}] in y[{i0},{j0}]")
    n = rng.randrange(100, 400)
    dtype = rng.choice([F64, F64, torch.complex128])
    a = rng.choice([1.0, 3.0, 10.0])
    r, k = rng.randrange(n), rng.randrange(n)
    k = k if k != r else (k + 1) % n
    big = 10 ** rng.uniform(4, 8)
    large = rng.choice(["constant", "second", "none"])

    class Forgets(torch.autograd.Function):
        @staticmethod
        def forward(ctx: Any, x: torch.Tensor) -> Any:
            y = a * x
            y[r] = y[r] + h * x[k]
            if large == "constant":
                return torch.cat([y, torch.full((1,), big, dtype=x.dtype)])
            return (y, big + x[:1]) if large == "second" else y

        @staticmethod
        def backward(ctx: Any, gy: torch.Tensor, *rest: torch.Tensor) -> torch.Tensor:
            grad = a * gy[:n]
            if rest:
                grad[:1] += rest[0]
            return grad

    x = torch.randn(n, dtype=dtype, generator=g).requires_grad_()
    return Coupled(Forgets, (x,), f"{dtype} {a} x, forgets {h:.3g} x[{k}] in y[{r}], {large} output {big:.3g}")


def coupled_verdicts(seed: int, used: dict[str, int], with_torch: bool) -> tuple[str, str, Optional[bool]]:
    """The compressed verdict (asserted compressed), element by element's, and torch's (None: not asked)."""
    case = coupled_case(seed)
    before = used["n"]
    got = check(case.fn, case.args, seed=seed).status.value
    assert used["n"] == before + 1, f"not compressed: {case.label}"
    plain = check(case.fn, case.args, seed=seed, compress=False).status.value
    judged = None
    if with_torch:
        inputs = tuple(t.detach().clone().requires_grad_() for t in case.args)
        judged = bool(torch.autograd.gradcheck(case.fn.apply, inputs, raise_exception=False, fast_mode=False))
    return got, plain, judged


@pytest.mark.parametrize("seed", range(12))
def test_a_forgotten_coupling_beside_large_outputs_gets_the_verdict_of_element_by_element(
    seed: int, used: dict[str, int]
) -> None:
    got, plain, judged = coupled_verdicts(seed, used, with_torch=seed % 3 == 0)
    assert plain == "fail" or judged is None or not judged  # the bug is above the tolerance
    assert got == plain, coupled_case(seed).label
    if judged is not None:
        assert (got == "pass") == judged, coupled_case(seed).label


@pytest.mark.slow
def test_the_coupling_sweep_has_no_wrong_pass(used: dict[str, int]) -> None:
    """COUPLING_SEEDS full checks, each compressed and element by element (and every fourth by torch's
    gradcheck): no compressed pass where either fails. (The acceptance predicate itself is swept over 10^6
    weight draws in test_compressed_bound.py.)"""
    wrong, against_torch, judged_n = [], [], 0
    for seed in COUPLING_SEEDS:
        got, plain, judged = coupled_verdicts(seed, used, with_torch=seed % 4 == 0)
        if got == "pass" and plain == "fail":
            wrong.append(seed)
        if judged is not None:
            judged_n += 1
            if got == "pass" and not judged:
                against_torch.append(seed)
    assert judged_n > 0
    assert not wrong and not against_torch, (wrong, against_torch)
