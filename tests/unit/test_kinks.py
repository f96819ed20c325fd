"""``kinks.examine``: a mismatch at a kink, a tie or a domain edge told apart from a wrong gradient.

Every Function here is defined in this file with a backward that is right or deliberately wrong.
The expected verdicts come from derivatives worked out by hand (left/right derivatives of relu,
abs, clamp and max at their corners, 1/(2 sqrt x) and 1/x at the edge of the domain), and the
agreement table at the end runs ``torch.autograd.gradcheck`` on the same inputs: torch reports
every kink and edge as a failure, and our verdict differs from torch's exactly where the kink or
the edge explains the mismatch.
"""

from __future__ import annotations

import pytest
import torch

from gradcheck_cli.numerics import as_tuple, is_float_tensor, real_flat, real_numel
from gradcheck_cli.numerics.kinks import Verdict, examine, resample_hint

F64 = torch.float64
TOL = {"atol": 1e-5, "rtol": 1e-3}  # torch.autograd.gradcheck's defaults
EPS = 1e-6


try:  # tests/ on sys.path (rootdir-style collection) or tests/ as a package
    from corpus import one_input_function as fn
except ImportError:  # pragma: no cover
    from tests.corpus import one_input_function as fn


relu = lambda x: torch.relu(x)  # noqa: E731
ReLU = fn(relu, lambda x, g: g * (x > 0))  # derivative 0 at the kink: a subgradient
ReLUGe = fn(relu, lambda x, g: g * (x >= 0))  # derivative 1 at the kink: also a subgradient
ReLUTwoAtKink = fn(relu, lambda x, g: g * torch.where(x == 0, 2.0, (x > 0).double()))  # 2 at the kink: wrong
ReLUDouble = fn(relu, lambda x, g: 2 * g * (x > 0))  # 2 wherever x > 0: wrong away from the kink
Abs = fn(torch.abs, lambda x, g: g * torch.sign(x))  # sign(0) = 0
AbsOne = fn(torch.abs, lambda x, g: g * torch.where(x >= 0, 1.0, -1.0))  # 1 at 0: a subgradient
AbsThree = fn(torch.abs, lambda x, g: g * torch.where(x == 0, 3.0, torch.sign(x)))  # outside [-1, 1]
clamp = lambda x: x.clamp(-1.0, 1.0)  # noqa: E731
Clamp = fn(clamp, lambda x, g: g * ((x >= -1) & (x <= 1)))
ClampFlip = fn(clamp, lambda x, g: g * torch.where(x.abs() == 1, -1.0, (x.abs() < 1).double()))
Sqrt = fn(torch.sqrt, lambda x, g: g * 0.5 / x.sqrt())
SqrtDouble = fn(torch.sqrt, lambda x, g: g / x.sqrt())
Log = fn(torch.log, lambda x, g: g / x)
LogDouble = fn(torch.log, lambda x, g: 2 * g / x)
SinDouble = fn(torch.sin, lambda x, g: 2 * g * x.cos())
SquarePlusOne = fn(lambda x: x * x, lambda x, g: g * (2 * x + 1))  # smooth at 0 (f' = 0), backward 1


def _one_hot_max(x, g):
    return g * (torch.arange(x.numel()) == x.argmax()).double()


Max = fn(lambda x: x.max(), _one_hot_max)  # the first maximum takes the whole gradient
MaxSplit = fn(lambda x: x.max(), lambda x, g: g * (x == x.max()) / (x == x.max()).sum())
MaxDouble = fn(lambda x: x.max(), lambda x, g: 2 * _one_hot_max(x, g))

