"""Structured inputs: dist spd, symmetric, orthogonal, simplex, sorted, permutation, positive, drawn
on their set from the seed; randint bounds tied to another argument's size; symmetric inputs
perturbed along the symmetric matrices, and `param:` transforms."""

from __future__ import annotations

import json
from dataclasses import replace

import pytest
import torch

from gradcheck_cli.examples.structured import Cholesky, CholeskyNoHalf
from gradcheck_cli.spec import Case, SpecError, load_file
from gradcheck_cli.subject import inputs
from gradcheck_cli.subject.structured import symmetric_part

HEAD = "function: pkg.mod:Fn\n"


def case_of(write_spec, text: str) -> Case:
    (case,) = load_file(write_spec(HEAD + text))
    assert isinstance(case, Case), case
    return case


def draw(write_spec, text: str, seed: int = 0) -> list[torch.Tensor]:
    case = replace(case_of(write_spec, text), seed=seed)
    return [v for _, v in inputs.build(case, "cpu")[0]]


def error(write_spec, text: str) -> str:
    (err,) = load_file(write_spec(HEAD + text))
    assert isinstance(err, SpecError), err
    return str(err)


ALL = """\
inputs:
  - {name: s, shape: [3, 4, 4], dist: spd}
  - {name: y, shape: [5, 5], dist: symmetric}
  - {name: q, shape: [6, 3], dist: orthogonal}
  - {name: r, shape: [2, 5], dist: orthogonal}
  - {name: p, shape: [4, 3], dist: simplex, dim: 0}
  - {name: k, shape: [3, 7], dist: sorted, low: -2, high: 2}
  - {name: perm, shape: [4, 6], dist: permutation, dim: 1}
  - {name: pos, shape: [1000], dist: positive, low: 0.01, high: 100}
  - {name: idx, shape: [50], dtype: int64, dist: randint, low: 1, high: {size_of: k, dim: 1}}
"""


def test_every_structured_dist_draws_on_its_set(write_spec):
    s, y, q, r, p, k, perm, pos, idx = draw(write_spec, ALL)
    assert torch.equal(s, s.mT) and torch.linalg.eigvalsh(s).min() >= 1 - 1e-12
    assert torch.equal(y, y.mT) and not torch.equal(y, torch.zeros_like(y))
    assert torch.allclose(q.mT @ q, torch.eye(3, dtype=q.dtype)) and torch.allclose(
        r @ r.mT, torch.eye(2, dtype=r.dtype)
    )
    assert (p > 0).all() and torch.allclose(p.sum(0), torch.ones(3, dtype=p.dtype))
    assert (k.diff(dim=1) > 0).all() and k.min() > -2 and k.max() < 2
    assert perm.dtype == torch.int64 and not perm.requires_grad
    assert all(sorted(row.tolist()) == list(range(6)) for row in perm)
    assert pos.min() >= 0.01 and pos.max() <= 100 and pos.min() < 0.1 and pos.max() > 10  # spread over scales
    assert idx.dtype == torch.int64 and idx.min() >= 1 and idx.max() <= 6  # below k's size along dim 1, 7
    assert all(t.requires_grad for t in (s, y, q, r, p, k, pos))


def test_same_seed_same_draw_another_seed_another(write_spec):
    first, again, other = draw(write_spec, ALL), draw(write_spec, ALL), draw(write_spec, ALL, seed=1)
    assert all(torch.equal(a, b) for a, b in zip(first, again))
    assert not any(torch.equal(a, b) for a, b in zip(first, other))


def test_the_seed_option_redraws_structured_inputs(write_spec, invoke):
    path = write_spec("""\
        function: gradcheck_cli.examples.structured:Cholesky
        inputs: [{name: a, shape: [3, 3], dist: spd}]
    """)
    numbers = []
    for seed in ("0", "0", "1"):
        result = invoke(str(path), "--seed", seed, "--format", "json")
        assert result.exit_code == 0, result.output
        numbers.append(json.loads(result.stdout)["results"][0]["checks"][0]["inputs"][0]["analytical"])
    assert numbers[0] == numbers[1] != numbers[2]


