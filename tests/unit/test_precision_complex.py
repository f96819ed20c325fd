"""Low precision, tiny systematic errors and the complex conjugate convention in the backward check.

1. A Function checked in float32 / float16 / bfloat16 / complex64 is compared against a float64
   (complex128) finite-difference reference, its forward run on upcast copies, with per-dtype
   tolerances unless the spec sets its own; a forward that only works in the low dtype falls back
   with a warning. torch.autograd.gradcheck on the same float32 inputs warns and fails.
2. A backward that is 1.0005x everywhere passes within rtol 1e-3 but is named in a warning;
   correct Functions (float64 and float32, several seeds) never get that warning.
3. A complex backward returning grad * f'(z) instead of grad * conj(f'(z)) is named "conjugate
   convention"; other wrong complex backwards are not; verdicts agree with torch's gradcheck.

The Functions live in one user module (SOURCE), used both through the library API and specs.
"""

from __future__ import annotations

import importlib
import json
import warnings

import pytest
import torch

import gradcheck_cli
from gradcheck_cli.checks.parts.argument_rows import SYSTEMATIC
from gradcheck_cli.core.tolerance import by_dtype
from gradcheck_cli.results import Status
from gradcheck_cli.run import runner
from gradcheck_cli.spec import load_file


def _low(dtype: torch.dtype) -> tuple[float, float]:
    """(atol, rtol) an argument of this dtype is judged by where the spec sets none."""
    limits = by_dtype(dtype).gradient
    return limits.atol, limits.rtol


SOURCE = '''
import torch


def elementwise(name, f, df, factor=1.0, conj=True):
    """A Function y = f(z) with backward factor * grad * conj(f'(z)) (or f'(z) with conj=False)."""
    def forward(ctx, z):
        ctx.save_for_backward(z)
        return f(z)

    def backward(ctx, g):
        (z,) = ctx.saved_tensors
        d = df(z)
        return factor * g * (d.conj() if conj else d)

    return type(name, (torch.autograd.Function,), {"forward": staticmethod(forward),
                                                   "backward": staticmethod(backward)})


def square(z):
    return z * z


def twice(z):
    return 2 * z


def cube(z):
    return z * z * z


def cube_prime(z):
    return 3 * z * z


def abs_sq(z):
    return (z * z.conj()).real


def abs_sq_prime_conj(z):  # conj=True turns it into 2z, PyTorch's gradient of |z|^2
    return 2 * z.conj()


Softplus = elementwise("Softplus", torch.nn.functional.softplus, torch.sigmoid)
Softplus10005 = elementwise("Softplus10005", torch.nn.functional.softplus, torch.sigmoid, factor=1.0005)
Square = elementwise("Square", square, twice)
SquareNoConj = elementwise("SquareNoConj", square, twice, conj=False)


class TanhLinear(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x, w):
        y = torch.tanh(x @ w)
        ctx.save_for_backward(x, w, y)
        return y

    @staticmethod
    def backward(ctx, g):
        x, w, y = ctx.saved_tensors
        gy = g * (1 - y * y)
        return gy @ w.T, x.T @ gy


class TanhLinearTransposed(TanhLinear):
    @staticmethod
    def backward(ctx, g):
        x, w, y = ctx.saved_tensors
        gy = g * (1 - y * y)
        return gy @ w.T, (x.T @ gy).T


class LogSumExp(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x):
        y = torch.logsumexp(x, dim=-1)
        ctx.save_for_backward(x, y)
        return y

    @staticmethod
    def backward(ctx, g):
        x, y = ctx.saved_tensors
        return g.unsqueeze(-1) * torch.exp(x - y.unsqueeze(-1))


class MulPlus(torch.autograd.Function):
    """a * b + a."""
    @staticmethod
    def forward(ctx, a, b):
        ctx.save_for_backward(a, b)
        return a * b + a

    @staticmethod
    def backward(ctx, g):
        a, b = ctx.saved_tensors
        return (g * (b + 1)).to(a.dtype), (g * a).to(b.dtype)


class MulPlusMissingTerm(MulPlus):
    @staticmethod
    def backward(ctx, g):
        a, b = ctx.saved_tensors
        return (g * b).to(a.dtype), (g * a).to(b.dtype)  # forgets the gradient of the "+ a" term


class MatMul(torch.autograd.Function):
    @staticmethod
    def forward(ctx, a, b):
        ctx.save_for_backward(a, b)
        return a @ b

    @staticmethod
    def backward(ctx, g):
        a, b = ctx.saved_tensors
        return g @ b.mH, a.mH @ g


class MatMulNoConj(MatMul):
    @staticmethod
    def backward(ctx, g):
        a, b = ctx.saved_tensors
        return g @ b.mT, a.mT @ g


class Only32(torch.autograd.Function):
    """x @ W with a float32 W built inside: forward raises on float64 x."""
    @staticmethod
    def forward(ctx, x):
        w = torch.linspace(0.5, 1.5, x.shape[-1] * 2, dtype=torch.float32).reshape(x.shape[-1], 2)
        ctx.save_for_backward(w)
        return x @ w

    @staticmethod
    def backward(ctx, g):
        (w,) = ctx.saved_tensors
        return g @ w.T
'''

