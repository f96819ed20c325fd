"""Spec files: strict validation with messages that name file, line and key path; defaults; cases.

Contract (section 3): unknown keys are errors that list the key and the allowed ones; every
error names the file and the key path, e.g.
``specs/linear.yaml: inputs[1].shape: expected a list of non-negative ints, got 'x'``
(our messages add ``:LINE`` after the file).
"""

from __future__ import annotations

import inspect
import math
import re
from pathlib import Path
from typing import Union

import pytest
import torch

from gradcheck_cli import spec
from gradcheck_cli.spec import AliasArg, Case, SpecError, TensorArg, Tolerance, ValueArg, load_file

GOOD = "function: pkg.mod:Fn\n"


# ----------------------------------------------------------------------- helpers


def cases_of(path: Union[str, Path]) -> list[Case]:
    """Load a file that must be valid; return its cases."""
    items = load_file(path)
    errors = [str(i) for i in items if isinstance(i, SpecError)]
    assert not errors, errors
    return items


def only_case(path: Union[str, Path]) -> Case:
    items = cases_of(path)
    assert len(items) == 1, items
    return items[0]


def error_of(path: Union[str, Path]) -> SpecError:
    """Load a file that must hold exactly one error (and nothing else); return it."""
    items = load_file(path)
    assert len(items) == 1 and isinstance(items[0], SpecError), items
    return items[0]


def assert_error(err: SpecError, path: Union[str, Path], key: str, *gist: str, line: Union[int, None] = None) -> str:
    """The message names ``path`` (with ``:line``), the key path ``key``, and says each ``gist``."""
    msg = str(err)
    assert err.path == str(path)
    assert err.key == key
    head = f"{path}:{line}: " if line is not None else f"{path}:"
    assert msg.startswith(head), msg
    if key:
        assert re.match(rf"^{re.escape(str(path))}(:\d+)?: {re.escape(key)}: ", msg), msg
    for g in gist:
        assert g in msg, f"{g!r} not in {msg!r}"
    if line is not None:
        assert err.line == line
    return msg


# ----------------------------------------------------------------------- unknown keys


def test_unknown_top_level_key_names_the_key_and_lists_the_allowed_ones(write_spec):
    path = write_spec("""\
        function: pkg.mod:Fn
        inptus:
          - shape: [2]
    """)
    msg = assert_error(error_of(path), path, "inptus", "unknown key", line=2)
    for allowed in spec.TOP_KEYS:
        assert allowed in msg


def test_unknown_key_in_an_input_entry(write_spec):
    path = write_spec("""\
        function: pkg.mod:Fn
        inputs:
          - shape: [2]
          - shape: [3]
            distribution: uniform
    """)
    msg = assert_error(error_of(path), path, "inputs[1].distribution", "unknown key", line=5)
    for allowed in ("shape", "dtype", "dist", "low", "high", "avoid", "requires_grad"):
        assert allowed in msg


def test_unknown_key_in_a_value_entry_lists_what_a_value_entry_takes(write_spec):
    path = write_spec("""\
        function: pkg.mod:Fn
        inputs:
          - {value: 1, dtype: float32}
    """)
    assert_error(error_of(path), path, "inputs[0].dtype", "unknown key", "name, value", line=3)


def test_unknown_key_in_tolerance(write_spec):
    path = write_spec("""\
        function: pkg.mod:Fn
        tolerance:
          eps: 1.0e-6
          abs_tol: 1.0e-5
    """)
    msg = assert_error(error_of(path), path, "tolerance.abs_tol", "unknown key", line=4)
    for allowed in ("eps", "atol", "rtol"):
        assert allowed in msg


def test_unknown_key_in_a_case(write_spec):
    path = write_spec("""\
        function: pkg.mod:Fn
        cases:
          - name: small
            seed: 1
          - name: big
            sed: 2
    """)
    msg = assert_error(error_of(path), path, "cases[1].sed", "unknown key", line=6)
    for allowed in ("name", "seed", "inputs", "tolerance"):
        assert allowed in msg
    assert "cases" not in msg.split("allowed", 1)[1]  # a case cannot hold cases


# ----------------------------------------------------------------------- function


def test_missing_function_says_how_to_name_one(write_spec):
    path = write_spec("""\
        description: no function here
        inputs: [{shape: [2]}]
    """)
    assert_error(error_of(path), path, "function", "missing", "function: pkg.mod:")