@pytest.mark.parametrize(
    "text, key, gist",
    [
        ("{shape: [3], dist: spd}", "inputs[0].shape", "at least 2 dimensions (..., n, n), got [3]"),
        ("{shape: [3, 4], dist: symmetric}", "inputs[0].shape", "square matrices"),
        ("{shape: [3, 3], dist: spd, dtype: complex128}", "inputs[0].dtype", "draws real tensors"),
        ("{shape: [3, 3], dist: sorted, dtype: int64}", "inputs[0].dtype", "floating-point values"),
        ("{shape: [3, 3], dist: simplex, dim: 2}", "inputs[0].dim", "an int within shape [3, 3]"),
        ("{shape: [3], dist: sorted, dim: x}", "inputs[0].dim", "expected a dimension"),
        ("{shape: [3], dist: normal, dim: 0}", "inputs[0].dim", "`dim` does not apply to dist normal"),
        (
            "{shape: [3, 3], dist: spd, low: 1}",
            "inputs[0].low",
            "`low` does not apply to dist spd; it takes no parameters",
        ),
        ("{shape: [3], dist: sorted, mean: 1}", "inputs[0].mean", "it takes low, high, dim"),
        ("{shape: [3], dist: positive, low: 0}", "inputs[0].low", "expected low > 0"),
        ("{shape: [3], dist: sorted, low: 2, high: 1}", "inputs[0].high", "expected high > low"),
        ("{shape: [3], dist: sorted, avoid: [[0, 0.1]]}", "inputs[0].avoid", "would leave the set dist sorted"),
        (
            "{shape: [3], dist: uniform, high: {size_of: x}}",
            "inputs[0].high",
            "for dist randint (indices), not uniform",
        ),
        ("{shape: [3], dist: randint, high: {size_of: 3}}", "inputs[0].high.size_of", "name of another argument"),
        ("{shape: [3], dist: randint, high: {size_of: x, dim: a}}", "inputs[0].high.dim", "a dimension of 'x'"),
        ("{shape: [3], dist: randint, high: {size_of: x, axis: 0}}", "inputs[0].high.axis", "unknown key"),
        ("{shape: [3], param: nope}", "inputs[0].param", "expected an import path"),
    ],
)
def test_bad_structured_entries_name_the_key(write_spec, text, key, gist):
    msg = error(write_spec, f"inputs:\n  - {text}\n")
    assert f":3: {key}: " in msg and gist in msg, msg


@pytest.mark.parametrize(
    "entries, key, gist",
    [
        (
            "[{shape: [3], dtype: int64, high: {size_of: x}}, {name: x, shape: [4]}]",
            "inputs[0].high.size_of",
            "'x' is not an earlier argument",
        ),
        (
            "[{name: x, value: 3}, {shape: [3], dtype: int64, high: {size_of: x}}]",
            "inputs[1].high.size_of",
            "'x' is not a tensor",
        ),
        (
            "[{name: x, shape: [4]}, {shape: [3], dtype: int64, high: {size_of: x, dim: 1}}]",
            "inputs[1].high.dim",
            "'x' has shape [4]: no dimension 1",
        ),
        (
            "[{name: x, shape: [0]}, {shape: [3], dtype: int64, high: {size_of: x}}]",
            "inputs[1].high",
            "expected high > low, got low=0, high=0 (the size of 'x')",
        ),
    ],
)
def test_bounds_tied_to_a_missing_or_small_argument_are_errors(write_spec, entries, key, gist):
    case = case_of(write_spec, f"inputs: {entries}\n")
    with pytest.raises(inputs.InputError) as info:
        inputs.build(case, "cpu")
    assert info.value.key == key and gist in str(info.value), (info.value.key, str(info.value))


def test_elementwise_finite_differences_cannot_check_a_function_defined_on_symmetric_matrices():
    """Why symmetric inputs are perturbed in pairs: cholesky reads the lower triangle only, so torch's
    elementwise gradcheck fails a correct backward; through (A + A^T)/2 it agrees with ours."""
    a = symmetric_part(torch.randn(4, 4, dtype=torch.float64, generator=torch.Generator().manual_seed(0)))
    a = (a @ a.mT + torch.eye(4, dtype=torch.float64)).requires_grad_()
    assert not torch.autograd.gradcheck(Cholesky.apply, (a,), raise_exception=False)
    assert torch.autograd.gradcheck(lambda x: Cholesky.apply(symmetric_part(x)), (a,))
    assert not torch.autograd.gradcheck(lambda x: CholeskyNoHalf.apply(symmetric_part(x)), (a,), raise_exception=False)


def test_shipped_structured_specs_pass_and_the_broken_cholesky_fails(invoke):
    good = invoke("specs/structured.yaml", "--format", "json", "--no-isolate")
    assert good.exit_code == 0, good.output
    rows = {r["id"]: r["checks"][0]["inputs"][0] for r in json.loads(good.stdout)["results"]}
    assert rows["specs/structured.yaml#1::spd[cpu]"]["via"] == "sym"
    assert rows["specs/structured.yaml#1::param[cpu]"]["via"] == "gradcheck_cli.examples.structured:spd_of"
    assert rows["specs/structured.yaml#3::default[cpu]"]["via"] is None
    bad = invoke("broken-specs/structured_cholesky_diagonal.yaml", "--no-color", "-v", "--no-isolate")
    assert bad.exit_code == 1, bad.output
    assert "0: a (via sym)" in bad.stdout and "gradient of 'a': wrong" in bad.stdout


def test_every_check_applies_through_the_symmetric_map(invoke):
    result = invoke("specs/structured.yaml", "-k", "spd", "--check", "all", "--format", "json", "--no-isolate")
    assert result.exit_code == 0, result.output
    statuses = {c["check"]: c["status"] for c in json.loads(result.stdout)["results"][0]["checks"]}
    assert statuses["double_backward"] == statuses["batched"] == "pass", statuses  # Cholesky has no jvp: skip


def test_a_param_that_cannot_be_imported_names_its_key(write_spec, invoke):
    path = write_spec("""\
        function: gradcheck_cli.examples.structured:Cholesky
        inputs: [{name: a, shape: [3, 3], param: "gradcheck_cli.examples.structured:spd_off"}]
    """)
    result = invoke(str(path), "--no-color")
    assert result.exit_code == 3, result.output
    assert "inputs[0].param: 'gradcheck_cli.examples.structured' has no attribute 'spd_off'" in result.output
    assert "did you mean 'spd_of'" in result.output
