"""-k matches a case's ids with their device, ``path::case[cpu]``, as pytest's -k matches parametrized ids
(``test_x[cpu]``): ``-k cpu`` selected nothing, though the docs said the device is part of the matched name.
A case keeps the devices whose id is selected, as the pytest plugin's items are one per device."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from gradcheck_cli.run.discovery import TargetError, collect, matching
from gradcheck_cli.spec import Case, load_file

SPEC = """\
function: gradcheck_cli.examples.linear:LinearFunction
device: [cpu, cuda]
inputs: [{shape: [2, 3]}, {shape: [4, 3]}, {value: null}]
cases:
  - name: square
  - name: wide
---
function: gradcheck_cli.examples.relu:ReLU
inputs: [{shape: [3]}]
"""


@pytest.fixture
def items(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> list:
    monkeypatch.chdir(tmp_path)
    Path("two.yaml").write_text(SPEC, encoding="utf-8")
    return load_file("two.yaml")


def ids(chosen: list) -> list[str]:
    return [f"{c.name}[{d}]" for c in chosen if isinstance(c, Case) for d in c.devices]


@pytest.mark.parametrize(
    "expression, selected",
    [
        ("cpu", ["two.yaml#1::square[cpu]", "two.yaml#1::wide[cpu]", "two.yaml#2::default[cpu]"]),
        ("CUDA", ["two.yaml#1::square[cuda]", "two.yaml#1::wide[cuda]"]),
        ("not cuda", ["two.yaml#1::square[cpu]", "two.yaml#1::wide[cpu]", "two.yaml#2::default[cpu]"]),
        ("wide and cuda", ["two.yaml#1::wide[cuda]"]),
        ("square[cpu]", ["two.yaml#1::square[cpu]"]),  # an id's tail as written, brackets and all
        ("*cud?]", ["two.yaml#1::square[cuda]", "two.yaml#1::wide[cuda]"]),  # a glob still globs
        ("two.yaml#1::wide[cuda]", ["two.yaml#1::wide[cuda]"]),  # a result's exact id
        ("two.yaml#1::wide", ["two.yaml#1::wide[cpu]", "two.yaml#1::wide[cuda]"]),  # a replay's exact name
        (
            "LinearFunction",
            ["two.yaml#1::square[cpu]", "two.yaml#1::square[cuda]"]
            + ["two.yaml#1::wide[cpu]"]
            + ["two.yaml#1::wide[cuda]"],
        ),
    ],
)
def test_k_matches_the_device_in_each_id(items, expression, selected):
    assert ids(matching(items, expression)) == selected


def test_a_case_keeps_its_other_keys_when_its_devices_are_narrowed(items):
    [square, wide] = matching(items, "cuda")
    assert square.devices == ("cuda",) and square.label == "square" and square.function == items[0].function


def test_nothing_selected_says_what_is_matched(items):
    with pytest.raises(TargetError, match=r"matched against each case's id, path::case\[device\], and function"):
        collect(["two.yaml"], Path("specs"), [], [], "mps")


def test_k_cpu_end_to_end(items, invoke):
    result = invoke("two.yaml", "-k", "cpu and not relu", "--no-isolate", "--format", "json")
    assert result.exit_code == 0, result.output
    assert [r["id"] for r in json.loads(result.stdout)["results"]] == [
        "two.yaml#1::square[cpu]",
        "two.yaml#1::wide[cpu]",
    ]