@pytest.mark.parametrize("value", ["Linear", "'pkg.mod:'", "'pkg mod:Fn'", "3", "[pkg.mod, Fn]", "'pkg.mod:Fn:X'"])
def test_function_that_is_not_an_import_path(write_spec, value):
    path = write_spec(f"function: {value}\n")
    assert_error(error_of(path), path, "function", "import path", "pkg.mod:MyFunction", line=1)


@pytest.mark.parametrize("value", ["pkg.mod:Fn", "pkg.mod.Fn", "pkg.mod:Outer.Inner", "_p.m2:F_1"])
def test_function_import_path_forms_are_accepted(write_spec, value):
    path = write_spec(f"function: {value}\n")
    assert only_case(path).function == value


# ----------------------------------------------------------------------- tensor entries


def test_shape_message_matches_the_contract_example(write_spec, tmp_path, monkeypatch):
    write_spec(
        """\
        function: gradcheck_cli.examples.linear:LinearFunction
        inputs:
          - shape: [20, 20]
          - name: weight
            shape: x
    """,
        "specs/linear.yaml",
    )
    monkeypatch.chdir(tmp_path)
    err = error_of("specs/linear.yaml")
    assert str(err) == "specs/linear.yaml:5: inputs[1].shape: expected a list of non-negative ints, got 'x'"


@pytest.mark.parametrize("shape", ["[2, -1]", "[2.5, 3]", "[true]", "[[2, 3]]", "3", "'2x3'", "null"])
def test_shape_must_be_a_list_of_non_negative_ints(write_spec, shape):
    path = write_spec(f"""\
        function: pkg.mod:Fn
        inputs:
          - shape: {shape}
    """)
    assert_error(error_of(path), path, "inputs[0].shape", "expected a list of non-negative ints", line=3)


@pytest.mark.parametrize("shape, expected", [("[]", ()), ("[0]", (0,)), ("[2, 3, 4]", (2, 3, 4)), ("[2.0, 3]", (2, 3))])
def test_valid_shapes_including_0d(write_spec, shape, expected):
    path = write_spec(f"{GOOD}inputs: [{{shape: {shape}}}]\n")
    shape = only_case(path).inputs[0].shape
    assert shape == expected and all(type(d) is int for d in shape)


def test_unknown_dtype_lists_the_known_ones(write_spec):
    path = write_spec("""\
        function: pkg.mod:Fn
        inputs:
          - shape: [2]
            dtype: float128
    """)
    assert_error(error_of(path), path, "inputs[0].dtype", "'float128'", "float64", "complex128", "int64", line=4)


def test_unknown_top_level_dtype(write_spec):
    path = write_spec(f"{GOOD}dtype: double_precision\n")
    assert_error(error_of(path), path, "dtype", "'double_precision'", "float64", line=2)


@pytest.mark.parametrize(
    "alias, canonical", [("double", "float64"), ("float", "float32"), ("long", "int64"), ("cdouble", "complex128")]
)
def test_dtype_aliases_are_normalised(write_spec, alias, canonical):
    path = write_spec(f"{GOOD}dtype: {alias}\ninputs: [{{shape: [2], dtype: {alias}}}]\n")
    case = only_case(path)
    assert case.dtype == canonical
    assert case.inputs[0].dtype == canonical


@pytest.mark.parametrize("device", ["gpu", "'cuda:x'", "[]", "[cpu, tpu]", "0"])
def test_bad_device(write_spec, device):
    path = write_spec(f"{GOOD}device: {device}\n")
    assert_error(error_of(path), path, "device", "cpu", "cuda", line=2)


def test_device_forms_are_accepted_and_deduplicated(write_spec):
    path = write_spec(f"{GOOD}device: [cpu, 'cuda:1', cuda, cpu]\n")
    assert only_case(path).devices == ("cpu", "cuda:1", "cuda")
    path = write_spec(f"{GOOD}device: 'cuda:0'\n", "one.yaml")
    assert only_case(path).devices == ("cuda:0",)


def test_unknown_dist_lists_the_known_ones(write_spec):
    path = write_spec("""\
        function: pkg.mod:Fn
        inputs:
          - shape: [2]
            dist: gamma
    """)
    assert_error(error_of(path), path, "inputs[0].dist", "'gamma'", "normal", "uniform", "randint", line=4)