F32, F64, C64, C128 = torch.float32, torch.float64, torch.complex64, torch.complex128
SEEDS = (0, 1, 2)
SYSTEMATIC_WORDS = "within tolerance, but analytical is"
CONJUGATE_WORDS = "conjugate convention"


# ------------------------------------------------------------------------ helpers


@pytest.fixture
def fns(user_module):
    """The user module written from SOURCE, imported."""
    return importlib.import_module(user_module(SOURCE, "precmod"))


def rand(*shape: int, dtype: torch.dtype = F64, seed: int = 0) -> torch.Tensor:
    """Reproducible normal values (complex ones with both parts random), as a leaf requiring grad."""
    gen = torch.Generator().manual_seed(seed)
    base = C128 if dtype.is_complex else F64
    return torch.randn(*shape, generator=gen, dtype=base).to(dtype).requires_grad_()


def check(fn, *args, **tol):
    result = gradcheck_cli.check(fn, list(args), **tol)
    assert result.error is None, result.error
    (bw,) = result.checks
    return bw


def row(bw, name):
    (r,) = [r for r in bw.inputs if r.name == name]
    return r


def assert_passes(bw):
    assert bw.status is Status.PASS, bw.message
    assert all(r.status is Status.PASS for r in bw.inputs), bw.inputs


def assert_fails(bw, *words: str) -> None:
    assert bw.status is Status.FAIL, bw.message
    for word in words:
        assert word in bw.message, f"{word!r} not in {bw.message!r}"


def real_cases(fns, dtype: torch.dtype, seed: int) -> dict:
    """Correct real Functions with their arguments in ``dtype``."""
    return {
        "tanh(x@w)": (fns.TanhLinear, rand(3, 4, dtype=dtype, seed=seed), rand(4, 2, dtype=dtype, seed=seed + 10)),
        "softplus": (fns.Softplus, rand(6, dtype=dtype, seed=seed)),
        "logsumexp": (fns.LogSumExp, rand(3, 5, dtype=dtype, seed=seed)),
        "a*b+a": (fns.MulPlus, rand(4, dtype=dtype, seed=seed), rand(4, dtype=dtype, seed=seed + 10)),
    }


def torch_gradcheck(fn, *args) -> tuple[bool, list[str]]:
    """torch.autograd.gradcheck's verdict (raise_exception=False) and the warnings it gave."""
    inputs = tuple(a.detach().clone().requires_grad_(a.requires_grad) for a in args)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        ok = torch.autograd.gradcheck(fn.apply, inputs, raise_exception=False)
    return ok, [str(w.message) for w in caught]


def spec_result(write_spec, text: str):
    (case,) = load_file(write_spec(text, "specs/case.yaml"))
    result = runner.run_case(case, "cpu")
    assert result.error is None, result.error
    return result


# ------------------------------------------------------------------------ 1. low precision


@pytest.mark.parametrize("seed", SEEDS)
def test_correct_float32_functions_pass_against_the_float64_reference(fns, seed):
    for label, (fn, *args) in real_cases(fns, F32, seed).items():
        bw = check(fn, *args)
        assert_passes(bw)
        for r in bw.inputs:
            assert (r.atol, r.rtol) == _low(F32), label
            assert r.dtype == "float32"


