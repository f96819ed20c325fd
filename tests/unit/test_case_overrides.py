"""A case overrides arguments by name: ``inputs: {NAME: entry}`` replaces only the named arguments
of the document's ``inputs``; the list form still replaces the whole list."""

from __future__ import annotations

import json

from gradcheck_cli.spec import SpecError, TensorArg, ValueArg, load_file

DOC = """\
function: gradcheck_cli.examples.linear:LinearFunction
inputs:
  - {name: x, shape: [5, 4]}
  - {name: w, shape: [3, 4], dist: uniform, low: -1, high: 1}
  - {name: b, shape: [3]}
cases:
"""


def test_a_mapping_replaces_only_the_named_arguments_in_place(write_spec):
    path = write_spec(
        DOC + "  - name: no_bias\n    inputs: {b: {value: null}}\n"
        "  - name: wide\n    inputs:\n      x: {shape: [7, 4]}\n      w: {shape: [3, 4]}\n"
    )
    no_bias, wide = load_file(path)
    x, w, b = no_bias.inputs
    assert (x.name, x.shape) == ("x", (5, 4)) and (w.dist, dict(w.params)) == ("uniform", {"low": -1.0, "high": 1.0})
    assert isinstance(b, ValueArg) and b.value is None and b.name == "b"
    assert b.key == "cases[0].inputs.b" and b.line == 8  # messages and rows point at the case's entry
    x, w, b = wide.inputs
    assert x.shape == (7, 4) and w.dist == "normal" and isinstance(b, TensorArg) and b.shape == (3,)


def test_the_list_form_still_replaces_the_whole_list(write_spec):
    path = write_spec(DOC + "  - inputs: [{name: x, shape: [2, 4]}, {name: w, shape: [3, 4]}, {value: null}]\n")
    (case,) = load_file(path)
    assert [getattr(a, "shape", None) for a in case.inputs] == [(2, 4), (3, 4), None]
    assert case.inputs[1].dist == "normal"  # not the document's uniform: the list replaces


def test_an_unknown_name_is_an_error_that_lists_the_arguments(write_spec):
    path = write_spec(DOC + "  - name: a\n  - name: b\n    inputs: {y: {shape: [2]}}\n")
    (err,) = load_file(path)
    assert isinstance(err, SpecError)
    assert str(err) == (
        f"{path}:9: cases[1].inputs.y: no argument named 'y' in the document's inputs; the arguments are x, w, b"
    )


def test_unnamed_document_entries_are_counted_in_the_message(write_spec):
    path = write_spec(
        "function: pkg.mod:Fn\ninputs: [{name: x, shape: [2]}, {shape: [3]}]\ncases:\n  - inputs: {w: {shape: [2]}}\n"
    )
    (err,) = load_file(path)
    assert "cases[0].inputs.w: no argument named 'w'" in str(err)
    assert "the arguments are x; 1 of them has no `name:`" in str(err)


def test_a_different_name_inside_the_override_is_an_error(write_spec):
    path = write_spec(DOC + "  - inputs: {x: {name: z, shape: [2, 4]}}\n")
    (err,) = load_file(path)
    assert "cases[0].inputs.x.name: the key names the argument ('x'): drop `name:` here" in str(err)


def test_a_bad_override_entry_names_its_key(write_spec):
    path = write_spec(DOC + "  - inputs: {x: {shape: nope}}\n")
    (err,) = load_file(path)
    assert "cases[0].inputs.x.shape: expected a list of non-negative ints" in str(err)


def test_the_document_level_inputs_must_stay_a_list(write_spec):
    path = write_spec("function: pkg.mod:Fn\ninputs: {x: {shape: [2]}}\n")
    (err,) = load_file(path)
    assert "inputs: expected a list of argument entries, got" in str(err)
    assert "in a case" not in str(err)


def test_the_override_is_checked_end_to_end(write_spec, invoke):
    path = write_spec(DOC + "  - name: no_bias\n    inputs: {b: {value: null}}\n")
    result = invoke(str(path), "--format", "json")
    assert result.exit_code == 0, result.output
    rows = json.loads(result.stdout)["results"][0]["checks"][0]["inputs"]
    assert [(r["name"], r["status"], r["shape"]) for r in rows] == [
        ("x", "pass", [5, 4]),
        ("w", "pass", [3, 4]),
        ("b", "skip", []),
    ]  # b is None in this case


def test_an_override_without_the_documents_list_names_the_missing_list(write_spec):
    # found by test_spec_fuzz: with the document's `inputs` deleted, the error named an argument of the case
    path = write_spec("function: m:f\ncases:\n  - name: c\n    inputs: {x: {shape: [2]}}\n")
    (err,) = load_file(path)
    assert isinstance(err, SpecError) and err.key == "inputs"
    assert "missing (or empty): cases[0].inputs overrides arguments by name" in str(err)