# complex z = a + ib -> w = relu(b) + i a. With PyTorch's convention (grad = dL/da + i dL/db) and
# g = dL/du + i dL/dv for w = u + iv: dL/da = g.imag, dL/db = g.real * relu'(b).
ReluImag = fn(
    lambda z: torch.complex(torch.relu(z.imag), z.real), lambda z, g: torch.complex(g.imag, g.real * (z.imag > 0))
)
ReluImagTwo = fn(
    lambda z: torch.complex(torch.relu(z.imag), z.real), lambda z, g: torch.complex(g.imag, 2 * g.real * (z.imag >= 0))
)
ReluImagSignFlip = fn(
    lambda z: torch.complex(torch.relu(z.imag), z.real),  # d/da wrong, smooth there
    lambda z, g: torch.complex(-g.imag, g.real * (z.imag > 0)),
)


def three_outputs(abs_slope) -> type:
    """(relu(x), argmax (an integer output), |x|): a kink in both float outputs at 0."""

    class ThreeOutputs(torch.autograd.Function):
        @staticmethod
        def forward(ctx, x):
            ctx.save_for_backward(x)
            return torch.relu(x), x.argmax(), x.abs()

        @staticmethod
        def backward(ctx, g_relu, _g_int, g_abs):
            (x,) = ctx.saved_tensors
            return g_relu * (x > 0) + g_abs * abs_slope(x)

    return ThreeOutputs


ThreeOutputs = three_outputs(torch.sign)
ThreeOutputsWrongAbs = three_outputs(lambda x: torch.where(x == 0, 2.0, torch.sign(x)))


# ------------------------------------------------------------------------ helpers


def column(f, x: torch.Tensor, j: int, positions: list[int]) -> torch.Tensor:
    """The analytical Jacobian column of real element j of x, from f's own backward, one entry per
    realified output entry at ``positions`` (PyTorch's convention for complex tensors)."""
    leaf = x.detach().clone().requires_grad_(True)
    outs = as_tuple(f.apply(leaf))
    col = []
    for p in positions:
        for m in range(real_numel(outs[p])):
            g = torch.zeros_like(outs[p])
            real_flat(g)[m] = 1
            (gx,) = torch.autograd.grad(outs[p], leaf, g, retain_graph=True)
            col.append(float(real_flat(gx.contiguous())[j]))
    return torch.tensor(col, dtype=F64)


def verdict(f, x: torch.Tensor, j: int, positions=None, analytical=None, eps: float = EPS) -> Verdict:
    """examine() on element j of a copy of x, with f's backward as the analytical side."""
    values = [x.detach().clone()]
    if positions is None:
        positions = [p for p, o in enumerate(as_tuple(f.apply(values[0]))) if is_float_tensor(o)]
    a = column(f, x, j, positions) if analytical is None else torch.tensor(analytical, dtype=F64)
    return examine(lambda vals: f.apply(*vals), values, values[0], j, eps, positions, a, index_text=f"x[{j}]", **TOL)


def t(*values, dtype=F64) -> torch.Tensor:
    return torch.tensor(values, dtype=dtype)


def torch_passes(f, x: torch.Tensor) -> bool:
    return torch.autograd.gradcheck(
        f.apply, (x.detach().clone().requires_grad_(True),), eps=EPS, raise_exception=False, **TOL
    )


# ------------------------------------------------------------------------ kinks


@pytest.mark.parametrize("f, explained", [(ReLU, True), (ReLUGe, True), (ReLUTwoAtKink, False)])
def test_relu_at_its_kink(f, explained):
    v = verdict(f, t(0.5, 0.0, -1.0), 1)
    assert (v.kind, v.explained) == ("kink", explained)
    backward_gives = {ReLU: "0", ReLUGe: "1", ReLUTwoAtKink: "2"}[f]
    assert v.text == (
        f"x[1] = 0 is a kink or tie (output 0 [1]): one-sided derivatives 0 and 1, backward gives {backward_gives}"
    )


@pytest.mark.parametrize(
    "a, explained",
    [([0.0], True), ([1.0], True), ([0.25], True), ([2.0], False), ([-0.01], False), ([float("nan")], False)],
)
def test_any_value_between_the_one_sided_derivatives_is_a_subgradient(a, explained):
    v = verdict(fn(lambda x: torch.relu(x).sum(), None), t(0.0), 0, positions=[0], analytical=a)
    assert (v.kind, v.explained) == ("kink", explained)


