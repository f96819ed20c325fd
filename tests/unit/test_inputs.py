"""Spec arguments -> tensors: seeded, in range, of the right dtype, away from `avoid`, aliased by `same_as`.

Contract (section 3): values are drawn on the CPU from a ``torch.Generator`` seeded by the
spec's seed, then moved to the device; complex tensors draw real and imaginary parts
independently; ``requires_grad`` defaults to true for floating and complex tensors.
"""

from __future__ import annotations

import importlib
import json

import pytest
import torch

from gradcheck_cli.run import runner
from gradcheck_cli.run.discovery import TargetError, inline_case
from gradcheck_cli.spec import Case, SpecError, load_file
from gradcheck_cli.subject import inputs

HEAD = "function: pkg.mod:Fn\n"


@pytest.fixture
def build(write_spec):
    """``build(yaml_text, device="cpu") -> (positional values, {kwarg: value})`` for a one-case spec."""
    counter = iter(range(10_000))

    def run(text: str, device: str = "cpu"):
        path = write_spec(HEAD + text, f"spec{next(counter)}.yaml")
        items = load_file(path)
        assert len(items) == 1 and isinstance(items[0], Case), items
        positional, keywords = inputs.build(items[0], device)
        return [v for _, v in positional], dict(keywords)

    return run


def build_error(build, text: str) -> inputs.InputError:
    with pytest.raises(inputs.InputError) as info:
        build(text)
    return info.value


# ----------------------------------------------------------------------- seeds


SEVERAL = """\
inputs:
  - {shape: [4, 5]}
  - {shape: [3], dist: uniform, low: -2, high: 2}
  - {shape: [6], dtype: int64, dist: randint, low: 0, high: 100}
  - {shape: [3], dtype: complex128}
kwargs:
  w: {shape: [2, 2]}
"""


def test_same_seed_gives_identical_tensors(build):
    (a1, b1, c1, d1), kw1 = build("seed: 5\n" + SEVERAL)
    (a2, b2, c2, d2), kw2 = build("seed: 5\n" + SEVERAL)
    for x, y in [(a1, a2), (b1, b2), (c1, c2), (d1, d2), (kw1["w"], kw2["w"])]:
        assert x is not y
        assert x.dtype == y.dtype and torch.equal(x, y)


def test_default_seed_is_zero(build):
    (a1, *_), _ = build(SEVERAL)
    (a2, *_), _ = build("seed: 0\n" + SEVERAL)
    assert torch.equal(a1, a2)


def test_different_seed_gives_different_tensors(build):
    (a1, b1, c1, d1), kw1 = build("seed: 5\n" + SEVERAL)
    (a2, b2, c2, d2), kw2 = build("seed: 6\n" + SEVERAL)
    for x, y in [(a1, a2), (b1, b2), (c1, c2), (d1, d2), (kw1["w"], kw2["w"])]:
        assert not torch.equal(x, y)


def test_arguments_of_one_case_are_not_copies_of_each_other(build):
    (a, b), _ = build("inputs: [{shape: [50]}, {shape: [50]}]\n")
    assert not torch.equal(a, b)


def test_build_does_not_touch_the_global_rng(build):
    torch.manual_seed(123)
    expected = torch.rand(3)
    torch.manual_seed(123)
    build(SEVERAL)
    assert torch.equal(torch.rand(3), expected)


@pytest.mark.cuda
def test_same_seed_gives_the_same_values_on_cuda_as_on_cpu(build):
    (cpu, *_), _ = build(SEVERAL, "cpu")
    (gpu, *_), _ = build(SEVERAL, "cuda")
    assert gpu.device.type == "cuda"
    assert torch.equal(gpu.cpu(), cpu)


# ----------------------------------------------------------------------- distributions and dtypes


def test_normal_default_is_standard_float64(build):
    (x,), _ = build("inputs: [{shape: [20000]}]\n")
    assert x.dtype == torch.float64 and x.shape == (20000,)
    assert abs(x.mean().item()) < 0.05
    assert abs(x.std().item() - 1.0) < 0.05
    assert (x < 0).any() and (x > 0).any()


