"""Spec messages speak YAML: a value quoted in a message is spelled as the spec file writes it (``null``,
``true``, ``false``, ``.inf``, ``.nan``), not as Python prints it (``None``, ``True``, ``inf``); and a shape that
a matrix dist cannot draw (``dist: spd`` at ``[3, 4]``) is an error that says what to give instead."""

from __future__ import annotations

import itertools
import re

import pytest

from gradcheck_cli.spec import SpecError, load_file
from gradcheck_cli.spec.values import show

HEAD = "function: gradcheck_cli.examples.linear:LinearFunction\n"
INPUTS = "inputs: [{shape: [2, 2]}, {shape: [3, 2]}, {shape: [3]}]\n"
PYTHONISM = re.compile(r"(?<![.\w-])(None|True|False|inf|nan)\b")  # `.inf` and `.nan` are YAML's


def message(write_spec, text: str) -> str:
    (err,) = load_file(write_spec(text))
    assert isinstance(err, SpecError), err
    return str(err)


@pytest.mark.parametrize(
    "written, said",
    [
        ("order: null", "order: expected an integer from 2 to 6 (the order of the derivative checked), got null"),
        ("order: true", "got true"),
        ("seed: false", "seed: expected a non-negative integer below 2**64, got false"),
        ("dtype: null", "dtype: unknown dtype null; use one of"),
        ("checks: [null]", "checks[0]: unknown check null"),
        ("compile: false", "compile: expected a mapping with keys backend, atol, rtol; got false"),
        ("tolerance: {atol: .inf}", "tolerance.atol: expected a finite number, got .inf"),
        ("tolerance: {eps: -.inf}", "tolerance.eps: expected a finite positive number, got -.inf"),
        ("tolerance: {rtol: .nan}", "tolerance.rtol: expected a finite number, got .nan"),
        ("device: [cpu, null]", "device: expected cpu, cuda, cuda:N (or a list of these), got ['cpu', null]"),
    ],
)
def test_a_value_in_a_message_is_spelled_as_yaml_writes_it(write_spec, written, said):
    found = message(write_spec, HEAD + INPUTS + written + "\n")
    assert said in found
    assert not PYTHONISM.search(found), found


VALUES = ["null", "true", "false", "[null, true]", "{a: null}", ".inf", "-.inf", ".nan"]
TOP = ["seed", "device", "dtype", "tolerance", "checks", "order", "function", "import", "reference", "expect",
       "strict", "init", "cases", "kwargs", "clone_inputs", "resample", "compile", "distributed", "inputs"]  # fmt: skip
ENTRY = ["shape", "data", "dtype", "dist", "low", "high", "mean", "std", "avoid", "requires_grad", "contiguous",
         "name", "dim", "param", "placement", "layout", "density", "indices", "value", "same_as", "list", "dict"]  # fmt: skip


def documents() -> list[str]:
    """Documents that give a key a value of the wrong kind: at the top, in an input, in a case, in nested keys."""
    docs = []
    for key, value in itertools.product(TOP, VALUES):
        docs.append(("" if key == "function" else HEAD) + ("" if key == "inputs" else INPUTS) + f"{key}: {value}\n")
    for key, value in itertools.product(ENTRY, VALUES):
        entry = f"{{shape: [2, 2], {key}: {value}}}" if key != "shape" else f"{{shape: {value}}}"
        docs.append(HEAD + f"inputs: [{entry}, {{shape: [3, 2]}}, {{shape: [3]}}]\n")
    nested = {
        "tolerance": ["atol", "rtol", "eps", "reference"],
        "cases": ["name", "inputs", "kwargs", "seed", "checks", "expect"],
        "init": ["args", "kwargs", "mode"],
        "distributed": ["world_size", "backend", "timeout"],
    }
    for top, keys in nested.items():
        for key, value in itertools.product(keys, VALUES):
            inner = f"{{{key}: {value}}}"
            docs.append(HEAD + INPUTS + f"{top}: {f'[{inner}]' if top == 'cases' else inner}\n")
    return docs


def test_no_message_about_a_yaml_value_speaks_python(tmp_path):
    path = tmp_path / "s.yaml"
    shown = []
    for text in documents():
        path.write_text(text)
        shown += [str(item) for item in load_file(str(path)) if isinstance(item, SpecError)]
    assert len(shown) > 200  # most of the documents are wrong
    assert [m for m in shown if PYTHONISM.search(m)] == []


def test_show_keeps_quoting_text_and_cuts_long_values():
    assert show("x") == "'x'" and show([1, 2.5, "a"]) == "[1, 2.5, 'a']" and show({"k": [None]}) == "{'k': [null]}"
    long = show(list(range(100)))
    assert long.startswith("[0, 1, 2, 3") and long.endswith("...") and len(long) == 60
    deep: list = []
    for _ in range(10_000):  # nested deeper than the recursion limit: only the start is read
        deep = [deep]
    assert show(deep) == "[" * 57 + "..."


@pytest.mark.parametrize(
    "dist, shape, said",
    [
        ("spd", "[3, 4]", "dist spd draws square matrices (or batches of them): the last two dimensions must be "
         "equal, got [3, 4]; give a shape such as [4, 4] (or [2, 4, 4] for a batch)"),
        ("symmetric", "[5, 1, 4]", "got [5, 1, 4]; give a shape such as [4, 4] (or [5, 4, 4] for a batch)"),
        ("spd", "[4]", "dist spd draws matrices: expected at least 2 dimensions (..., n, n), got [4]"),
        ("orthogonal", "[3]", "dist orthogonal draws matrices: expected at least 2 dimensions (..., m, n), got [3]"),
    ],
)  # fmt: skip
def test_a_matrix_dist_at_a_shape_it_cannot_draw_says_what_to_give(write_spec, dist, shape, said):
    path = write_spec(
        "function: gradcheck_cli.examples.structured:Cholesky\n"
        f"inputs:\n  - {{name: a, shape: {shape}, dist: {dist}}}\n"
    )
    (err,) = load_file(path)
    assert isinstance(err, SpecError) and err.key == "inputs[0].shape"
    assert str(err).startswith(f"{path}:3: inputs[0].shape: ") and said in str(err)