@pytest.mark.parametrize(
    "dist, param, takes",
    [
        ("normal", "low", "mean, std"),
        ("normal", "high", "mean, std"),
        ("uniform", "mean", "low, high"),
        ("randint", "std", "low, high"),
    ],
)
def test_parameter_that_does_not_apply_to_the_dist(write_spec, dist, param, takes):
    path = write_spec(f"""\
        function: pkg.mod:Fn
        inputs:
          - shape: [2]
            dist: {dist}
            {param}: 1
    """)
    assert_error(error_of(path), path, f"inputs[0].{param}", f"`{param}`", dist, takes, line=5)


def test_parameter_of_the_default_dist_normal(write_spec):
    # no `dist:` -> normal, which takes no `low`
    path = write_spec(f"{GOOD}inputs: [{{shape: [2], low: 0}}]\n")
    assert_error(error_of(path), path, "inputs[0].low", "normal", "mean, std")


@pytest.mark.parametrize(
    "params, low, high",
    [
        ("dist: uniform, low: 1, high: 1", 1.0, 1.0),
        ("dist: uniform, low: 2, high: -1", 2.0, -1.0),
        ("dist: uniform, low: 2", 2.0, 1.0),  # the default high (1) is below the given low
        ("dist: randint, low: 5, high: 2", 5.0, 2.0),
    ],
)
def test_high_must_be_above_low(write_spec, params, low, high):
    path = write_spec(f"{GOOD}inputs:\n  - {{shape: [2], {params}}}\n")
    assert_error(error_of(path), path, "inputs[0].high", "high > low", f"low={low}", f"high={high}", line=3)


@pytest.mark.parametrize(
    "avoid, key",
    [
        ("[0, 1]", "inputs[0].avoid"),
        ("[[0]]", "inputs[0].avoid"),
        ("[[0, 1, 2]]", "inputs[0].avoid"),
        ("'0..1'", "inputs[0].avoid"),
        ("[[1, 0]]", "inputs[0].avoid"),  # lo > hi
        ("[[-1, 1], [a, 2]]", "inputs[0].avoid[1][0]"),
    ],
)
def test_bad_avoid(write_spec, avoid, key):
    path = write_spec(f"""\
        function: pkg.mod:Fn
        inputs:
          - shape: [2]
            avoid: {avoid}
    """)
    msg = assert_error(error_of(path), path, key, line=4)
    assert "interval" in msg or "number" in msg


def test_avoid_is_parsed_into_float_intervals(write_spec):
    path = write_spec(f"{GOOD}inputs: [{{shape: [2], avoid: [[-0.1, 0.1], [1, 2]]}}]\n")
    assert only_case(path).inputs[0].avoid == ((-0.1, 0.1), (1.0, 2.0))


@pytest.mark.parametrize("value", ["'yes'", "1", "'true'", "[true]"])
def test_requires_grad_must_be_a_bool(write_spec, value):
    path = write_spec(f"""\
        function: pkg.mod:Fn
        inputs:
          - shape: [2]
            requires_grad: {value}
    """)
    assert_error(error_of(path), path, "inputs[0].requires_grad", "true or false", line=4)


@pytest.mark.parametrize(
    "entry, found",
    [
        ("{name: x}", "none"),
        ("{dtype: float32}", "none"),
        ("{shape: [2], data: [1, 2]}", "shape, data"),
        ("{shape: [2], value: 3}", "shape, value"),
        ("{same_as: x, value: 3}", "value, same_as"),
        ("{data: [1], same_as: x}", "data, same_as"),
    ],
)
def test_entry_needs_exactly_one_of_shape_data_value_same_as(write_spec, entry, found):
    path = write_spec(f"""\
        function: pkg.mod:Fn
        inputs:
          - shape: [2]
          - {entry}
    """)
    assert_error(error_of(path), path, "inputs[1]", "exactly one of shape, data, value, same_as", found, line=4)


def test_entry_that_is_not_a_mapping(write_spec):
    path = write_spec(f"{GOOD}inputs: [[2, 3]]\n")
    assert_error(error_of(path), path, "inputs[0]", "shape, data, value, same_as")


def test_kwargs_entry_errors_name_the_keyword(write_spec):
    path = write_spec("""\
        function: pkg.mod:Fn
        kwargs:
          dim: {value: 1}
          scale: {shape: [2], dist: poisson}
    """)
    assert_error(error_of(path), path, "kwargs.scale.dist", "'poisson'", line=4)