def test_normal_mean_and_std(build):
    (x,), _ = build("inputs: [{shape: [20000], mean: 5, std: 0.1}]\n")
    assert abs(x.mean().item() - 5.0) < 0.01
    assert abs(x.std().item() - 0.1) < 0.01


def test_uniform_range(build):
    (x,), _ = build("inputs: [{shape: [5000], dist: uniform, low: -3, high: -2}]\n")
    assert x.dtype == torch.float64
    assert (x >= -3).all() and (x < -2).all()
    assert x.min().item() < -2.9 and x.max().item() > -2.1  # the whole range is used


def test_uniform_default_range_is_zero_to_one(build):
    (x,), _ = build("inputs: [{shape: [5000], dist: uniform}]\n")
    assert (x >= 0).all() and (x < 1).all() and x.max().item() > 0.9


def test_randint_range_and_dtype(build):
    (x,), _ = build("inputs: [{shape: [2000], dtype: int64, dist: randint, low: 3, high: 6}]\n")
    assert x.dtype == torch.int64
    assert set(x.unique().tolist()) == {3, 4, 5}


def test_int_dtype_defaults_to_randint_zero_to_ten(build):
    (x,), _ = build("inputs: [{shape: [2000], dtype: int64}]\n")
    assert x.dtype == torch.int64
    assert set(x.unique().tolist()) == set(range(10))


def test_bool_tensor(build):
    (x,), _ = build("inputs: [{shape: [200], dtype: bool}]\n")
    assert x.dtype == torch.bool
    assert x.any() and not x.all()
    assert not x.requires_grad


def test_float32_per_entry_and_top_level(build):
    (x, y), _ = build("inputs: [{shape: [3], dtype: float32}, {shape: [3]}]\n")
    assert (x.dtype, y.dtype) == (torch.float32, torch.float64)
    (x, y), _ = build("dtype: float32\ninputs: [{shape: [3]}, {shape: [3], dtype: float64}]\n")
    assert (x.dtype, y.dtype) == (torch.float32, torch.float64)


def test_randint_with_a_float_dtype_gives_integral_floats(build):
    (x,), _ = build("inputs: [{shape: [100], dtype: float64, dist: randint, low: -2, high: 3}]\n")
    assert x.dtype == torch.float64
    assert torch.equal(x, x.round()) and x.min() >= -2 and x.max() <= 2


def test_complex128_draws_real_and_imaginary_parts_independently(build):
    (z,), _ = build("inputs: [{shape: [4000], dtype: complex128, dist: uniform, low: -1, high: 1}]\n")
    assert z.dtype == torch.complex128 and z.shape == (4000,)
    re, im = z.real, z.imag
    for part in (re, im):
        assert (part >= -1).all() and (part < 1).all()
        assert part.min() < -0.9 and part.max() > 0.9
    assert not torch.equal(re, im)
    assert (re != im).all()
    corr = torch.corrcoef(torch.stack([re, im]))[0, 1].item()
    assert abs(corr) < 0.1


def test_complex_normal_has_both_parts(build):
    (z,), _ = build("inputs: [{shape: [2000], dtype: complex128}]\n")
    assert z.requires_grad
    assert abs(z.real.std().item() - 1) < 0.1 and abs(z.imag.std().item() - 1) < 0.1


def test_zero_dim_and_empty_shapes(build):
    (s, e), _ = build("inputs: [{shape: []}, {shape: [0, 3]}]\n")
    assert s.shape == () and s.dtype == torch.float64
    assert e.shape == (0, 3)


# ----------------------------------------------------------------------- data


def test_data_literal_floats(build):
    (x,), _ = build("inputs: [{data: [[1.5, 2], [3, 4]]}]\n")
    assert x.dtype == torch.float64
    assert torch.equal(x.detach(), torch.tensor([[1.5, 2.0], [3.0, 4.0]], dtype=torch.float64))
    assert x.requires_grad


