"""Arguments that are containers: ``list: [...]`` and ``dict: {...}`` entries, whose leaves are ordinary
argument entries, each its own row (``xs[0]``, ``feats.q``), checked by every check, and agreeing with
torch.autograd.gradcheck on the same (flattened) inputs."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch

from gradcheck_cli import check
from gradcheck_cli.examples import containers
from gradcheck_cli.numerics.streams import Streams
from gradcheck_cli.run.runner import bind_case
from gradcheck_cli.spec import DictArg, ListArg, SpecError, TensorArg, ValueArg, load_file
from gradcheck_cli.subject import inputs, loader
from gradcheck_cli.subject.binding import bind

REPO = Path(__file__).resolve().parents[2]
CAT = "gradcheck_cli.examples.containers:weighted_cat"
CAT_SPEC = """\
function: {fn}
inputs:
  - name: xs
    list: [{{shape: [2, 3]}}, {{shape: [4, 3]}}]
  - {{name: weights, shape: [2]}}
"""


def spec_of(fn: str = CAT) -> str:
    return CAT_SPEC.format(fn=fn)


def rows(result_json: str, check_name: str = "backward") -> dict[str, dict]:
    checks = json.loads(result_json)["results"][0]["checks"]
    return {r["name"]: r for c in checks if c["check"] == check_name for r in c["inputs"]}


# ----------------------------------------------------------------------- spec


def test_list_and_dict_entries_hold_ordinary_entries_with_their_key_paths(write_spec):
    (case,) = load_file(
        write_spec("""\
        function: pkg.mod:f
        inputs:
          - name: xs
            list: [{shape: [2]}, {value: 3}, {list: [{data: [1.0]}]}]
        kwargs:
          feats: {dict: {q: {shape: [2, 3], dist: uniform}, k: {same_as: 'xs[0]'}}}
    """)
    )
    xs, (name, feats) = case.inputs[0], case.kwargs[0]
    assert isinstance(xs, ListArg) and xs.name == "xs" and xs.key == "inputs[0]"
    assert isinstance(xs.items[0], TensorArg) and xs.items[0].key == "inputs[0].list[0]"
    assert isinstance(xs.items[1], ValueArg) and xs.items[1].value == 3
    assert isinstance(xs.items[2], ListArg) and xs.items[2].items[0].key == "inputs[0].list[2].list[0]"
    assert name == "feats" and isinstance(feats, DictArg) and [k for k, _ in feats.items] == ["q", "k"]
    assert feats.items[0][1].key == "kwargs.feats.dict.q"


@pytest.mark.parametrize(
    "entry, key, gist",
    [
        ("{list: []}", "inputs[0].list", "expected a non-empty list of argument entries"),
        ("{list: {shape: [2]}}", "inputs[0].list", "write `value: [...]`"),
        ("{dict: [{shape: [2]}]}", "inputs[0].dict", "expected a non-empty mapping of KEY: argument entry"),
        ("{dict: {}}", "inputs[0].dict", "expected a non-empty mapping"),
        ("{list: [{shape: [2], bogus: 1}]}", "inputs[0].list[0].bogus", "unknown key; allowed keys here: name, shape"),
        (
            "{list: [{shape: [2]}], shape: [3]}",
            "inputs[0]",
            "exactly one of shape, data, value, same_as, list, dict (found shape, list)",
        ),
        ("{list: [{shape: [2]}], dtype: float32}", "inputs[0].dtype", "unknown key; allowed keys here: name, list"),
        ("{list: [{name: a, shape: [2]}]}", "inputs[0].list[0].name", "named by its place"),
        ("{dict: {q: 3}}", "inputs[0].dict.q", "expected a mapping with one of shape"),
        ("{list: [{list: [{shape: [x]}]}]}", "inputs[0].list[0].list[0].shape", "expected a list of non-negative ints"),
    ],
)
def test_bad_container_entries_are_spec_errors_naming_the_key(write_spec, entry, key, gist):
    (err,) = load_file(write_spec(f"function: pkg.mod:f\ninputs:\n  - {entry}\n"))
    assert isinstance(err, SpecError) and err.key == key and gist in str(err), str(err)
    assert str(err).startswith(str(err.path) + ":3: " + key)


def test_a_bad_entry_exits_3_naming_file_and_key(write_spec, invoke):
    path = write_spec(f"function: {CAT}\ninputs:\n  - {{list: []}}\n  - {{shape: [1]}}\n")
    result = invoke(str(path), "--no-color", "--no-isolate")
    assert result.exit_code == 3, result.output
    assert f"{path}:3: inputs[0].list: expected a non-empty list" in result.output


def test_a_case_overrides_a_list_by_name(write_spec):
    path = write_spec(
        spec_of() + "cases:\n  - name: three\n    inputs:\n      xs: {list: [{shape: [1, 3]}, "
        "{shape: [1, 3]}, {shape: [1, 3]}]}\n      weights: {shape: [3]}\n"
    )
    (case,) = load_file(path)
    assert isinstance(case.inputs[0], ListArg) and len(case.inputs[0].items) == 3
    assert case.inputs[0].key == "cases[0].inputs.xs" and case.inputs[0].name == "xs"


# ----------------------------------------------------------------------- drawing and binding


def test_leaves_are_drawn_in_order_like_arguments_of_their_own(write_spec):
    """Same seed, same rules: the leaves of a list get the values the same entries get as separate arguments."""
    (listed,) = load_file(
        write_spec(
            "function: pkg.mod:f\nseed: 7\ninputs:\n"
            "  - {list: [{shape: [2]}, {shape: [3], dist: uniform}]}\n  - {shape: [2]}\n"
        )
    )
    (separate,) = load_file(
        write_spec(
            "function: pkg.mod:f\nseed: 7\ninputs:\n"
            "  - {shape: [2]}\n  - {shape: [3], dist: uniform}\n  - {shape: [2]}\n"
        )
    )
    (_, xs), (_, last) = inputs.build(listed, "cpu")[0]
    values = [v for _, v in inputs.build(separate, "cpu")[0]]
    assert isinstance(xs, list) and len(xs) == 2
    for got, want in zip(xs + [last], values):
        assert torch.equal(got, want) and got.requires_grad
    (_, again), _ = inputs.build(listed, "cpu")[0]
    assert all(torch.equal(a, b) for a, b in zip(xs, again))


def test_each_leaf_is_one_value_named_by_its_path_and_the_call_gets_the_containers_back(write_spec):
    (case,) = load_file(
        write_spec("""\
        function: gradcheck_cli.examples.containers:gated
        inputs:
          - name: feats
            dict: {x: {shape: [2]}, gate: {same_as: 'feats.x'}, extra: {list: [{value: 1}, {shape: [1]}]}}
    """)
    )
    target = loader.load(case.function)
    bound = bind_case(target, case, "cpu", Streams(case.seed))
    assert bound.names == ["feats.x", "feats.gate", "feats.extra[0]", "feats.extra[1]"]
    assert bound.indices == [0, 0, 0, 0]
    assert bound.values[1] is bound.values[0] and bound.values[2] == 1
    (feats,) = bound.arguments(bound.values)
    assert list(feats) == ["x", "gate", "extra"] and feats["x"] is bound.values[0]
    assert feats["extra"][1] is bound.values[3]
    assert bound.n_positional == 1 and bound.flatten([feats]) == bound.values


def test_a_module_s_parameters_follow_the_leaves(write_spec):
    (case,) = load_file(
        write_spec(
            "function: gradcheck_cli.examples.containers:ListMix\ninit: {kwargs: {n: 2}}\n"
            "inputs:\n  - {name: xs, list: [{shape: [3]}, {shape: [3]}]}\n"
        )
    )
    target = loader.load(case.function)
    from gradcheck_cli.subject.nn_module import init_target

    init_target(target, (), {"n": 2}, Streams(0), "float64", "cpu")
    bound = bind_case(target, case, "cpu", Streams(case.seed))
    assert bound.names == ["xs[0]", "xs[1]", "weight"] and bound.indices == [0, 0, 1]
    args = bound.arguments(bound.values)
    assert len(args) == 2 and args[0] == bound.values[:2] and args[1] is bound.values[2]


# ----------------------------------------------------------------------- checking


def test_the_shipped_container_specs_pass_and_the_broken_one_fails_on_its_leaf(invoke):
    result = invoke(str(REPO / "specs" / "containers.yaml"), "--format", "json", "--no-isolate")
    assert result.exit_code == 0, result.output
    report = json.loads(result.stdout)
    assert report["summary"]["failed"] == 0 and report["summary"]["errors"] == 0
    names = {r["name"] for res in report["results"] for c in res["checks"] for r in c["inputs"]}
    assert {"xs[0]", "xs[1]", "xs[2]", "feats.x", "feats.gate", "weight"} <= names
    broken = invoke(
        str(REPO / "broken-specs" / "containers_weighted_cat_second_slice.yaml"), "--format", "json", "--no-isolate"
    )
    assert broken.exit_code == 1, broken.output
    got = rows(broken.stdout)
    assert got["xs[1]"]["status"] == "fail" and got["xs[1]"]["index"] == 0
    assert got["xs[0]"]["status"] == "pass" and got["weights"]["status"] == "pass"


@pytest.mark.parametrize("fn, code", [(CAT, 0), (CAT + "_second_slice", 1)])
def test_every_check_applies_to_the_leaves(write_spec, invoke, fn, code):
    result = invoke(str(write_spec(spec_of(fn) + "checks: all\n")), "--format", "json", "--no-isolate")
    assert result.exit_code == code, result.output
    checks = {c["check"]: c for c in json.loads(result.stdout)["results"][0]["checks"]}
    for name in ("backward", "double_backward", "batched", "undefined_grad", "compile"):
        assert [r["name"] for r in checks[name]["inputs"]][:3] == ["xs[0]", "xs[1]", "weights"], name
    assert checks["backward"]["status"] == ("pass" if code == 0 else "fail")
    # backward's own derivative, vmap, compiled against eager: consistent, right or wrong
    for name in ("double_backward", "batched", "undefined_grad", "compile"):
        assert checks[name]["status"] == "pass", name
    assert "torch.func.vjp" in checks["compile"]["mode"]


def test_fast_mode_decides_on_the_leaves(write_spec, invoke):
    result = invoke(str(write_spec(spec_of(CAT + "_second_slice"))), "--fast", "--format", "json", "--no-isolate")
    assert result.exit_code == 1, result.output
    got = rows(result.stdout)
    assert got["xs[1]"]["status"] == "fail" and got["xs[0]"]["status"] == "pass"


def test_a_custom_op_with_a_tensor_list_and_a_kwargs_dict(write_spec, invoke):
    path = write_spec("""\
        function: torch.ops.gradcheck_examples.scaled_sum
        import: [gradcheck_cli.examples.containers]
        checks: [backward, opcheck, batched]
        kwargs:
          xs: {list: [{shape: [2]}, {shape: [2]}]}
          scale: {value: 3.0}
    """)
    result = invoke(str(path), "--format", "json", "--no-isolate")
    assert result.exit_code == 0, result.output
    assert [r["name"] for r in rows(result.stdout).values()] == ["xs[0]", "xs[1]", "scale"]
    assert all(c["status"] == "pass" for c in json.loads(result.stdout)["results"][0]["checks"])


def test_same_as_a_leaf_and_expect_by_a_leaf_s_name(write_spec, invoke):
    path = write_spec(f"""\
        function: {CAT}_second_slice
        expect: {{reason: "documented: the second slice", 'xs[1]': fail}}
        inputs:
          - name: xs
            list: [{{shape: [3, 2]}}, {{shape: [3, 2]}}, {{same_as: 'xs[0]'}}]
          - {{name: weights, shape: [3]}}
    """)
    result = invoke(str(path), "--format", "json", "--no-isolate")
    assert result.exit_code == 0, result.output
    got = rows(result.stdout)
    assert got["xs[1]"]["status"] == "xfail"
    assert got["xs[2]"]["status"] == "skip" and "same tensor as 'xs[0]'" in got["xs[2]"]["reason"]


def test_a_function_given_a_list_of_tensors_is_told_to_unpack_it(write_spec, invoke):
    path = write_spec(
        "function: gradcheck_cli.examples.containers:Gate\ninputs:\n"
        "  - {name: pair, list: [{shape: [3]}, {shape: [3]}]}\n"
    )
    result = invoke(str(path), "--no-color", "--no-isolate")
    assert result.exit_code == 3, result.output
    text = " ".join(result.output.split())
    assert "inputs[0]:" in text and "apply() tracks only the tensors passed to it directly" in text
    assert "def f(xs): return Gate.apply(*xs)" in text


def test_reference_backward_gets_and_returns_the_containers(user_module, write_spec, invoke):
    mod = user_module(
        """
        import torch
        def grads(inputs, grad_outputs):
            xs, weights = inputs
            parts = grad_outputs[0].split([x.shape[0] for x in xs])
            return [w * p for w, p in zip(weights, parts)], torch.stack([(p * x).sum() for p, x in zip(parts, xs)])
        def flat(inputs, grad_outputs):
            return None, None, None
    """,
        name="refgrads",
    )
    good = invoke(
        str(write_spec(spec_of(CAT + "_second_slice") + f"reference_backward: {mod}:grads\n")),
        "--format",
        "json",
        "--no-isolate",
    )
    assert good.exit_code == 1, good.output
    got = rows(good.stdout, "reference")
    assert got["xs[1]"]["status"] == "fail" and got["xs[0]"]["status"] == "pass"
    bad = invoke(str(write_spec(spec_of() + f"reference_backward: {mod}:flat\n")), "--no-color", "--no-isolate")
    assert bad.exit_code == 3, bad.output
    assert "a list or dict of gradients for a `list:` or `dict:` argument" in " ".join(bad.output.split())


def test_init_writes_a_list_entry_for_a_tensor_list_argument_and_it_runs(invoke, tmp_path):
    result = invoke("init", "torch.ops.gradcheck_examples.scaled_sum", "--import", "gradcheck_cli.examples.containers")
    assert result.exit_code == 0, result.output
    assert "- {name: xs, list: [{shape: [4, 5]}, {shape: [4, 5]}]}   # Tensor[]" in result.stdout
    path = tmp_path / "scaled_sum.yaml"
    path.write_text(result.stdout, encoding="utf-8")
    run = invoke(str(path), "--no-isolate")
    assert run.exit_code == 0, run.output


# ----------------------------------------------------------------------- agreement with torch.autograd.gradcheck


@pytest.mark.parametrize("fn", [containers.weighted_cat, containers.weighted_cat_second_slice])
def test_verdicts_agree_with_torch_gradcheck_on_the_flattened_leaves(write_spec, fn):
    """torch.autograd.gradcheck takes the leaves through a wrapper that rebuilds the list; the same drawn values."""
    (case,) = load_file(write_spec(spec_of(f"{fn.__module__}:{fn.__name__}")))
    bound = bind_case(loader.load(case.function), case, "cpu", Streams(case.seed))

    def flat(*values: torch.Tensor) -> torch.Tensor:
        return fn(*bound.assemble(values))

    theirs = torch.autograd.gradcheck(flat, tuple(bound.values), raise_exception=False)
    ours = check(flat, list(bound.values))
    assert bool(ours) == theirs == (fn is containers.weighted_cat)
    # and the spec's own run, with the list rebuilt by the tool
    from gradcheck_cli.run.runner import run_case

    assert (run_case(case, "cpu").status.value == "pass") == theirs


def test_binding_without_spec_entries_passes_lists_through():
    """The library API binds values it was given: no entries, so nothing is spread (a list stays one value)."""
    target = loader.load(CAT)
    xs = [torch.ones(2, 3, dtype=torch.float64, requires_grad=True)]
    bound = bind(target, [(None, xs), (None, torch.ones(1))], [])
    assert bound.places == [] and bound.arguments(bound.values)[0] is xs