@pytest.mark.parametrize("f, explained", [(Abs, True), (AbsOne, True), (AbsThree, False)])
def test_abs_at_zero(f, explained):
    v = verdict(f, t(0.0), 0)
    assert (v.kind, v.explained) == ("kink", explained)
    assert "one-sided derivatives -1 and 1" in v.text


@pytest.mark.parametrize("f, explained", [(Clamp, True), (ClampFlip, False)])
@pytest.mark.parametrize("j, left, right", [(0, "0", "1"), (2, "1", "0")])
def test_clamp_at_both_corners(f, explained, j, left, right):
    v = verdict(f, t(-1.0, 0.3, 1.0), j)
    assert (v.kind, v.explained) == ("kink", explained)
    assert f"one-sided derivatives {left} and {right}" in v.text


@pytest.mark.parametrize(
    "f, j, explained",
    [
        (Max, 0, True),
        (Max, 1, True),
        (MaxSplit, 0, True),
        (MaxSplit, 1, True),
        (MaxDouble, 0, False),
        (MaxDouble, 1, True),
    ],
)
def test_max_of_tied_values(f, j, explained):
    # max(x0, x1, 0.5) with x0 = x1 = 1: moving x_j down leaves the max at 1 (left derivative 0),
    # moving it up raises it (right derivative 1); any share in [0, 1] is a subgradient. The
    # one-hot backwards give x1 nothing (0: a subgradient); MaxDouble gives x0 2 (not one)
    v = verdict(f, t(1.0, 1.0, 0.5), j)
    assert (v.kind, v.explained) == ("kink", explained)
    assert "one-sided derivatives 0 and 1" in v.text


def test_a_kink_within_eps_of_x_is_found_with_smaller_steps():
    # relu at x = -eps/2: differentiable there (f' = 0), but the central difference with eps sees
    # the kink at +eps/2 and says 0.25
    assert verdict(ReLU, t(-5e-7), 0) == Verdict(
        "kink",
        True,
        "x[0] = -5e-07 is within eps of a kink (or of curvature too strong for this eps): "
        "with smaller steps both sides give 0, backward gives 0",
    )
    v = verdict(ReLU, t(-5e-7), 0, analytical=[1.0])
    assert (v.kind, v.explained) == ("smooth", False)
    assert "the left and right derivatives agree on 0, backward gives 1" in v.text


# ------------------------------------------------------------------------ domain edges


@pytest.mark.parametrize(
    "f, explained, derivative",
    [(Sqrt, True, "1581"), (SqrtDouble, False, "1581"), (Log, True, "9.998e+06"), (LogDouble, False, "9.998e+06")],
)
def test_domain_edge_uses_the_one_sided_difference_of_the_side_inside(f, explained, derivative):
    # x = 1e-7 < eps: f(x - eps) is NaN; sqrt'(1e-7) = 0.5 / sqrt(1e-7) = 1581.1, log'(1e-7) = 1e7
    v = verdict(f, t(1e-7, 0.5), 0)
    assert (v.kind, v.explained) == ("domain_edge", explained)
    assert v.text.startswith(
        "x[0] = 1e-07 is at the edge of the domain: f(x - eps) is not finite; "
        f"the one-sided derivative from the right (output 0 [0]) is {derivative}"
    )


def test_domain_edge_on_the_right():
    # sqrt(-x) at x = -1e-7: f(x + eps) is NaN; d/dx sqrt(-x) = -0.5 / sqrt(1e-7) = -1581.1
    NegSqrt = fn(lambda x: (-x).sqrt(), lambda x, g: -0.5 * g / (-x).sqrt())
    v = verdict(NegSqrt, t(-1e-7), 0)
    assert (v.kind, v.explained) == ("domain_edge", True)
    assert "f(x + eps) is not finite; the one-sided derivative from the left is -1581" in v.text
    assert not verdict(NegSqrt, t(-1e-7), 0, analytical=[1581.14]).explained