@pytest.mark.parametrize("seed", SEEDS)
def test_torch_gradcheck_warns_and_fails_on_the_same_float32_inputs(fns, seed):
    for label, (fn, *args) in real_cases(fns, F32, seed).items():
        ok, said = torch_gradcheck(fn, *args)
        assert not ok, label  # eps=1e-6 in float32: the numerical Jacobian is rounding noise
        assert any("is not a double precision floating point or complex" in s for s in said), said
        assert check(fn, *args).status is Status.PASS, label


def test_low_precision_warning_names_arguments_dtype_and_tolerances(fns):
    bw = check(fns.TanhLinear, rand(3, 4, dtype=F32), rand(4, 2, dtype=F32, seed=1))
    (note,) = [w for w in bw.warnings if "reference" in w]
    assert note.startswith("'x', 'w' are float32")
    assert "forward run in float64" in note
    assert "atol 0.0001, rtol 0.001" in note

    bw = check(fns.Softplus, rand(5, dtype=torch.bfloat16))
    (note,) = [w for w in bw.warnings if "reference" in w]
    assert note.startswith("'z' is bfloat16") and "atol 0.05, rtol 0.05" in note


def test_complex64_warning_names_the_complex128_reference(fns):
    bw = check(fns.Square, rand(4, dtype=C64))
    assert_passes(bw)
    (note,) = [w for w in bw.warnings if "reference" in w]
    assert note.startswith("'z' is complex64") and "complex128" in note


def test_float64_arguments_get_no_reference_warning_and_keep_the_defaults(fns):
    bw = check(fns.TanhLinear, rand(3, 4), rand(4, 2, seed=1))
    assert_passes(bw)
    assert bw.warnings == []
    assert all((r.atol, r.rtol) == (1e-5, 1e-3) for r in bw.inputs)


@pytest.mark.parametrize("seed", SEEDS)
def test_wrong_float32_functions_fail_with_the_right_diagnosis(fns, seed):
    x = rand(6, dtype=F32, seed=seed)
    assert_fails(
        check(fns.elementwise("Off", torch.nn.functional.softplus, torch.sigmoid, factor=1.01), x),
        "gradient of 'z': analytical is 1.01x numerical",
    )
    assert_fails(
        check(fns.elementwise("Neg", torch.nn.functional.softplus, torch.sigmoid, factor=-1.0), x),
        "gradient of 'z': sign flipped",
    )
    bw = check(fns.TanhLinearTransposed, rand(3, 4, dtype=F32, seed=seed), rand(4, 4, dtype=F32, seed=seed + 10))
    assert_fails(bw, "gradient of 'w': analytical is the numerical gradient transposed", "'x' is right")
    bw = check(fns.MulPlusMissingTerm, rand(4, dtype=F32, seed=seed), rand(4, dtype=F32, seed=seed + 10))
    assert_fails(bw, "gradient of 'a'", "'b' is right")
    assert row(bw, "a").mismatched == 4 and row(bw, "b").status is Status.PASS
    ok, _ = torch_gradcheck(fns.MulPlusMissingTerm, rand(4, seed=seed), rand(4, seed=seed + 10))
    assert not ok  # torch agrees in float64


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
@pytest.mark.parametrize("seed", SEEDS)
def test_half_precisions_pass_when_right_and_fail_when_twice_too_big(fns, dtype, seed):
    for label, (fn, *args) in real_cases(fns, dtype, seed).items():
        bw = check(fn, *args)
        assert_passes(bw)
        assert all((r.atol, r.rtol) == _low(dtype) for r in bw.inputs), label
    double = fns.elementwise("Double", torch.nn.functional.softplus, torch.sigmoid, factor=2.0)
    bw = check(double, rand(6, dtype=dtype, seed=seed))
    assert_fails(bw, "gradient of 'z'")
    assert row(bw, "z").mismatched == 6


def test_float16_names_the_twice_too_big_factor(fns):
    double = fns.elementwise("Double", torch.nn.functional.softplus, torch.sigmoid, factor=2.0)
    assert_fails(check(double, rand(6, dtype=torch.float16)), "analytical is 2.00x numerical")