@pytest.mark.parametrize("dtype", ["", "dtype: float64, ", "dtype: complex128, "])
def test_data_literal_floats_keep_every_digit(build, dtype):
    """A literal 0.1 is a double: read it in float32 first and its float64 tensor is 0.10000000149..., a value
    that fits in 24 bits, which the backward check then takes for a forward computing in float32 inside (found
    by tests/cli/test_metamorphic.py: a corpus case written as a spec got another diagnosis than in Python)."""
    (x,), _ = build(f"inputs: [{{{dtype}data: [0.1, -2.1787893820745574, 1.0e-300]}}]\n")
    assert x.detach().real.tolist() == [0.1, -2.1787893820745574, 1e-300]


def test_data_literal_ints_stay_ints(build):
    (x,), _ = build("inputs: [{data: [1, 2, 3]}]\n")
    assert x.dtype == torch.int64 and x.tolist() == [1, 2, 3]
    assert not x.requires_grad


def test_data_with_dtype(build):
    (x, y), _ = build("inputs: [{data: [1, 2], dtype: float32}, {data: 2.5}]\n")
    assert x.dtype == torch.float32 and x.tolist() == [1.0, 2.0] and x.requires_grad
    assert y.shape == () and y.item() == 2.5


def test_data_follows_top_level_dtype(build):
    (x,), _ = build("dtype: float32\ninputs: [{data: [0.5]}]\n")
    assert x.dtype == torch.float32


def test_ragged_data_names_the_key(build):
    err = build_error(build, "inputs: [{shape: [1]}, {data: [[1, 2], [3]]}]\n")
    assert err.key == "inputs[1].data"
    assert "nested list" in str(err)


# ----------------------------------------------------------------------- avoid


def test_avoid_intervals_are_respected(build):
    (x,), _ = build("inputs: [{shape: [5000], dist: uniform, low: -1, high: 1, avoid: [[-0.5, 0.5], [0.8, 1]]}]\n")
    assert not ((x >= -0.5) & (x <= 0.5)).any()
    assert not (x >= 0.8).any()
    assert (x < -0.5).any() and ((x > 0.5) & (x < 0.8)).any()


def test_avoid_kink_at_zero_for_normal(build):
    (x,), _ = build("inputs: [{shape: [20000], avoid: [[-0.01, 0.01]]}]\n")
    assert x.abs().min() > 0.01


def test_avoid_applies_to_both_parts_of_a_complex_tensor(build):
    (z,), _ = build(
        "inputs: [{shape: [2000], dtype: complex128, dist: uniform, low: -1, high: 1, avoid: [[-0.5, 0.5]]}]\n"
    )
    assert (z.real.abs() > 0.5).all() and (z.imag.abs() > 0.5).all()


def test_avoid_is_deterministic(build):
    text = "seed: 3\ninputs: [{shape: [500], avoid: [[-0.3, 0.3]]}]\n"
    (a,), _ = build(text)
    (b,), _ = build(text)
    assert torch.equal(a, b)


def test_avoid_applies_to_randint_draws(build):
    # the contract: `avoid` is "a list of [lo, hi] intervals that drawn values stay out of"
    (x,), _ = build("inputs: [{shape: [500], dtype: int64, dist: randint, low: -5, high: 5, avoid: [[0, 0]]}]\n")
    assert x.dtype == torch.int64
    assert not (x == 0).any()


def test_impossible_avoid_names_the_key_and_says_what_to_do(build):
    err = build_error(
        build, "inputs:\n  - {shape: [3]}\n  - {shape: [3], dist: uniform, low: 0, high: 1, avoid: [[-1, 2]]}\n"
    )
    assert err.key == "inputs[1].avoid"
    msg = str(err)
    assert "[-1.0, 2.0]" in msg
    assert "widen" in msg or "narrow" in msg


def test_impossible_avoid_inside_a_case_names_the_case(write_spec):
    path = write_spec(HEAD + "cases:\n  - name: a\n    inputs: [{shape: [2], std: 0, avoid: [[-1, 1]]}]\n")
    (case,) = load_file(path)
    with pytest.raises(inputs.InputError) as info:
        inputs.build(case, "cpu")
    assert info.value.key == "cases[0].inputs[0].avoid"


# ----------------------------------------------------------------------- requires_grad