def test_an_infinite_derivative_at_the_edge_is_not_explained():
    v = verdict(Sqrt, t(0.0), 0)  # sqrt'(0) = inf; the right differences grow as the step shrinks
    assert (v.kind, v.explained) == ("domain_edge", False)
    assert "do not settle" in v.text


@pytest.mark.parametrize("x, shown", [(0.0, "-inf"), (-1.0, "nan")])
def test_f_not_finite_at_x_itself(x, shown):
    v = verdict(Log, t(x), 0)
    assert v == Verdict(
        "domain_edge", False, f"x[0] = {x:g}: f(x) is not finite ({shown}), so no derivative can be checked there"
    )


def test_both_steps_outside_the_domain():
    Narrow = fn(lambda x: torch.sqrt(1e-14 - x * x), lambda x, g: -g * x / torch.sqrt(1e-14 - x * x))
    v = verdict(Narrow, t(0.0), 0)
    assert (v.kind, v.explained) == ("domain_edge", False)
    assert "f(x - eps) and f(x + eps) are not finite" in v.text


# ------------------------------------------------------------------------ smooth functions, wrong gradients


@pytest.mark.parametrize(
    "f, x, text",
    [
        (SinDouble, 0.3, "the left and right differences agree on 0.9553, backward gives 1.911"),
        (SquarePlusOne, 0.0, "the left and right differences agree on 0, backward gives 1"),
        (ReLUDouble, 0.3, "the left and right differences agree on 1, backward gives 2"),
    ],
)
def test_wrong_gradient_at_a_smooth_point_stays_wrong(f, x, text):
    v = verdict(f, t(x), 0)
    assert v == Verdict("smooth", False, f"x[0] = {x:g} is not at a kink or domain edge: {text}")


def test_strong_curvature_is_judged_with_smaller_steps():
    # sqrt at x = 1e-5: the central difference with eps is off by eps^2 / (8 x^2) = 1.25e-3 (> rtol)
    assert not torch_passes(Sqrt, t(1e-5))
    assert verdict(Sqrt, t(1e-5), 0).explained
    v = verdict(SqrtDouble, t(1e-5), 0)
    assert (v.kind, v.explained) == ("smooth", False)


def test_a_jump_is_judged_by_the_side_that_settles():
    # floor at 1: the left differences (f(1) - f(1 - h)) / h = 1 / h grow without bound, the right
    # ones are 0; backward 0 is floor's derivative from the right, backward 1 is nobody's
    Floor = fn(torch.floor, lambda x, g: g * 0)
    v = verdict(Floor, t(1.0), 0)
    assert v == Verdict(
        "kink",
        True,
        "x[0] = 1 is at a jump or kink: the left differences do not settle; "
        "the right derivative is 0, backward gives 0",
    )
    assert not verdict(Floor, t(1.0), 0, analytical=[1.0]).explained


def test_noise_that_never_settles_leaves_the_central_difference_standing():
    gen = torch.Generator().manual_seed(0)
    Noisy = fn(lambda x: x + 1e-6 * torch.rand(x.shape, generator=gen, dtype=F64), lambda x, g: g)
    v = verdict(Noisy, t(0.5), 0, analytical=[1.0])
    assert (v.kind, v.explained) == ("smooth", False)
    assert "do not settle" in v.text


# ------------------------------------------------------------------------ complex and several outputs


@pytest.mark.parametrize("f, explained", [(ReluImag, True), (ReluImagTwo, False)])
def test_complex_imaginary_part_at_a_kink(f, explained):
    z = torch.tensor([0.7 + 0.0j, -0.3 + 0.5j], dtype=torch.complex128)
    v = verdict(f, z, 1)  # j = 1: the imaginary part of z[0], which sits at relu's kink
    assert (v.kind, v.explained) == ("kink", explained)
    backward_gives = "0" if explained else "2"
    assert v.text == (
        "x[1] (imaginary part) = 0 is a kink or tie (output 0 [0]): one-sided derivatives 0 and 1, "
        f"backward gives {backward_gives}"
    )


