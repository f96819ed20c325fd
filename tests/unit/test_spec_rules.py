"""The named validators of the rules a spec's JSON Schema cannot express (``spec.rules``): each one on
values that keep and break it, and the loader's message where a document breaks it (file, line, key).
That the schema lets each of these documents through is shown by test_spec_schema.py (SCHEMA_CANNOT)."""

from __future__ import annotations

import pytest
import yaml

from gradcheck_cli.spec import SpecError, load_file, rules


def loaded(tmp_path, doc):
    """load_file on ``doc`` written as YAML: its one error's message, or None."""
    path = tmp_path / "s.yaml"
    path.write_text(yaml.safe_dump({"function": "pkg.mod:F", **doc}, sort_keys=False), encoding="utf-8")
    errors = [str(item) for item in load_file(path) if isinstance(item, SpecError)]
    return errors[0].replace(str(path), "s.yaml") if errors else None


def test_unordered_bounds():
    assert rules.unordered(0.0, 1.0) is None
    assert rules.unordered(-1.0, -0.5) is None
    assert rules.unordered(1.0, 1.0) == "expected high > low, got low=1.0, high=1.0"
    assert rules.unordered(2.0, 1.0) == "expected high > low, got low=2.0, high=1.0"


def test_unordered_bounds_in_a_spec(tmp_path):
    doc = {"inputs": [{"shape": [3], "dist": "uniform", "low": 1, "high": 0}]}
    assert loaded(tmp_path, doc) == "s.yaml:7: inputs[0].high: expected high > low, got low=1.0, high=0.0"
    assert loaded(tmp_path, {"inputs": [{"shape": [3], "dist": "uniform", "low": 0, "high": 1e-9}]}) is None


def test_reversed_interval():
    assert rules.reversed_interval(()) is None
    assert rules.reversed_interval(((-1.0, 1.0), (2.0, 2.0))) is None
    assert rules.reversed_interval(((-1.0, 1.0), (3.0, 2.0))) == "each interval must be [lo, hi] with lo <= hi"


def test_reversed_interval_in_a_spec(tmp_path):
    doc = {"inputs": [{"shape": [3], "avoid": [[0, 1], [3, 2]]}]}
    assert loaded(tmp_path, doc) == "s.yaml:5: inputs[0].avoid: each interval must be [lo, hi] with lo <= hi"


def _nested(n):
    data = 1.0
    for _ in range(n):
        data = [data]
    return data


@pytest.mark.parametrize(
    "data, dims", [(1.0, 0), ([], 1), ([1, 2], 1), ([[1], [2]], 2), ([[], [1]], 2), (_nested(64), 64)]
)
def test_depth_counts_the_dimensions(data, dims):
    assert rules.depth(data) == dims
    assert rules.too_deep(data) is None


def test_too_deep():
    assert rules.too_deep(_nested(65)) == "lists nested 65 deep: torch tensors have at most 64 dimensions"


def test_too_deep_in_a_spec(tmp_path):
    message = "s.yaml:3: inputs[0].data: lists nested 65 deep: torch tensors have at most 64 dimensions"
    assert loaded(tmp_path, {"inputs": [{"data": _nested(65)}]}) == message
    assert loaded(tmp_path, {"inputs": [{"data": _nested(64)}]}) is None


@pytest.mark.parametrize(
    "value, outside",
    [
        (0.0, False),
        (-3.0, False),
        (2.0**62, False),
        (-(2.0**63), False),
        (2.0**63, True),
        (-(2.0**64), True),
        (2.5, True),
        (-0.5, True),
    ],
)
def test_outside_int64(value, outside):
    assert rules.outside_int64(value) is outside


def test_outside_int64_in_a_spec(tmp_path):
    doc = {"inputs": [{"shape": [3], "dist": "randint", "high": "2.5"}]}
    assert loaded(tmp_path, doc) == (
        "s.yaml:6: inputs[0].high: randint draws integers: expected a whole number within int64, got '2.5'"
    )
    assert loaded(tmp_path, {"inputs": [{"shape": [3], "dist": "randint", "high": "1e2"}]}) is None


def test_name_taken():
    assert not rules.name_taken("a", set())
    assert not rules.name_taken("a", {"b"})
    assert rules.name_taken("a", {"a", "b"})
    assert rules.name_taken(1, {"1"})  # 1 and '1' name the same case


def test_name_taken_in_a_spec(tmp_path):
    assert loaded(tmp_path, {"cases": [{"name": 1}, {"name": "1"}]}) == (
        "s.yaml:4: cases[1].name: expected a unique name, got '1'"
    )
    assert loaded(tmp_path, {"cases": [{"name": "case1"}, {}]}) == (
        "s.yaml:4: cases[1]: its default name 'case1' is taken by another case; give it a unique `name:`"
    )
    assert loaded(tmp_path, {"cases": [{"name": "a"}, {}, {"name": "b"}]}) is None


@pytest.mark.parametrize(
    "pattern, ratio",
    [
        (None, None),
        (None, 2.0),
        ("constant_ratio", 0.5),
        ("sign_flip", -1.0),
        ("sign_flip", None),
        ("transposed", None),
    ],
)
def test_contradicts_lets_fields_that_can_hold_together_through(pattern, ratio):
    assert rules.contradicts(pattern, ratio) is None


def test_contradicts():
    assert rules.contradicts("zero_analytical", 2.0) == (
        "a ratio belongs to pattern constant_ratio or sign_flip, not zero_analytical"
    )
    assert rules.contradicts("sign_flip", 0.5) == (
        "pattern sign_flip means ratio -1, got ratio 0.5: give the pattern or the ratio (`{ratio: 0.5}` for a "
        "constant ratio)"
    )
    assert rules.contradicts("sign_flip", 0.5, "0.5").startswith("pattern sign_flip means ratio -1, got ratio '0.5':")


def test_contradicts_in_a_spec(tmp_path):
    doc = {"expect": {"reason": "why", "x": {"pattern": "sign_flip", "ratio": "0.5"}}}
    assert loaded(tmp_path, doc) == (
        "s.yaml:4: expect.x: pattern sign_flip means ratio -1, got ratio '0.5': give "
        "the pattern or the ratio (`{ratio: 0.5}` for a constant ratio)"
    )