def test_requires_grad_defaults(build):
    (f64, f32, c, i, b), _ = build(
        "inputs: [{shape: [2]}, {shape: [2], dtype: float32}, "
        "{shape: [2], dtype: complex128}, {shape: [2], dtype: int64}, "
        "{shape: [2], dtype: bool}]\n"
    )
    assert f64.requires_grad and f32.requires_grad and c.requires_grad
    assert not i.requires_grad and not b.requires_grad
    assert all(t.is_leaf for t in (f64, f32, c, i, b))


def test_requires_grad_false_is_kept(build):
    (x,), kw = build("inputs: [{shape: [2], requires_grad: false}]\nkwargs:\n  w: {shape: [2], requires_grad: false}\n")
    assert not x.requires_grad and not kw["w"].requires_grad


def test_requires_grad_on_an_int_tensor_names_the_key(build):
    err = build_error(build, "inputs:\n  - {shape: [2]}\n  - {shape: [2], dtype: int64, requires_grad: true}\n")
    assert err.key == "inputs[1].requires_grad"
    msg = str(err)
    assert "int64" in msg and "floating" in msg


def test_requires_grad_on_a_kwarg_int_tensor_names_the_keyword(build):
    err = build_error(build, "kwargs:\n  index: {data: [0, 1], requires_grad: true}\n")
    assert err.key == "kwargs.index.requires_grad"


# ----------------------------------------------------------------------- same_as, value


def test_same_as_gives_the_very_same_object(build):
    (x, y, z), kw = build(
        "inputs:\n  - {name: x, shape: [3]}\n  - {shape: [3]}\n  - {same_as: x}\nkwargs:\n  other: {same_as: x}\n"
    )
    assert z is x
    assert kw["other"] is x
    assert y is not x


def test_same_as_a_keyword_argument(build):
    (x,), kw = build("inputs: [{shape: [2]}]\nkwargs:\n  w: {shape: [2]}\n  v: {same_as: w}\n")
    assert kw["v"] is kw["w"]


def test_unknown_same_as_names_the_key_and_the_missing_name(build):
    err = build_error(build, "inputs:\n  - {name: x, shape: [3]}\n  - {same_as: y}\n")
    assert err.key == "inputs[1].same_as"
    msg = str(err)
    assert "'y'" in msg and "x" in msg and "name" in msg


MUL_SOURCE = """
    import torch

    class Mul(torch.autograd.Function):
        @staticmethod
        def forward(ctx, a, b):
            ctx.save_for_backward(a, b)
            return a * b

        @staticmethod
        def backward(ctx, g):
            a, b = ctx.saved_tensors
            return g * b, g * a
"""


def test_same_as_defaults_to_forward_parameter_names(user_module, write_spec):
    # contract: an input's `name` defaults to forward's parameter name, so `same_as: a` names
    # the first input of forward(ctx, a, b) even without `name: a`
    mod = user_module(MUL_SOURCE)
    path = write_spec(f"function: {mod}:Mul\ninputs:\n  - shape: [3]\n  - same_as: a\n")
    (case,) = load_file(path)
    result = runner.run_case(case, "cpu")
    assert result.error is None, result.error
    assert [(r.name, r.index) for r in result.checks[0].inputs] == [("a", 0), ("b", 1)]


def test_aliased_arguments_of_a_correct_function_pass(user_module, write_spec):
    # y = a * b called as Mul(x, x): dy/dx = 2x; torch.autograd.gradcheck agrees that Mul is right
    mod = user_module(MUL_SOURCE, "aliasmod")
    path = write_spec(f"function: {mod}:Mul\ninputs:\n  - {{name: a, shape: [3]}}\n  - same_as: a\n")
    (case,) = load_file(path)
    positional, _ = inputs.build(case, "cpu")
    assert torch.autograd.gradcheck(importlib.import_module(mod).Mul.apply, tuple(v for _, v in positional))
    result = runner.run_case(case, "cpu")
    assert result.error is None, result.error
    assert result.checks[0].message and result.status.value == "pass", result.checks[0].message