def test_data_and_dist_together_are_refused(write_spec):
    path = write_spec(f"{GOOD}inputs: [{{data: [1.0, 2.0], dist: uniform}}]\n")
    assert_error(error_of(path), path, "inputs[0].dist", "data")


# ----------------------------------------------------------------------- seed, checks, cases


@pytest.mark.parametrize("seed", ["-1", "'3'", "abc", "1.5", "true", "null"])
def test_seed_must_be_a_non_negative_integer(write_spec, seed):
    path = write_spec(f"{GOOD}seed: {seed}\n")
    assert_error(error_of(path), path, "seed", "non-negative integer", line=2)


def test_unknown_check_name_lists_the_known_checks(write_spec):
    path = write_spec("""\
        function: pkg.mod:Fn
        checks:
          - backward
          - doubel_backward
    """)
    msg = assert_error(error_of(path), path, "checks[1]", "'doubel_backward'", line=4)
    for name in spec.CHECKS:
        assert name in msg
    assert "all" in msg


@pytest.mark.parametrize("value", ["all", "[all]"])
def test_checks_all_means_every_check(write_spec, value):
    path = write_spec(f"{GOOD}checks: {value}\n")
    checks = only_case(path).checks
    assert set(checks) == set(spec.CHECKS)
    assert "backward" in checks and "double_backward" in checks and "forward_ad" in checks


def test_checks_default_and_single_name(write_spec):
    assert only_case(write_spec(GOOD)).checks == ("backward",)
    path = write_spec(f"{GOOD}checks: double_backward\n", "one.yaml")
    assert only_case(path).checks == ("double_backward",)


def test_empty_checks_list_is_an_error(write_spec):
    path = write_spec(f"{GOOD}checks: []\n")
    assert_error(error_of(path), path, "checks", "check names")


@pytest.mark.parametrize("value", ["{a: {seed: 1}}", "small", "[]"])
def test_cases_must_be_a_non_empty_list(write_spec, value):
    path = write_spec(f"{GOOD}cases: {value}\n")
    assert_error(error_of(path), path, "cases", "list", line=2)


def test_duplicate_case_names(write_spec):
    path = write_spec("""\
        function: pkg.mod:Fn
        cases:
          - name: square
            seed: 1
          - name: square
            seed: 2
    """)
    assert_error(error_of(path), path, "cases[1].name", "unique", "'square'", line=5)


def test_case_that_is_not_a_mapping(write_spec):
    path = write_spec(f"{GOOD}cases:\n  - small\n")
    assert_error(error_of(path), path, "cases[0]", "mapping", line=3)


# ----------------------------------------------------------------------- YAML level


def test_duplicate_top_level_key_is_refused(write_spec):
    path = write_spec("""\
        function: pkg.mod:Fn
        seed: 1
        seed: 2
    """)
    assert_error(error_of(path), path, "seed", "duplicate", line=3)


@pytest.mark.parametrize("text", ["? function: pkg.mod:Fn\n: 1\n", "? [a, b]\n: 1\nfunction: pkg.mod:Fn\n"])
def test_a_complex_key_is_a_spec_error(write_spec, text):
    # it crashed the loader (TypeError: unhashable type: 'list'), found by test_spec_fuzz
    path = write_spec(text)
    error = error_of(path)
    assert "a key must be a plain name" in str(error) and error.line == 1


def test_duplicate_key_in_a_nested_mapping_is_refused(write_spec):
    path = write_spec("""\
        function: pkg.mod:Fn
        inputs:
          - shape: [2]
            dtype: float32
            dtype: float64
    """)
    assert_error(error_of(path), path, "inputs[0].dtype", "duplicate", line=5)


def test_a_key_next_to_a_merge_key_overrides_the_merged_one(write_spec):
    # YAML 1.1 merge keys: the mapping's own keys win over the merged ones (was: "duplicate key")
    path = write_spec("""\
        function: pkg.mod:Fn
        tolerance: &tol {eps: 1.0e-6, atol: 1.0e-5}
        cases:
          - name: loose
            tolerance: {<<: *tol, atol: 1.0e-4}
    """)
    assert only_case(path).tolerance == Tolerance(eps=1e-6, atol=1e-4)