def test_complex_real_part_is_smooth():
    z = torch.tensor([0.7 + 0.0j, -0.3 + 0.5j], dtype=torch.complex128)
    v = verdict(ReluImagSignFlip, z, 0)  # d w / d a = i: realified (0, 1), backward says (0, -1)
    assert v == Verdict(
        "smooth",
        False,
        "x[0] (real part) = 0.7 is not at a kink or domain edge "
        "(output 0 [0], imaginary part): the left and right differences "
        "agree on 1, backward gives -1",
    )


@pytest.mark.parametrize(
    "f, positions, explained",
    [(ThreeOutputs, [0, 2], True), (ThreeOutputsWrongAbs, [0, 2], False), (ThreeOutputsWrongAbs, [0], True)],
)
def test_several_outputs(f, positions, explained):
    v = verdict(f, t(0.4, 0.0, -0.6), 1, positions=positions)
    assert (v.kind, v.explained) == ("kink", explained)
    if not explained:  # the entry that breaks it is named: |x| at x[1], where backward gives 2
        assert v.text.endswith("(output 2 [1]): one-sided derivatives -1 and 1, backward gives 2")


def test_analytical_of_the_wrong_length_is_refused():
    with pytest.raises(ValueError, match="analytical has 1 entries, the outputs at \\[0\\] have 3"):
        verdict(ReLU, t(0.5, 0.0, -1.0), 1, analytical=[0.0])


# ------------------------------------------------------------------------ the input is restored


def bits(x: torch.Tensor) -> torch.Tensor:
    real = torch.view_as_real(x) if x.is_complex() else x
    return real.contiguous().view(torch.int64 if real.dtype == F64 else torch.int32).clone()


@pytest.mark.parametrize(
    "x, j",
    [
        (t(-0.0, 1.0 / 3.0, 1e-300), 0),
        (t(-0.0, 1.0 / 3.0, 1e-300), 1),
        (t(0.1, 0.0, 0.7, dtype=torch.float32), 1),
        (torch.tensor([0.1 + 0.0j, -0.0 - 0.3j], dtype=torch.complex128), 3),
        (torch.tensor([[1.0, 0.0], [1.0 / 7.0, -0.0]], dtype=F64).t(), 3),  # not contiguous
    ],
)
def test_input_restored_bit_exactly(x, j):
    before = bits(x)
    examine(
        lambda vals: torch.relu(torch.view_as_real(vals[0]) if vals[0].is_complex() else vals[0]),
        [x],
        x,
        j,
        EPS,
        [0],
        torch.zeros(real_numel(x), dtype=F64),
        index_text="x",
        **TOL,
    )
    assert torch.equal(bits(x), before)


@pytest.mark.parametrize("fail_on", [1, 2, 3, 5])
def test_input_restored_when_the_forward_raises(fail_on):
    x = t(0.1, -0.0, 1.0 / 3.0)
    before, calls = bits(x), []

    def call(vals):
        calls.append(float(vals[0][1]))
        if len(calls) == fail_on:
            raise RuntimeError("user forward failed")
        return torch.relu(vals[0])

    with pytest.raises(RuntimeError, match="user forward failed"):
        examine(call, [x], x, 1, EPS, [0], torch.zeros(3, dtype=F64), index_text="x[1]", **TOL)
    assert torch.equal(bits(x), before)
    assert len(calls) == fail_on and (fail_on == 1 or calls[-1] != 0.0)  # it raised while x[1] was moved


def test_resample_hint_names_the_argument_and_both_remedies():
    hint = resample_hint("weight")
    assert "'weight'" in hint and "avoid: [[" in hint and "resample: true" in hint and "\n" not in hint


# ------------------------------------------------------------------------ against torch.autograd.gradcheck