@pytest.mark.parametrize("factor, words", [(2.0, "analytical is 2.00x numerical"), (-1.0, "sign flipped")])
def test_bfloat16_names_a_constant_factor(fns, factor, words):
    wrong = fns.elementwise("Wrong", torch.nn.functional.softplus, torch.sigmoid, factor=factor)
    assert_fails(check(wrong, rand(6, dtype=torch.bfloat16)), words)


def test_spec_tolerance_is_kept_for_float32(fns, write_spec):
    result = spec_result(
        write_spec,
        """
        function: precmod:TanhLinear
        dtype: float32
        tolerance: {atol: 1.0e-3, rtol: 1.0e-2}
        inputs: [{name: x, shape: [3, 4]}, {name: w, shape: [4, 2]}]
    """,
    )
    (bw,) = result.checks
    assert_passes(bw)
    assert all((r.atol, r.rtol, r.dtype) == (1e-3, 1e-2, "float32") for r in bw.inputs)
    assert any("atol 0.001, rtol 0.01" in w and "float64" in w for w in bw.warnings), bw.warnings


def test_spec_tolerance_tighter_than_float32_rounding_fails_a_correct_function(fns, write_spec):
    """Kept tolerances really are used: rtol 1e-9 is below float32 rounding of the analytical gradient."""
    result = spec_result(
        write_spec,
        """
        function: precmod:LogSumExp
        dtype: float32
        tolerance: {atol: 0.0, rtol: 1.0e-9}
        inputs: [{name: x, shape: [3, 5]}]
    """,
    )
    assert result.status is Status.FAIL
    assert (result.checks[0].inputs[0].atol, result.checks[0].inputs[0].rtol) == (0.0, 1e-9)


def test_spec_tolerance_equal_to_the_defaults_is_kept_too(fns, write_spec):
    result = spec_result(
        write_spec,
        """
        function: precmod:Softplus
        dtype: float32
        tolerance: {atol: 1.0e-5, rtol: 1.0e-3}
        inputs: [{name: z, shape: [6]}]
    """,
    )
    assert result.checks[0].inputs[0].atol == 1e-5


@pytest.mark.parametrize("seed", SEEDS)
def test_forward_that_fails_in_float64_falls_back_with_a_warning_and_a_verdict(fns, seed):
    bw = check(fns.Only32, rand(3, 4, dtype=F32, seed=seed))
    assert bw.status in (Status.PASS, Status.FAIL)  # a verdict, not an error
    (note,) = [w for w in bw.warnings if "forward fails in float64" in w]
    assert note.startswith("'x' is float32, and forward fails in float64")
    assert "same dtype" in note  # the user's exception is quoted
    assert "finite differences are taken in float32" in note and "unreliable" in note
    assert not any("comes from forward run in float64" in w for w in bw.warnings)


def test_forward_that_fails_in_float64_still_passes_when_right(fns):
    bw = check(fns.Only32, rand(3, 4, dtype=F32))
    assert_passes(bw)


def test_mixed_float64_and_float32_arguments(fns):
    a, b = rand(5, seed=3), rand(5, dtype=F32, seed=4)
    bw = check(fns.MulPlus, a, b)
    assert_passes(bw)
    (note,) = [w for w in bw.warnings if "reference" in w]
    assert note.startswith("'b' is float32:") and "'a'" not in note
    assert (row(bw, "a").dtype, row(bw, "b").dtype) == ("float64", "float32")
    assert (row(bw, "b").atol, row(bw, "b").rtol) == _low(F32)

    bw = check(fns.MulPlusMissingTerm, a, b)
    assert_fails(bw, "gradient of 'a'", "'b' is right")


def test_cli_json_shows_the_float32_reference(fns, write_spec, invoke):
    write_spec(
        """
        function: precmod:TanhLinear
        dtype: float32
        inputs: [{name: x, shape: [3, 4]}, {name: w, shape: [4, 2]}]
    """,
        "specs/f32.yaml",
    )
    result = invoke("specs/f32.yaml", "--no-isolate", "--format", "json")
    assert result.exit_code == 0, result.output
    (res,) = json.loads(result.stdout)["results"]
    (bw,) = res["checks"]
    assert bw["status"] == "pass"
    assert any(w.startswith("'x', 'w' are float32") and "float64" in w for w in bw["warnings"]), bw["warnings"]
    assert [(r["name"], r["dtype"], r["atol"], r["rtol"]) for r in bw["inputs"]] == [
        ("x", "float32", 1e-4, 1e-3),
        ("w", "float32", 1e-4, 1e-3),
    ]