def test_merges_nest_and_the_earlier_mapping_of_a_list_wins(write_spec):
    path = write_spec("""\
        function: pkg.mod:Fn
        inputs:
          - &base {shape: [2], dtype: float32, dist: uniform, low: 0.0, high: 1.0}
          - &wide {<<: *base, shape: [4], high: 2.0}
          - {<<: *wide, requires_grad: false}
          - {<<: [*wide, *base], low: 0.5}
          - {<<: [*base, *wide]}
    """)
    args = only_case(path).inputs
    assert all(isinstance(a, TensorArg) and a.dtype == "float32" for a in args)
    assert [(a.shape, dict(a.params), a.requires_grad) for a in args] == [
        ((2,), {"low": 0.0, "high": 1.0}, None),
        ((4,), {"low": 0.0, "high": 2.0}, None),
        ((4,), {"low": 0.0, "high": 2.0}, False),
        ((4,), {"low": 0.5, "high": 2.0}, None),
        ((2,), {"low": 0.0, "high": 1.0}, None),
    ]


def test_a_key_written_twice_next_to_a_merge_key_is_still_a_duplicate(write_spec):
    path = write_spec("""\
        function: pkg.mod:Fn
        inputs:
          - &x {shape: [2]}
          - <<: *x
            shape: [3]
            shape: [4]
    """)
    assert_error(error_of(path), path, "inputs[1].shape", "duplicate", line=6)


def test_two_merge_keys_in_one_mapping_are_a_duplicate_that_says_how_to_merge_several(write_spec):
    path = write_spec("""\
        function: pkg.mod:Fn
        inputs:
          - &x {shape: [2]}
          - &y {dtype: float32}
          - <<: *x
            <<: *y
    """)
    assert_error(error_of(path), path, "inputs[2].<<", "duplicate", "<<: [*a, *b]", line=6)


@pytest.mark.parametrize("value", ["1", "[*x, 2]", "[[*x]]"])
def test_a_merge_key_must_name_mappings(write_spec, value):
    path = write_spec(f"{GOOD}inputs:\n  - &x {{shape: [2]}}\n  - {{<<: {value}}}\n")
    assert_error(error_of(path), path, "inputs[1].<<", "a mapping or a list of mappings", line=4)


def test_an_error_in_a_merged_value_names_the_line_where_it_is_written(write_spec):
    path = write_spec("""\
        function: pkg.mod:Fn
        inputs: [&x {shape: [2], dist: uniform, low: 0.0, high: 1.0}]
        cases:
          - name: shifted
            inputs: [{<<: *x, low: 2.0}]
    """)
    assert_error(error_of(path), path, "cases[0].inputs[0].high", "high > low", line=2)


def test_yaml_syntax_error_reports_the_line(write_spec):
    path = write_spec("""\
        function: pkg.mod:Fn
        seed: 0
        description: a: b
        inputs: []
    """)
    err = error_of(path)
    msg = assert_error(err, path, "", "YAML", line=3)
    assert "mapping values are not allowed" in msg


def test_yaml_syntax_error_unclosed_bracket(write_spec):
    path = write_spec("""\
        function: pkg.mod:Fn
        inputs:
          - shape: [2, 3
          - shape: [4]
    """)
    err = error_of(path)
    assert err.line is not None and err.line >= 3
    assert_error(err, path, "", "YAML", line=err.line)


def test_tab_indentation_is_a_syntax_error_with_a_line(write_spec):
    path = write_spec("function: pkg.mod:Fn\ninputs:\n\t- shape: [2]\n")
    err = error_of(path)
    assert_error(err, path, "", "YAML", line=3)


def test_python_tags_are_refused_by_the_safe_loader(write_spec):
    path = write_spec("function: !!python/name:os.system\n")
    err = error_of(path)
    assert_error(err, path, "", "YAML")


@pytest.mark.parametrize("text", ["", "\n\n", "# only a comment\n", "---\n", "~\n"])
def test_empty_file_says_what_it_needs(write_spec, text):
    path = write_spec(text)
    assert_error(error_of(path), path, "", "no spec", "function")


def test_document_that_is_not_a_mapping(write_spec):
    path = write_spec("- function: pkg.mod:Fn\n")
    assert_error(error_of(path), path, "", "mapping", "function")


def test_missing_file_is_an_error_not_a_crash(tmp_path):
    path = tmp_path / "nope.yaml"
    err = error_of(path)
    assert_error(err, path, "", "cannot read")


def test_directory_instead_of_a_file_is_an_error_not_a_crash(tmp_path):
    path = tmp_path / "specs.yaml"
    path.mkdir()
    assert_error(error_of(path), path, "", "cannot read")