AGREEMENT = [  # name, Function, x, j; torch's verdict on the whole tensor; our kind, explained
    ("relu at 0, f'(0)=0", ReLU, t(0.5, 0.0, -1.0), 1, False, "kink", True),
    ("relu at 0, f'(0)=1", ReLUGe, t(0.5, 0.0, -1.0), 1, False, "kink", True),
    ("relu at 0, f'(0)=2", ReLUTwoAtKink, t(0.5, 0.0, -1.0), 1, False, "kink", False),
    ("relu 2x away from 0", ReLUDouble, t(0.5, 0.0, -1.0), 0, False, "smooth", False),
    ("relu at -eps/2", ReLU, t(-5e-7), 0, False, "kink", True),
    ("abs at 0, sign(0)=0", Abs, t(0.0, 1.0), 0, True, "kink", True),
    ("abs at 0, 1", AbsOne, t(0.0, 1.0), 0, False, "kink", True),
    ("abs at 0, 3", AbsThree, t(0.0, 1.0), 0, False, "kink", False),
    ("clamp at 1", Clamp, t(-1.0, 0.3, 1.0), 2, False, "kink", True),
    ("clamp at 1, -1", ClampFlip, t(-1.0, 0.3, 1.0), 2, False, "kink", False),
    ("max tie, one-hot", Max, t(1.0, 1.0, 0.5), 0, False, "kink", True),
    ("max tie, split", MaxSplit, t(1.0, 1.0, 0.5), 0, True, "kink", True),
    ("max tie, 2x one-hot", MaxDouble, t(1.0, 1.0, 0.5), 0, False, "kink", False),
    ("sqrt at 1e-7", Sqrt, t(1e-7, 0.5), 0, False, "domain_edge", True),
    ("sqrt at 1e-7, 2x", SqrtDouble, t(1e-7, 0.5), 0, False, "domain_edge", False),
    ("log at 1e-7", Log, t(1e-7, 0.5), 0, False, "domain_edge", True),
    ("log at 1e-7, 2x", LogDouble, t(1e-7, 0.5), 0, False, "domain_edge", False),
    ("sin, 2x", SinDouble, t(0.3), 0, False, "smooth", False),
    ("x^2 at 0, +1", SquarePlusOne, t(0.0), 0, False, "smooth", False),
]


@pytest.mark.parametrize("name, f, x, j, torch_ok, kind, explained", AGREEMENT, ids=[c[0] for c in AGREEMENT])
def test_agreement_with_torch(name, f, x, j, torch_ok, kind, explained):
    assert torch_passes(f, x) is torch_ok
    v = verdict(f, x, j)
    assert (v.kind, v.explained) == (kind, explained)
    correct = f in (ReLU, ReLUGe, Abs, AbsOne, Clamp, Max, MaxSplit, Sqrt, Log)
    # ours: a mismatch counts as a wrong gradient unless explained; that is torch's verdict
    # overturned exactly on the correct Functions, and kept on every wrong one
    assert (torch_ok or explained) is correct


# ------------------------------------------------------------------------ cancellation (a removable singularity)