# ------------------------------------------------------------------------ 2. tiny systematic errors


def test_a_tiny_constant_factor_passes_with_a_warning(fns):
    bw = check(fns.Softplus10005, rand(8))
    assert_passes(bw)
    expected = "within tolerance, but analytical is 1.0005x numerical everywhere"
    assert any(w.startswith(f"'z': {expected}") for w in bw.warnings), bw.warnings
    assert row(bw, "z").diagnosis.startswith(expected)
    assert "tighten rtol" in row(bw, "z").diagnosis


def test_the_tiny_factor_is_also_seen_in_float32(fns):
    bw = check(fns.Softplus10005, rand(8, dtype=F32))
    assert_passes(bw)
    assert any("analytical is 1.0005x numerical everywhere" in w for w in bw.warnings), bw.warnings


def test_the_tiny_factor_is_below_the_half_precision_thresholds(fns):
    for dtype in (torch.float16, torch.bfloat16):
        bw = check(fns.Softplus10005, rand(8, dtype=dtype))
        assert_passes(bw)
        assert not any(SYSTEMATIC_WORDS in w for w in bw.warnings), (dtype, bw.warnings)
        assert SYSTEMATIC[dtype] > 5e-4


@pytest.mark.parametrize("dtype", [F64, F32, C64, C128])
@pytest.mark.parametrize("seed", SEEDS)
def test_correct_functions_never_get_the_systematic_warning(fns, dtype, seed):
    if dtype.is_complex:
        cases = {
            "z*z": (fns.Square, rand(5, dtype=dtype, seed=seed)),
            "matmul": (fns.MatMul, rand(2, 3, dtype=dtype, seed=seed), rand(3, 2, dtype=dtype, seed=seed + 10)),
        }
    else:
        cases = real_cases(fns, dtype, seed)
    for label, (fn, *args) in cases.items():
        bw = check(fn, *args)
        assert_passes(bw)
        assert not any(SYSTEMATIC_WORDS in w for w in bw.warnings), (label, bw.warnings)
        assert all(r.diagnosis is None for r in bw.inputs), (label, bw.inputs)


def test_a_tighter_rtol_fails_the_tiny_factor(fns, write_spec):
    result = spec_result(
        write_spec,
        """
        function: precmod:Softplus10005
        tolerance: {rtol: 1.0e-4}
        inputs: [{name: z, shape: [8]}]
    """,
    )
    (bw,) = result.checks
    assert_fails(bw, "gradient of 'z'")
    assert row(bw, "z").rtol == 1e-4
    assert not any(SYSTEMATIC_WORDS in w for w in bw.warnings)


def test_a_failing_tiny_factor_is_described_with_enough_digits(fns):
    bw = check(fns.Softplus10005, rand(8), rtol=1e-4)
    assert_fails(bw, "analytical is 1.0005x numerical")


def test_cli_json_row_carries_the_systematic_diagnosis(fns, write_spec, invoke):
    write_spec("function: precmod:Softplus10005\ninputs: [{name: z, shape: [8]}]\n", "specs/tiny.yaml")
    result = invoke("specs/tiny.yaml", "--no-isolate", "--format", "json")
    assert result.exit_code == 0, result.output
    (bw,) = json.loads(result.stdout)["results"][0]["checks"]
    assert bw["status"] == "pass"
    assert bw["inputs"][0]["diagnosis"].startswith("within tolerance, but analytical is 1.0005x numerical everywhere")


# ------------------------------------------------------------------------ 3. complex conjugate convention


HOLOMORPHIC = {
    "z*z": ("square", "twice"),
    "exp": (torch.exp, torch.exp),
    "z^3": ("cube", "cube_prime"),
    "|z|^2": ("abs_sq", "abs_sq_prime_conj"),  # real-valued: the right backward is 2z, the mistake 2 conj(z)
}