def test_file_that_is_not_utf8_is_an_error_not_a_crash(tmp_path):
    path = tmp_path / "latin1.yaml"
    path.write_bytes("function: pkg.mod:Fn\ndescription: caf\xe9 \xff\n".encode("latin-1"))
    assert_error(error_of(path), path, "", "cannot read")


# ----------------------------------------------------------------------- several documents


def test_bad_document_does_not_hide_the_good_ones(write_spec):
    path = write_spec("""\
        function: pkg.mod:Good
        inputs: [{shape: [2]}]
        ---
        function: pkg.mod:Bad
        inputs: [{shape: [2], dtype: float128}]
        ---
        function: pkg.mod:AlsoGood
    """)
    items = load_file(path)
    assert len(items) == 3
    good, bad, also_good = items
    assert isinstance(good, Case) and good.function == "pkg.mod:Good"
    assert isinstance(also_good, Case) and also_good.function == "pkg.mod:AlsoGood"
    assert isinstance(bad, SpecError)
    # the line is counted in the file, not in the document
    assert_error(bad, path, "inputs[0].dtype", "float128", line=5)
    assert (good.doc, also_good.doc, good.n_docs) == (1, 3, 3)
    assert good.line == 1 and also_good.line == 7
    assert good.name != also_good.name  # ids stay distinct
    assert "#1" in good.name and "#3" in also_good.name


def test_bad_first_document_does_not_hide_the_second(write_spec):
    path = write_spec("""\
        function: nodots
        ---
        function: pkg.mod:Good
    """)
    bad, good = load_file(path)
    assert_error(bad, path, "function", "import path", line=1)
    assert isinstance(good, Case) and good.function == "pkg.mod:Good"


def test_yaml_syntax_error_in_a_later_document_keeps_the_earlier_ones(write_spec):
    # spec.py: "one broken document is one error and the others are still read"
    path = write_spec("""\
        function: pkg.mod:Good
        ---
        function: pkg.mod:Broken
        description: a: b
    """)
    items = load_file(path)
    good = [i for i in items if isinstance(i, Case)]
    errors = [i for i in items if isinstance(i, SpecError)]
    assert [c.function for c in good] == ["pkg.mod:Good"]
    assert len(errors) == 1
    assert_error(errors[0], path, "", "YAML", line=4)


def test_single_document_ids_have_no_document_number(write_spec):
    case = only_case(write_spec(GOOD))
    assert case.n_docs == 1
    assert "#" not in case.name and case.name.endswith("::default")


# ----------------------------------------------------------------------- line numbers


def test_line_numbers_point_at_the_offending_key_inside_a_case(write_spec):
    path = write_spec("""\
        # a comment first
        function: pkg.mod:Fn
        inputs:
          - shape: [2]

        cases:
          - name: a
          - name: b
            inputs:
              - shape: [3]
              - shape: [3]
                requires_grad: maybe
    """)
    assert_error(error_of(path), path, "cases[1].inputs[1].requires_grad", "true or false", line=12)


def test_cases_record_their_own_line(write_spec):
    path = write_spec("""\
        function: pkg.mod:Fn
        cases:
          - name: a
          - name: b
    """)
    a, b = cases_of(path)
    assert (a.line, b.line) == (3, 4)


# ----------------------------------------------------------------------- numbers and tolerance


def test_defaults_equal_torch_gradcheck(write_spec):
    case = only_case(write_spec(GOOD))
    params = inspect.signature(torch.autograd.gradcheck).parameters
    assert case.tolerance.eps == params["eps"].default == 1e-6
    assert case.tolerance.atol == params["atol"].default == 1e-5
    assert case.tolerance.rtol == params["rtol"].default == 1e-3
    assert case.tolerance.nondet_tol == params["nondet_tol"].default
    assert (case.seed, case.devices, case.dtype, case.checks) == (0, ("cpu",), "float64", ("backward",))
    assert case.inputs == () and case.kwargs == ()


def test_exponent_without_a_dot_is_a_number(write_spec):
    # YAML 1.1 reads 1e-6 as a string; the spec accepts it as the number users meant
    path = write_spec("""\
        function: pkg.mod:Fn
        tolerance: {eps: 1e-6, atol: 1e-5, rtol: 1e-3}
        inputs:
          - {shape: [2], dist: uniform, low: -1e-1, high: 1e1}
    """)
    case = only_case(path)
    assert case.tolerance == Tolerance(eps=1e-6, atol=1e-5, rtol=1e-3)
    assert isinstance(case.tolerance.eps, float)
    assert dict(case.inputs[0].params) == {"low": -0.1, "high": 10.0}