def test_value_passes_through(build):
    (t, none, lst, mapping, s, f), kw = build(
        "inputs:\n  - {shape: [2]}\n  - {value: null}\n  - {value: [1, 2]}\n  - {value: {a: 1}}\n"
        "  - {value: mean}\n  - {value: 0.5}\n"
        "kwargs:\n  dim: {value: -1}\n  keepdim: {value: true}\n"
    )
    assert none is None
    assert lst == [1, 2] and mapping == {"a": 1} and s == "mean" and f == 0.5
    assert kw == {"dim": -1, "keepdim": True}
    assert type(kw["keepdim"]) is bool


def test_build_returns_names_in_order(write_spec):
    path = write_spec(
        HEAD + "inputs: [{name: x, shape: [1]}, {shape: [1]}]\nkwargs:\n  b: {value: 1}\n  a: {value: 2}\n"
    )
    (case,) = load_file(path)
    positional, keywords = inputs.build(case, "cpu")
    assert [n for n, _ in positional] == ["x", None]
    assert [k for k, _ in keywords] == ["b", "a"]


# ----------------------------------------------------------------------- inline -i options (targets.py)


def test_inline_shapes_and_dtypes():
    case = inline_case("pkg.mod:Fn", ["20x20", "3:float32", "scalar", "5:int64", "=null", "=[1, 2]"], ["dim=-1"])
    (a, b, s, i, none, lst), kw = inputs.build(case, "cpu")
    assert a[1].shape == (20, 20) and a[1].dtype == torch.float64 and a[1].requires_grad
    assert b[1].shape == (3,) and b[1].dtype == torch.float32
    assert s[1].shape == ()
    assert i[1].dtype == torch.int64 and not i[1].requires_grad
    assert none[1] is None and lst[1] == [1, 2]
    assert kw == [("dim", -1)]


def test_inline_inputs_are_seeded():
    case = inline_case("pkg.mod:Fn", ["4x4"], [])
    (a,), _ = inputs.build(case, "cpu")
    (b,), _ = inputs.build(case, "cpu")
    assert torch.equal(a[1], b[1])


@pytest.mark.parametrize("option", ["20y20", "3:float128", "-1", "2x"])
def test_bad_inline_input_names_the_option(option):
    with pytest.raises(TargetError) as info:
        inline_case("pkg.mod:Fn", [option], [])
    assert f"-i {option}" in str(info.value)


@pytest.mark.parametrize("option", ["dim", "1x=2", "=3"])
def test_bad_inline_kwarg_names_the_option(option):
    with pytest.raises(TargetError) as info:
        inline_case("pkg.mod:Fn", [], [option])
    assert f"--kwarg {option}" in str(info.value)
    assert "NAME=VALUE" in str(info.value)


def test_spec_errors_are_not_input_errors(write_spec):
    # a shape error is caught when reading the spec, before any tensor is built
    path = write_spec(HEAD + "inputs: [{shape: [-1]}]\n")
    (item,) = load_file(path)
    assert isinstance(item, SpecError)


# ------------------------------------------------------------------ issue 27, item 12: NaN and inf in inputs

NONFINITE_SOURCE = """
import torch


class Sin(torch.autograd.Function):  # correct
    @staticmethod
    def forward(ctx, x):
        ctx.save_for_backward(x)
        return torch.sin(x)

    @staticmethod
    def backward(ctx, g):
        (x,) = ctx.saved_tensors
        return g * torch.cos(x)


def masked(x, mask=None, xs=None):  # correct: a mask with -inf that is not differentiated is fine
    return torch.softmax(x + mask, dim=0) if mask is not None else x * 2


def overflows(x):  # correct, and its forward is inf at finite inputs: a different story, still judged
    return torch.exp(x * 1000)


NAN = torch.tensor([1.0, float("nan")], dtype=torch.float64, requires_grad=True)
"""

WHY = "finite differences cannot be taken through NaN or inf"
USE = f"{WHY}; use finite values (or `requires_grad: false` for a mask that is not differentiated)"