def holomorphic(fns, label: str, **kw):
    f, df = (getattr(fns, g) if isinstance(g, str) else g for g in HOLOMORPHIC[label])
    return fns.elementwise(f"F_{len(kw)}", f, df, **kw)


@pytest.mark.parametrize("dtype", [C128, C64])
@pytest.mark.parametrize("label", list(HOLOMORPHIC))
def test_conjugate_convention_is_named(fns, label, dtype):
    z = rand(4, dtype=dtype, seed=5)
    assert_passes(check(holomorphic(fns, label), z))
    bw = check(holomorphic(fns, label, conj=False), z)
    assert_fails(bw, "gradient of 'z'", CONJUGATE_WORDS, "conj(f'(z))")
    assert row(bw, "z").mismatched == 4


@pytest.mark.parametrize("dtype", [C128, C64])
def test_conjugate_convention_in_a_complex_matmul_with_two_inputs(fns, dtype):
    a, b = rand(2, 3, dtype=dtype, seed=1), rand(3, 4, dtype=dtype, seed=2)
    assert_passes(check(fns.MatMul, a, b))
    bw = check(fns.MatMulNoConj, a, b)
    assert bw.status is Status.FAIL
    for name in ("a", "b"):
        assert row(bw, name).status is Status.FAIL
        assert CONJUGATE_WORDS in row(bw, name).diagnosis
    assert bw.message.count(CONJUGATE_WORDS) == 2


@pytest.mark.parametrize("label", list(HOLOMORPHIC))
@pytest.mark.parametrize(
    "factor, words", [(2.0, "analytical is 2.00x numerical"), (-1.0, "sign flipped"), (1j, "gradient of 'z'")]
)
def test_other_wrong_complex_backwards_are_not_called_conjugate(fns, label, factor, words):
    bw = check(holomorphic(fns, label, factor=factor), rand(4, dtype=C128, seed=6))
    assert_fails(bw, words)
    assert CONJUGATE_WORDS not in bw.message


def test_a_real_function_never_gets_the_conjugate_diagnosis(fns):
    wrong = fns.elementwise("Neg", torch.nn.functional.softplus, torch.sigmoid, factor=-1.0)
    bw = check(wrong, rand(5))
    assert_fails(bw, "sign flipped")
    assert CONJUGATE_WORDS not in bw.message


@pytest.mark.parametrize("seed", SEEDS)
def test_complex_verdicts_agree_with_torch_gradcheck(fns, seed):
    cases = {
        f"{label} {kw}": (holomorphic(fns, label, **kw), rand(4, dtype=C128, seed=seed))
        for label in HOLOMORPHIC
        for kw in ({}, {"conj": False}, {"factor": 2.0}, {"factor": -1.0})
    }
    a, b = rand(2, 3, dtype=C128, seed=seed), rand(3, 2, dtype=C128, seed=seed + 10)
    cases["matmul"], cases["matmul no conj"] = (fns.MatMul, a, b), (fns.MatMulNoConj, a, b)
    verdicts = {}
    for label, (fn, *args) in cases.items():
        ours = check(fn, *args).status is Status.PASS
        theirs, _ = torch_gradcheck(fn, *args)
        verdicts[label] = (ours, theirs)
    assert all(ours == theirs for ours, theirs in verdicts.values()), verdicts
    assert sum(ours for ours, _ in verdicts.values()) == len(HOLOMORPHIC) + 1  # only the right ones pass


def test_cli_json_names_the_conjugate_convention(fns, write_spec, invoke):
    write_spec(
        """
        function: precmod:SquareNoConj
        inputs: [{name: z, shape: [3], dtype: complex128}]
    """,
        "specs/conj.yaml",
    )
    result = invoke("specs/conj.yaml", "--no-isolate", "--format", "json")
    assert result.exit_code == 1, result.output
    (bw,) = json.loads(result.stdout)["results"][0]["checks"]
    assert bw["status"] == "fail" and CONJUGATE_WORDS in bw["message"]
    z = bw["inputs"][0]
    assert (z["name"], z["dtype"], z["status"]) == ("z", "complex128", "fail")
    assert CONJUGATE_WORDS in z["diagnosis"]