@pytest.mark.parametrize(
    "key, value", [("eps", "0"), ("eps", "-1e-6"), ("atol", "-1"), ("rtol", "abc"), ("atol", "true"), ("rtol", "[1]")]
)
def test_bad_tolerance_values(write_spec, key, value):
    path = write_spec(f"{GOOD}tolerance:\n  {key}: {value}\n")
    assert_error(error_of(path), path, f"tolerance.{key}", "number", line=3)


@pytest.mark.parametrize("value", [".nan", ".inf", "nan"])
def test_non_finite_tolerance_is_refused(write_spec, value):
    # a NaN atol makes every comparison false (every gradient "wrong"); an infinite one passes anything
    path = write_spec(f"{GOOD}tolerance:\n  atol: {value}\n")
    assert_error(error_of(path), path, "tolerance.atol", "number", line=3)


# ----------------------------------------------------------------------- positive: cases, kwargs, values


def test_cases_override_top_level_keys_and_inherit_the_rest(write_spec):
    path = write_spec("""\
        function: pkg.mod:Fn
        description: top
        seed: 7
        dtype: float32
        tolerance: {atol: 1.0e-4, rtol: 1.0e-2}
        checks: [backward]
        inputs:
          - {name: x, shape: [2, 3]}
        kwargs:
          dim: {value: -1}
        cases:
          - name: inherit
          - name: override
            seed: 3
            dtype: float64
            tolerance: {rtol: 0.5}
            inputs:
              - {name: x, shape: [5]}
            kwargs:
              dim: {value: 0}
          - {}
    """)
    inherit, override, unnamed = cases_of(path)
    assert inherit.label == "inherit" and override.label == "override"
    assert unnamed.label not in ("inherit", "override", "default") and unnamed.label

    assert (inherit.seed, inherit.dtype, inherit.description) == (7, "float32", "top")
    assert inherit.tolerance == Tolerance(atol=1e-4, rtol=1e-2)
    assert inherit.inputs[0].shape == (2, 3)
    assert inherit.kwargs[0][1].value == -1

    assert (override.seed, override.dtype, override.description) == (3, "float64", "top")
    # tolerance keys not given in the case come from the top level, the rest from the defaults
    assert override.tolerance == Tolerance(eps=1e-6, atol=1e-4, rtol=0.5)
    assert override.inputs[0].shape == (5,)
    assert override.kwargs[0][1].value == 0
    assert override.function == "pkg.mod:Fn"

    assert (unnamed.seed, unnamed.inputs) == (inherit.seed, inherit.inputs)
    assert len({inherit.name, override.name, unnamed.name}) == 3


def test_case_may_override_function(write_spec):
    path = write_spec("""\
        function: pkg.mod:Fn
        cases:
          - name: other
            function: pkg.mod:Other
    """)
    assert only_case(path).function == "pkg.mod:Other"


def test_kwargs_entries_take_their_name_from_the_key(write_spec):
    path = write_spec("""\
        function: pkg.mod:Fn
        kwargs:
          dim: {value: -1}
          weight: {shape: [3]}
          other: {same_as: weight}
    """)
    (k1, dim), (k2, weight), (k3, other) = only_case(path).kwargs
    assert (k1, k2, k3) == ("dim", "weight", "other")
    assert isinstance(dim, ValueArg) and dim.name == "dim" and dim.value == -1
    assert isinstance(weight, TensorArg) and weight.name == "weight" and weight.shape == (3,)
    assert isinstance(other, AliasArg) and other.name == "other" and other.same_as == "weight"
    assert weight.key == "kwargs.weight"


def test_value_null_passes_none(write_spec):
    path = write_spec(f"{GOOD}inputs:\n  - {{shape: [2]}}\n  - {{value: null}}\n  - {{value: [1, 2]}}\n")
    _, none, lst = only_case(path).inputs
    assert isinstance(none, ValueArg) and none.value is None
    assert isinstance(lst, ValueArg) and lst.value == [1, 2]


def test_same_as_entry(write_spec):
    path = write_spec(f"{GOOD}inputs:\n  - {{name: x, shape: [2]}}\n  - {{same_as: x, name: y}}\n")
    x, y = only_case(path).inputs
    assert isinstance(x, TensorArg) and x.name == "x"
    assert isinstance(y, AliasArg) and y.same_as == "x" and y.name == "y"
    assert y.key == "inputs[1]"