@pytest.mark.parametrize(
    "text, said",
    [
        (
            "function: usermod:Sin\ninputs: [{name: x, shape: [3], dist: uniform, low: -1.0e+308, high: 1.0e+308}]\n",
            f"specs/bad.yaml:1: inputs[0]: 'x': uniform low -1e+308, high 1e+308 overflows float64: draws inf at [0], "
            f"3 of 3 values not finite: {WHY}; narrow the range",
        ),
        (
            "function: usermod:Sin\ninputs: [{data: [[1.0, 2.0, 3.0], [1.0, 2.0, .nan]]}]\n",
            f"specs/bad.yaml:1: inputs[0].data: 'x': data holds NaN at [1, 2], 1 of 6 values not finite (as float64): {USE}",
        ),
        (
            "function: usermod:Sin\ninputs: [{data: [1.0e+39, 1.0], dtype: float32}]\n",
            f"inputs[0].data: 'x': data holds inf at [0], 1 of 2 values not finite (as float32): {USE}",
        ),
        (
            "function: usermod:Sin\ninputs: [{shape: [2, 2], dtype: complex128, std: 1.0e+308}]\n",
            "inputs[0]: 'x': normal mean 0, std 1e+308 overflows complex128: draws (-inf+4.03",
        ),
        (
            "function: usermod:masked\ninputs: [{shape: [2]}]\nkwargs: {mask: {data: [1.0, .inf]}}\n",
            f"kwargs.mask.data: 'mask': data holds inf at [1], 1 of 2 values not finite (as float64): {USE}",
        ),
        (
            "function: usermod:masked\ninputs: [{shape: [2]}, {value: null}, {list: [{shape: [2]}, {data: [.nan, 1.0]}]}]\n",
            f"inputs[2].list[1].data: 'xs[1]': data holds NaN at [0], 1 of 2 values not finite (as float64): {USE}",
        ),
        (
            "function: usermod:Sin\ninputs: [{shape: [2]}]\ncases:\n  - name: ok\n  - name: bad\n"
            "    inputs: [{data: [-.inf, 1.0]}]\n",
            f"cases[1].inputs[0].data: 'x': data holds -inf at [0], 1 of 2 values not finite (as float64): {USE}",
        ),
        (
            "function: usermod:masked\ninputs: [{shape: [2]}, {value: {import: 'usermod:NAN'}}]\n",
            f"inputs[1].value.import: 'mask' requires grad and holds NaN at [1], 1 of 2 values not finite: {WHY}; "
            "return finite values",
        ),
    ],
)
@pytest.mark.parametrize("mode", [["--no-isolate"], ["-j", "1"]])
def test_an_input_holding_nan_or_inf_is_a_spec_error_naming_the_argument(
    user_module, write_spec, invoke, text, said, mode
):
    """Before, a correct Function given NaN (or drawn inf) FAILED (exit 1): no gradient was wrong."""
    user_module(NONFINITE_SOURCE)
    write_spec(text, "specs/bad.yaml")
    result = invoke("specs/bad.yaml", "--no-color", *mode)
    assert result.exit_code == 3, result.output
    assert said in " ".join(result.output.split()), result.output
    assert "Traceback" not in result.output
    result = invoke("specs/bad.yaml", "--format", "json", *mode)
    assert result.exit_code == 3, result.output
    errors = [r for r in json.loads(result.stdout)["results"] if r["status"] != "pass"]
    assert [(r["status"], r["error"]["kind"]) for r in errors] == [("error", "spec")], errors
    assert said in errors[0]["error"]["message"]


def test_non_finite_values_that_are_not_differentiated_and_inf_made_by_forward_are_left_alone(
    user_module, write_spec, invoke
):
    user_module(NONFINITE_SOURCE)
    write_spec(
        "function: usermod:masked\ninputs: [{shape: [2]}, {data: [0.0, -.inf], requires_grad: false}]\n",
        "specs/mask.yaml",
    )
    write_spec(
        "function: usermod:overflows\ninputs: [{shape: [2], dist: uniform, low: 1, high: 2}]\n", "specs/overflows.yaml"
    )
    result = invoke("specs/mask.yaml", "--format", "json")
    assert result.exit_code == 0, result.output
    result = invoke("specs/overflows.yaml", "--format", "json")
    (entry,) = json.loads(result.stdout)["results"]
    assert (result.exit_code, entry["status"], entry["error"]) == (1, "fail", None), entry  # as before: its own story