def cos_div(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    """(cos a - cos b) / (a - b), with its limit -sin a where a == b (as a reference formula writes it)."""
    return torch.where(a == b, -torch.sin(a), (torch.cos(a) - torch.cos(b)) / (a - b))


def cos_div_da(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    """d/da of cos_div: (-sin a (a - b) - (cos a - cos b)) / (a - b)^2, and -cos(a) / 2 where a == b (the
    Taylor expansion about b: cos_div = -sin b - (a - b) cos b / 2 + O((a - b)^2))."""
    same = a == b
    d = torch.where(same, torch.ones_like(a), a - b)
    return torch.where(same, -torch.cos(a) / 2, (-torch.sin(a) * d - (torch.cos(a) - torch.cos(b))) / d**2)


CANCEL = {"atol": 1e-6, "rtol": 1e-4}  # a tolerance a user may set; at a == b cancellation costs the
# central difference at eps = 1e-6 about 1e-16 |cos a| / eps^2 ~ 5e-5, more than that tolerance


def cancellation_verdict(a: float, scale: float) -> Verdict:
    """examine() on a[0] of cos_div(a, b) at a == b, with backward ``scale`` times the true d/da."""
    x, y = t(a), t(a)
    analytical = scale * cos_div_da(x, y)
    return examine(lambda vals: cos_div(*vals), [x, y], x, 0, EPS, [0], analytical, index_text="a[0]", **CANCEL)


def test_cancellation_at_a_removable_singularity_is_not_a_wrong_gradient():
    x = t(0.3)
    assert float(cos_div_da(x, x)) == pytest.approx(-float(torch.cos(x)) / 2)
    # the central difference at eps really is outside the tolerance (what the comparison saw)
    e = 1e-6
    central = float((cos_div(x + e, x) - cos_div(x - e, x)) / (2 * e))
    true = -float(torch.cos(x)) / 2
    assert abs(central - true) > CANCEL["atol"] + CANCEL["rtol"] * abs(true)
    v = cancellation_verdict(0.3, 1.0)
    assert (v.kind, v.explained) == ("cancellation", True), v.text
    assert v.text.startswith("finite differences unreliable at a[0] = 0.3 (cancellation: the estimate moves by ")
    assert "it settles on -0.4777, backward gives -0.4777" in v.text


@pytest.mark.parametrize("scale", [1.1, 0.9, -1.0, 1.002])
def test_a_wrong_gradient_at_a_removable_singularity_stays_wrong(scale):
    v = cancellation_verdict(0.3, scale)
    assert (v.kind, v.explained) == ("cancellation", False), v.text
    assert "yet backward gives" in v.text and "where it is -0.4777" in v.text


def test_where_the_estimate_does_not_move_the_central_difference_stands():
    # sin is smooth and its differences do not cancel: a 1.001x backward (just outside rtol 1e-4) stays wrong
    x = t(0.3)
    v = examine(lambda vals: torch.sin(vals[0]), [x], x, 0, EPS, [0], 1.001 * torch.cos(x), index_text="x[0]", **CANCEL)
    assert (v.kind, v.explained) == ("smooth", False), v.text


# ------------------------------------------------------------------------ analytical columns for re-examination


def test_analytical_columns_are_the_jacobian_columns_in_the_order_asked():
    from gradcheck_cli.numerics.kinks import analytical_columns
    from gradcheck_cli.numerics.realify import vjp

    w = torch.randn(4, 5, dtype=F64, generator=torch.Generator().manual_seed(0))
    x = torch.randn(5, dtype=F64, generator=torch.Generator().manual_seed(1)).requires_grad_(True)
    outputs = (w @ x.sin(), x.argmax(), torch.complex(x.cumsum(0), x * x))
    jac = torch.autograd.functional.jacobian(lambda v: torch.cat([w @ v.sin(), v.cumsum(0), v * v]), x.detach())
    # the realified rows: w @ sin x, then the complex output's (real, imaginary) pairs
    rows = torch.cat([jac[:4], torch.stack([jac[4:9], jac[9:]], 1).reshape(10, 5)])
    order = [3, 0, 4, 1]
    kept = {0: torch.full((14,), 7.0, dtype=F64)}  # a kept column is given back as it is
    for memory in (1, 2**20):  # a batch of one column at a time, and all at once
        got = list(analytical_columns(vjp, outputs, [0, 2], x, order, kept, memory))
        assert [c for c, _ in got] == order
        for c, col in got:
            assert torch.allclose(col, kept[c] if c in kept else rows[:, c]), c


@pytest.mark.parametrize("x0", [-1e-8, -3e-7, 5e-6])
def test_a_kink_near_x_is_not_taken_for_cancellation(x0):
    # relu near its kink: the central differences at larger steps drift towards 1/2 as the kink
    # comes inside them (a smooth 1/h drift, not rounding); 1/2 is not relu's derivative at x0 != 0
    v = verdict(ReLU, t(x0), 0, analytical=[0.5])
    assert not v.explained and v.kind != "cancellation", v.text