def test_same_as_must_name_an_argument(write_spec):
    path = write_spec(f"{GOOD}inputs:\n  - {{shape: [2]}}\n  - {{same_as: 0}}\n")
    assert_error(error_of(path), path, "inputs[1].same_as", "name")


def test_tensor_entry_defaults(write_spec):
    path = write_spec(f"""\
        {GOOD}
        inputs:
          - {{shape: [2]}}
          - {{shape: [2], dtype: int64}}
          - {{shape: [2], dtype: bool}}
          - {{shape: [2], dist: uniform}}
          - {{data: [[1, 2], [3, 4]]}}
    """)
    normal, ints, bools, uniform, data = only_case(path).inputs
    assert normal.dist == "normal" and dict(normal.params) == {"mean": 0.0, "std": 1.0}
    assert normal.requires_grad is None and normal.dtype is None
    assert ints.dist == "randint" and dict(ints.params) == {"low": 0.0, "high": 10.0}
    assert bools.dist == "randint" and dict(bools.params)["high"] == 2.0
    assert dict(uniform.params) == {"low": 0.0, "high": 1.0}
    assert data.data == [[1, 2], [3, 4]] and data.shape is None and data.dist is None


def test_init_arguments(write_spec):
    path = write_spec(f"{GOOD}init: {{args: [3, 4], kwargs: {{bias: false}}}}\n")
    case = only_case(path)
    assert case.init_args == (3, 4) and dict(case.init_kwargs) == {"bias": False}
    bad = write_spec(f"{GOOD}init: {{arg: [3]}}\n", "bad.yaml")
    assert_error(error_of(bad), bad, "init.arg", "unknown key", "args, kwargs")


def test_every_error_message_is_one_line_that_names_the_file(write_spec):
    texts = [
        "function: x\n",
        "function: a.b\nfoo: 1\n",
        "function: a.b\ninputs: [{shape: [-1]}]\n",
        "function: a.b\n  bad: indent\n",
    ]
    for i, text in enumerate(texts):
        path = write_spec(text, f"s{i}.yaml")
        msg = str(error_of(path))
        assert msg.startswith(str(path)) and "\n" not in msg, msg


def test_tolerance_is_finite_in_a_valid_spec(write_spec):
    tol = only_case(write_spec(f"{GOOD}tolerance: {{atol: 0, rtol: 0, nondet_tol: 1.0e-9}}\n")).tolerance
    assert tol.atol == 0.0 and tol.rtol == 0.0 and tol.nondet_tol == 1e-9
    assert all(math.isfinite(v) for v in (tol.eps, tol.atol, tol.rtol, tol.nondet_tol))


def test_a_merge_key_written_with_its_tag_is_named_as_written_when_its_value_is_no_mapping(tmp_path):
    # found by test_spec_fuzz: `!!merge function: x` is a merge key named `function`; its error named `<<`,
    # a key the document does not have
    path = tmp_path / "spec.yaml"
    path.write_text("!!merge function: pkg.mod:Fn\n", encoding="utf-8")
    (err,) = load_file(path)
    assert isinstance(err, SpecError) and err.key == "function" and "merge key" in str(err)


@pytest.mark.parametrize(
    "text, key, said",
    [
        (
            "inputs: [{shpe: [3]}]",
            "inputs[0].shpe",
            "unknown key (did you mean 'shape'?); an argument needs exactly one of",
        ),
        ("inputs: [{name: x, shape: [3], dtyp: float32}]", "inputs[0].dtyp", "unknown key (did you mean 'dtype'?)"),
        (
            "inputs: [{name: x, shape: [3]}]\ncasez: []",
            "casez",
            "unknown key (did you mean 'cases'?); allowed keys here",
        ),
        (
            "inputs: [{name: x, shape: [3]}]\ntolerance: {atl: 1e-3}",
            "tolerance.atl",
            "unknown key (did you mean 'atol'?)",
        ),
    ],
)
def test_a_typo_of_a_key_is_named_with_the_key_it_resembles(tmp_path, text, key, said):
    """issue 31 item 11: `shpe:` said "an argument needs exactly one of shape, data, ... (found none)" """
    path = tmp_path / "typo.yaml"
    path.write_text(f"function: gradcheck_cli.examples.relu:ReLU\n{text}\n")
    assert_error(error_of(path), path, key, said)
