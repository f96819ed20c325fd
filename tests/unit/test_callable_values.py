"""A callable as an argument: ``value: {import: pkg.mod:fn}`` passes the object the path names."""

from __future__ import annotations

import json

import pytest

from gradcheck_cli.spec import SpecError, ValueArg, load_file

SPEC = """\
function: gradcheck_cli.examples.structured:{fn}
inputs:
  - {{name: run_function, value: {{import: {path}}}}}
  - {{name: x, shape: [4, 3]}}
"""


def test_the_entry_keeps_the_import_path(write_spec):
    (case,) = load_file(write_spec(SPEC.format(fn="Checkpoint", path="torch.tanh")))
    arg = case.inputs[0]
    assert isinstance(arg, ValueArg) and arg.imported == "torch.tanh" and arg.value is None


@pytest.mark.parametrize(
    "fn, path, code, row",
    [
        ("Checkpoint", "torch.tanh", 0, "pass"),
        ("Checkpoint", "torch.nn.functional:softplus", 0, "pass"),
        ("CheckpointStale", "torch.tanh", 1, "fail"),
    ],
)
def test_the_imported_callable_is_passed_and_checked(write_spec, invoke, fn, path, code, row):
    result = invoke(str(write_spec(SPEC.format(fn=fn, path=path))), "--format", "json", "--no-isolate")
    assert result.exit_code == code, result.output
    rows = json.loads(result.stdout)["results"][0]["checks"][0]["inputs"]
    assert rows[0]["status"] == "skip" and "not a tensor" in rows[0]["reason"]
    assert rows[1]["name"] == "x" and rows[1]["status"] == row


@pytest.mark.parametrize(
    "value, key, gist",
    [
        ("{import: tanh}", "inputs[0].value.import", "expected an import path"),
        ("{import: torch.tanh, as: f}", "inputs[0].value.as", "unknown key; allowed keys here: import"),
    ],
)
def test_bad_import_entries_name_the_key(write_spec, value, key, gist):
    (err,) = load_file(write_spec(f"function: pkg.mod:Fn\ninputs:\n  - {{value: {value}}}\n"))
    assert isinstance(err, SpecError) and err.key == key and gist in str(err), str(err)


def test_a_path_that_does_not_import_is_an_error_naming_the_key(write_spec, invoke):
    result = invoke(str(write_spec(SPEC.format(fn="Checkpoint", path="torch.tanhh"))), "--no-color")
    assert result.exit_code == 3, result.output
    assert "inputs[0].value.import: 'torch' has no attribute 'tanhh'" in result.output
