"""The shipped JSON Schema of spec files (what editors check while you type) against the validator
(``spec.load_file``, what a run and ``gradcheck validate`` check), document by document:

- every document the validator accepts, the schema accepts (an editor never flags a spec that runs);
- every document the validator rejects, the schema rejects too, unless the validator's reason is a
  rule JSON Schema cannot express: ``SCHEMA_CANNOT`` lists those rules, each with why;

on every document of every shipped spec file, on probe documents (one per rule, the new keys
included), and on fuzzed documents (the generators of test_spec_fuzz.py, extended with the keys
added since: import, reference, reference_dtype, reference_backward, expect, tolerance.reference,
strict, repeat, resample, the opcheck check).
"""

from __future__ import annotations

import math
import re
import tempfile
from pathlib import Path
from typing import Any, Optional

import jsonschema
import pytest
import yaml
from hypothesis import given, settings
from hypothesis import strategies as st
from test_spec_fuzz import FUNCTIONS, FUZZ, HUGE, fields, names, numbers, sometimes_wrong, values

from gradcheck_cli import schemas, spec
from gradcheck_cli.results import EXPECTABLE
from gradcheck_cli.spec import SpecError, load_file

REPO = Path(__file__).resolve().parents[2]
SHIPPED = sorted((REPO / "specs").glob("*.yaml")) + sorted((REPO / "broken-specs").glob("*.yaml"))

# Rules of spec.py that JSON Schema (draft 2020-12, no $data) cannot express: a regular expression
# that the validator's message matches -> why. A document the validator rejects for one of these may
# pass the schema.
SCHEMA_CANNOT = {
    r"expected high > low": "compares the values of two keys (low, high)",
    r"each interval must be \[lo, hi\] with lo <= hi": "compares the two numbers of an `avoid` interval",
    r"expected a unique name": "uniqueness of one key (`name`) across the items of a list (`uniqueItems` "
    "compares whole items); also `1` and '1' name the same case",
    r"its default name .* is taken": "a case's default name (case0, case1, ...) depends on its position",
    r"expected a finite (positive )?number, got \.nan": "NaN passes every comparison keyword (JSON has no NaN)",
    r"expected a finite (positive )?number, got '[^']*[eE]\+?[0-9]{3,}'": "a numeric string beyond the float "
    "range ('1e999') matches the pattern",
    r"randint draws integers: .*, got '": "whether a numeric string ('2.5', '1e2') is a whole number",
    r"lists nested \d+ deep": "the depth of nested `data` lists (its dimensions) has no keyword",
    r"draws values above low: expected low > 0, got '": "whether a numeric string ('0') is above 0",
    r"pattern sign_flip means ratio -1, got ratio '": "whether a numeric string ('-1.0', '-10e-1') is -1",
    r"duplicate key: keep one": "two YAML keys written alike ('true' and true, a string and a boolean) are "
    "one key to the validator and two to the schema (JSON keys are strings)",
    r"overrides arguments by name, which needs the document's `inputs:` list": "a case's `inputs:` mapping "
    "needs a key of the document",
    r"no argument named .* in the document's inputs": "a case's `inputs:` mapping names arguments by the `name:` "
    "of the document's inputs (values of another key)",
    r"a placement needs `distributed": "an input's `placement` needs another key (`distributed`) in the document",
    r"`outputs` places outputs across ranks": "`outputs` needs another key (`distributed`) in the document",
    r"give a dim from": "a shard(d)'s dim against the length of another key (`shape`)",
    r"make its size a multiple of": "a shard(d)'s size against another key's value (`distributed.world_size`)",
    r"a sparse input is not checked across ranks yet": "a sparse input's `layout` against another key of the "
    "document (`distributed`)",
    r"is outside shape \[": "a sparse input's `indices` against the values of another key (`shape`)",
    r"ints \(one per dimension of shape": "the length of each of `indices` against the length of another key (`shape`)",
}


def _validator() -> jsonschema.Draft202012Validator:
    schema = schemas.load("spec")
    jsonschema.Draft202012Validator.check_schema(schema)
    return jsonschema.Draft202012Validator(schema)


SCHEMA = _validator()


@pytest.fixture(scope="module")
def validator() -> jsonschema.Draft202012Validator:
    return SCHEMA


def verdict(text: str) -> Optional[str]:
    """spec.load_file on a one-document file: None when it accepts it, else its message."""
    with tempfile.TemporaryDirectory() as folder:
        path = Path(folder) / "spec.yaml"
        path.write_text(text, encoding="utf-8")
        errors = [str(item) for item in load_file(path) if isinstance(item, SpecError)]
    return errors[0] if errors else None


def schema_errors(validator: jsonschema.Draft202012Validator, doc: Any) -> list[str]:
    return [e.message for e in validator.iter_errors(doc)]


def inexpressible(message: str) -> bool:
    return any(re.search(rule, message) for rule in SCHEMA_CANNOT)


def agree(validator: jsonschema.Draft202012Validator, doc: Any) -> None:
    """The schema and the validator agree on ``doc``, within what the schema can express."""
    text = yaml.safe_dump(doc, sort_keys=False, allow_unicode=True)
    [loaded] = list(yaml.safe_load_all(text))  # what both see
    message = verdict(text)
    errors = schema_errors(validator, loaded)
    if message is None:
        assert errors == [], f"spec.py accepts, the schema rejects:\n{text}{errors}"
    elif not inexpressible(message):
        assert errors != [], f"spec.py rejects ({message}), the schema accepts:\n{text}"


def documents(path: Path) -> list[Any]:
    return [d for d in yaml.safe_load_all(path.read_text(encoding="utf-8")) if d is not None]


@pytest.mark.parametrize("path", SHIPPED, ids=[f"{p.parent.name}/{p.name}" for p in SHIPPED])
def test_every_shipped_document_passes_both(path, validator):
    docs = documents(path)
    assert docs
    assert [item for item in load_file(path) if isinstance(item, SpecError)] == []
    for doc in docs:
        assert schema_errors(validator, doc) == []


def test_the_shipped_files_hold_several_documents():
    """What the README says about editors: most shipped spec files hold several documents."""
    several = [p.name for p in SHIPPED if len(documents(p)) > 1]
    assert len(several) >= 6


BASE = {"function": "pkg.mod:F"}


def _nested(depth: int) -> Any:
    data: Any = 1.0
    for _ in range(depth):
        data = [data]
    return data


TENSOR = {"shape": [3]}

# documents that probe one rule each: (id, document, accepted by spec.py)
SPARSE = {"shape": [3, 4], "layout": "sparse_coo"}
PROBES = [
    ("layout sparse", {**BASE, "inputs": [{**SPARSE, "density": 0.5, "masked": False}]}, True),
    ("layout csr", {**BASE, "inputs": [{**SPARSE, "layout": "sparse_csr", "indices": [[0, 1], [2, 3]]}]}, True),
    ("layout banana", {**BASE, "inputs": [{**SPARSE, "layout": "banana"}]}, False),
    ("density above 1", {**BASE, "inputs": [{**SPARSE, "density": 1.5}]}, False),
    ("density 0", {**BASE, "inputs": [{**SPARSE, "density": 0}]}, False),
    ("density without layout", {**BASE, "inputs": [{"shape": [3, 4], "density": 0.5}]}, False),
    ("density and indices", {**BASE, "inputs": [{**SPARSE, "density": 0.5, "indices": [[0, 1]]}]}, False),
    ("indices twice", {**BASE, "inputs": [{**SPARSE, "indices": [[0, 1], [0, 1]]}]}, False),
    ("sparse int", {**BASE, "inputs": [{**SPARSE, "dtype": "int64"}]}, False),
    ("sparse int no grad", {**BASE, "inputs": [{**SPARSE, "dtype": "int64", "requires_grad": False}]}, True),
    ("sparse randint", {**BASE, "inputs": [{**SPARSE, "dist": "randint"}]}, False),
    ("sparse randint float", {**BASE, "inputs": [{**SPARSE, "dist": "randint", "dtype": "float64"}]}, True),
    ("csr 3-D", {**BASE, "inputs": [{"shape": [2, 3, 4], "layout": "sparse_csr"}]}, False),
    ("sparse 0-D", {**BASE, "inputs": [{"shape": [], "layout": "sparse_coo"}]}, False),
    ("sparse not contiguous", {**BASE, "inputs": [{**SPARSE, "contiguous": False}]}, False),
    ("sparse spd", {**BASE, "inputs": [{"shape": [3, 3], "layout": "sparse_coo", "dist": "spd"}]}, False),
    ("sparse list", {**BASE, "inputs": [{"list": [{"shape": [3]}], "layout": "sparse_coo"}]}, False),
    ("seed whole float", {**BASE, "seed": 1.0}, True),
    ("seed fraction", {**BASE, "seed": 1.5}, False),
    ("seed too large", {**BASE, "seed": 2**64}, False),
    ("shape whole float", {**BASE, "inputs": [{"shape": [3.0, 2]}]}, True),
    ("shape fraction", {**BASE, "inputs": [{"shape": [2.5]}]}, False),
    ("shape bool", {**BASE, "inputs": [{"shape": [True]}]}, False),
    ("data with null", {**BASE, "kwargs": {"x": {"data": [None]}}}, False),
    ("data with a string", {**BASE, "inputs": [{"data": [[1, "2"]]}]}, False),
    ("data nested numbers", {**BASE, "inputs": [{"data": [[1, 2.5], [True, 0]]}]}, True),
    ("shape 65 dims", {**BASE, "inputs": [{"shape": [1] * 65}]}, False),
    ("shape 64 dims", {**BASE, "inputs": [{"shape": [1] * 64}]}, True),
    ("repeat whole float", {**BASE, "repeat": 3.0}, True),
    ("repeat 1", {**BASE, "repeat": 1}, False),
    ("case name whole float", {**BASE, "cases": [{"name": 1.0}]}, True),
    ("case name list", {**BASE, "cases": [{"name": [1]}]}, False),
    ("reversed avoid", {**BASE, "inputs": [{**TENSOR, "avoid": [[1, -1]]}]}, False),
    ("duplicate case names", {**BASE, "cases": [{"name": "a"}, {"name": "a"}]}, False),
    ("high below low", {**BASE, "inputs": [{**TENSOR, "dist": "uniform", "low": 1, "high": 0}]}, False),
    ("description list", {**BASE, "description": ["a", "b"]}, False),
    ("description mapping", {**BASE, "description": {"a": 1}}, False),
    ("numeric string with underscore", {**BASE, "tolerance": {"atol": "1_000"}}, False),
    ("numeric string with spaces", {**BASE, "tolerance": {"atol": " 1e-3 "}}, False),
    ("numeric string", {**BASE, "tolerance": {"atol": "1e-3"}}, True),
    ("eps zero string", {**BASE, "tolerance": {"eps": "0.0"}}, False),
    ("eps zero float", {**BASE, "tolerance": {"eps": 0.0}}, False),
    ("negative zero string", {**BASE, "tolerance": {"atol": "-0"}}, True),
    ("huge int", {**BASE, "tolerance": {"atol": 10**400}}, False),
    ("randint fraction", {**BASE, "inputs": [{**TENSOR, "dist": "randint", "low": 0.5, "high": 3}]}, False),
    ("randint whole float", {**BASE, "inputs": [{**TENSOR, "dist": "randint", "low": 0.0, "high": 3.0}]}, True),
    ("randint beyond int64", {**BASE, "inputs": [{**TENSOR, "dist": "randint", "high": 2**63}]}, False),
    ("randint by dtype fraction", {**BASE, "inputs": [{**TENSOR, "dtype": "int64", "high": 2.5}]}, False),
    ("import one", {**BASE, "import": "my_pkg.ops"}, True),
    ("import list", {**BASE, "import": ["my_pkg.ops", "b"]}, True),
    ("import with colon", {**BASE, "import": ["my_pkg:ops"]}, False),
    ("import number", {**BASE, "import": 3}, False),
    ("reference", {**BASE, "reference": "pkg.ref:f", "reference_dtype": "float32"}, True),
    ("reference null", {**BASE, "reference": None, "reference_backward": None}, True),
    ("reference bad", {**BASE, "reference": "f"}, False),
    ("reference_dtype int", {**BASE, "reference_dtype": "int64"}, False),
    ("reference_backward", {**BASE, "reference_backward": "pkg.ref:grads"}, True),
    ("tolerance.reference relative", {**BASE, "tolerance": {"reference": {"rule": "relative", "factor": 3}}}, True),
    ("tolerance.reference allclose", {**BASE, "tolerance": {"reference": {"rule": "allclose", "rtol": 0.1}}}, True),
    ("tolerance.reference mixed", {**BASE, "tolerance": {"reference": {"factor": 2, "rtol": 0.1}}}, False),
    (
        "tolerance.reference rtol on relative",
        {**BASE, "tolerance": {"reference": {"rule": "relative", "rtol": 1}}},
        False,
    ),
    ("tolerance.reference zero factor", {**BASE, "tolerance": {"reference": {"factor": 0}}}, False),
    ("tolerance.reference unknown rule", {**BASE, "tolerance": {"reference": {"rule": "close"}}}, False),
    ("expect", {**BASE, "expect": {"reason": "reversal", "x": "sign_flip", "w": {"ratio": -1}}}, True),
    ("expect fail", {**BASE, "expect": {"reason": "ste", "x": "fail", "checks": ["reference"]}}, True),
    ("expect no reason", {**BASE, "expect": {"x": "fail"}}, False),
    ("expect blank reason", {**BASE, "expect": {"reason": "  ", "x": "fail"}}, False),
    ("expect no argument", {**BASE, "expect": {"reason": "why"}}, False),
    ("expect unknown pattern", {**BASE, "expect": {"reason": "why", "x": "odd"}}, False),
    (
        "expect ratio on zero pattern",
        {**BASE, "expect": {"reason": "why", "x": {"pattern": "zero_analytical", "ratio": 2}}},
        False,
    ),
    ("expect ratio only", {**BASE, "expect": {"reason": "why", "x": {"ratio": 2}}}, True),
    (
        "expect sign flip with its ratio",
        {**BASE, "expect": {"reason": "why", "x": {"pattern": "sign_flip", "ratio": -1.0}}},
        True,
    ),
    (
        "expect sign flip with another ratio",
        {**BASE, "expect": {"reason": "why", "x": {"pattern": "sign_flip", "ratio": 0.5}}},
        False,
    ),
    ("expect null", {**BASE, "expect": None}, True),
    ("opcheck", {**BASE, "checks": ["backward", "opcheck"]}, True),
    ("strict", {**BASE, "strict": True}, True),
    ("strict not bool", {**BASE, "strict": "yes"}, False),
    ("resample", {**BASE, "resample": True}, True),
    ("list", {**BASE, "inputs": [{"name": "xs", "list": [TENSOR, {"value": 1}, {"same_as": "w"}]}]}, True),
    ("dict", {**BASE, "kwargs": {"feats": {"dict": {"q": TENSOR, "k": {"data": [1.0, 2.0]}}}}}, True),
    ("nested list and dict", {**BASE, "inputs": [{"list": [{"dict": {"a": TENSOR}}, {"list": [TENSOR]}]}]}, True),
    (
        "list in a case override",
        {**BASE, "inputs": [{"name": "xs", **TENSOR}], "cases": [{"inputs": {"xs": {"list": [TENSOR]}}}]},
        True,
    ),
    ("empty list", {**BASE, "inputs": [{"list": []}]}, False),
    ("list not a list", {**BASE, "inputs": [{"list": TENSOR}]}, False),
    ("empty dict", {**BASE, "inputs": [{"dict": {}}]}, False),
    ("dict not a mapping", {**BASE, "inputs": [{"dict": [TENSOR]}]}, False),
    ("list with shape", {**BASE, "inputs": [{"list": [TENSOR], "shape": [2]}]}, False),
    ("list and dict", {**BASE, "inputs": [{"list": [TENSOR], "dict": {"a": TENSOR}}]}, False),
    ("leaf with a bad key", {**BASE, "inputs": [{"list": [{**TENSOR, "bogus": 1}]}]}, False),
    ("leaf with a name", {**BASE, "inputs": [{"list": [{**TENSOR, "name": "a"}]}]}, False),
    ("leaf not a mapping", {**BASE, "kwargs": {"feats": {"dict": {"q": 3}}}}, False),
    ("list with a bad key", {**BASE, "inputs": [{"list": [TENSOR], "dtype": "float32"}]}, False),
    ("distributed", {**BASE, "distributed": {"world_size": 2, "backend": "gloo", "timeout": "5"}}, True),
    ("distributed null", {**BASE, "distributed": None, "outputs": None}, True),
    ("distributed whole float", {**BASE, "distributed": {"world_size": 2.0}}, True),
    ("distributed world_size 0", {**BASE, "distributed": {"world_size": 0}}, False),
    ("distributed no world_size", {**BASE, "distributed": {"backend": "gloo"}}, False),
    ("distributed backend mpi", {**BASE, "distributed": {"world_size": 2, "backend": "mpi"}}, False),
    ("distributed bad key", {**BASE, "distributed": {"world_size": 2, "ranks": 2}}, False),
    ("distributed timeout 0", {**BASE, "distributed": {"world_size": 2, "timeout": 0}}, False),
    (
        "placements",
        {
            **BASE,
            "distributed": {"world_size": 3},
            "inputs": [{**TENSOR, "placement": p} for p in ("replicate", "shard(0)", "shard(-1)", "per_rank")],
            "outputs": ["replicate", "shard(-1)", "partial", "per_rank"],
        },
        True,
    ),
    (
        "placement partial",
        {**BASE, "distributed": {"world_size": 2}, "inputs": [{**TENSOR, "placement": "partial"}]},
        False,
    ),
    (
        "placement shard(x)",
        {**BASE, "distributed": {"world_size": 2}, "inputs": [{**TENSOR, "placement": "shard(x)"}]},
        False,
    ),
    ("outputs empty", {**BASE, "distributed": {"world_size": 2}, "outputs": []}, False),
    ("outputs shard()", {**BASE, "distributed": {"world_size": 2}, "outputs": ["shard()"]}, False),
    ("case distributed", {**BASE, "cases": [{"distributed": {"world_size": 2}, "outputs": ["per_rank"]}]}, True),
]


@pytest.mark.parametrize("doc, accepted", [(d, a) for _, d, a in PROBES], ids=[i for i, _, _ in PROBES])
def test_probe_documents(doc, accepted, validator):
    assert (verdict(yaml.safe_dump(doc)) is None) == accepted
    agree(validator, doc)


INEXPRESSIBLE = [  # one document per rule of SCHEMA_CANNOT, in its order
    {**BASE, "inputs": [{**TENSOR, "dist": "uniform", "low": 1, "high": 0}]},
    {**BASE, "inputs": [{**TENSOR, "avoid": [[1, -1]]}]},
    {**BASE, "cases": [{"name": 1}, {"name": "1"}]},
    {**BASE, "cases": [{"name": "case1"}, {}]},
    {**BASE, "inputs": [{**TENSOR, "mean": math.nan}]},
    {**BASE, "tolerance": {"atol": "1e999"}},
    {**BASE, "inputs": [{**TENSOR, "dist": "randint", "high": "2.5"}]},
    {**BASE, "inputs": [{"data": _nested(spec.MAX_DIMS + 1)}]},
    {**BASE, "inputs": [{**TENSOR, "dist": "positive", "low": "0"}]},
    {**BASE, "expect": {"reason": "why", "x": {"pattern": "sign_flip", "ratio": "0.5"}}},
    {**BASE, "expect": {"reason": "why", "true": "sign_flip", True: "sign_flip"}},
    {**BASE, "cases": [{"inputs": {"x": TENSOR}}]},
    {**BASE, "inputs": [{"name": "x", **TENSOR}], "cases": [{"inputs": {"y": TENSOR}}]},
    {**BASE, "inputs": [{**TENSOR, "placement": "shard(0)"}]},
    {**BASE, "outputs": ["partial"]},
    {**BASE, "distributed": {"world_size": 3}, "inputs": [{**TENSOR, "placement": "shard(1)"}]},
    {**BASE, "distributed": {"world_size": 2}, "inputs": [{**TENSOR, "placement": "shard(0)"}]},
    {**BASE, "distributed": {"world_size": 2}, "inputs": [{"shape": [3, 4], "layout": "sparse_coo"}]},
    {**BASE, "inputs": [{"shape": [3, 4], "layout": "sparse_coo", "indices": [[0, 4]]}]},
    {**BASE, "inputs": [{"shape": [3, 4], "layout": "sparse_coo", "indices": [[0]]}]},
]


@pytest.mark.parametrize("rule, doc", list(zip(SCHEMA_CANNOT, INEXPRESSIBLE)), ids=list(SCHEMA_CANNOT.values()))
def test_each_rule_the_schema_cannot_express(rule, doc, validator):
    """The validator rejects the document for that rule, and the schema indeed lets it through."""
    message = verdict(yaml.safe_dump(doc)) or ""
    assert re.search(rule, message), message
    assert schema_errors(validator, doc) == []


def test_the_schema_reads_numeric_strings_as_spec_py_does():
    defs = schemas.load("spec")["$defs"]
    assert defs["number"]["anyOf"][1]["pattern"] == f"^{spec.NUMERIC_RE.pattern}(?!\\n)$"
    assert defs["tensor"]["properties"]["shape"]["maxItems"] == spec.MAX_DIMS


# ----------------------------------------------------------------------- fuzzed documents

modules = st.sampled_from(["my_pkg.ops", "gradcheck_cli.examples.custom_ops", "a", "my_pkg:ops", "1x", ""])
patterns = st.sampled_from(list(EXPECTABLE) + ["fail", "odd"])
expectations = st.one_of(
    patterns, st.fixed_dictionaries({}, optional={"pattern": sometimes_wrong(patterns), "ratio": numbers}), values
)
expects = sometimes_wrong(
    st.one_of(
        st.none(),
        st.fixed_dictionaries(
            {},
            optional={
                "reason": sometimes_wrong(st.sampled_from(["ste", "", " ", "gradient reversal"])),
                "checks": sometimes_wrong(st.sampled_from([["backward"], ["reference"], "all", ["nope"]])),
            },
        ).flatmap(lambda d: st.dictionaries(names, expectations, max_size=2).map(lambda a: {**d, **a})),
    )
).filter(lambda v: not isinstance(v, list))
rules = sometimes_wrong(
    st.fixed_dictionaries(
        {},
        optional={
            "rule": sometimes_wrong(st.sampled_from(["relative", "allclose", "close"])),
            "factor": numbers,
            "atol": numbers,
            "rtol": numbers,
        },
    )
)
tolerances = sometimes_wrong(
    st.dictionaries(st.sampled_from(spec.TOLERANCE_KEYS + ("tol",)), st.one_of(numbers, rules), max_size=3)
)
whole = st.one_of(st.integers(-1, 5), st.sampled_from([1.0, 2.0, 2.5, 1e3, 2**64, 2.0**64, 1001]))
NEW_FIELDS = {
    "import": sometimes_wrong(st.one_of(modules, st.lists(modules, max_size=2))),
    "reference": sometimes_wrong(st.sampled_from(FUNCTIONS + ["f", None])),
    "reference_backward": sometimes_wrong(st.sampled_from(FUNCTIONS + ["f", None])),
    "reference_dtype": sometimes_wrong(st.sampled_from(spec.REFERENCE_DTYPES + ("double", "int64", "complex64"))),
    "expect": expects,
    "tolerance": tolerances,
    "strict": sometimes_wrong(st.booleans()),
    "resample": sometimes_wrong(st.booleans()),
    "repeat": sometimes_wrong(whole),
    "seed": st.one_of(whole, st.integers(0, 2**64 + 10), values),
    "checks": sometimes_wrong(st.lists(st.sampled_from(list(spec.CHECKS) + ["all", "nope"]), max_size=2)),
}
all_fields = {**fields, **NEW_FIELDS}
case_names = sometimes_wrong(st.sampled_from(["a", "b", 1, 1.0, "1", "case1", 2.5]))
cases = st.lists(st.fixed_dictionaries({}, optional={"name": case_names, **all_fields}), max_size=3)
spec_documents = st.fixed_dictionaries(
    {"function": sometimes_wrong(st.sampled_from(FUNCTIONS))}, optional={**all_fields, "cases": sometimes_wrong(cases)}
)


@settings(FUZZ, max_examples=400)
@given(doc=spec_documents)
def test_fuzzed_documents(doc):
    agree(SCHEMA, doc)


@settings(FUZZ, max_examples=200)
@given(
    shape=st.lists(st.one_of(st.integers(-1, 4), st.sampled_from([1.0, 2.5, True, "2", 2**63] + HUGE)), max_size=3),
    low=st.one_of(st.none(), numbers),
    high=st.one_of(st.none(), numbers),
    dist=st.sampled_from([None, *spec.DISTS]),
    dtype=st.sampled_from([None, "float64", "int64", "bool"]),
    avoid=st.lists(st.lists(numbers, min_size=2, max_size=2), max_size=2),
)
def test_fuzzed_tensor_entries(shape, low, high, dist, dtype, avoid):
    entry = {"shape": shape, "low": low, "high": high, "dist": dist, "dtype": dtype, "avoid": avoid}
    agree(SCHEMA, {**BASE, "inputs": [{k: v for k, v in entry.items() if v is not None}]})


@settings(FUZZ, max_examples=300)
@given(
    shape=st.sampled_from([None, [], [3], [3, 4], [2, 3, 4], [2.0, 2]]),
    layout=st.sampled_from([None, "strided", "sparse_coo", "sparse_csr", "banana", 1]),
    density=st.sampled_from([None, 0, 0.3, 1, 1.5, "0.5", -1, True]),
    indices=st.sampled_from([None, [], [[0, 1]], [[0, 1], [0, 1]], [[0, 9]], [[0]], [[1.0, 2]], [["a", 1]], [1]]),
    masked=st.sampled_from([None, True, False, "yes"]),
    dist=st.sampled_from([None, "normal", "randint", "spd", "permutation"]),
    dtype=st.sampled_from([None, "float64", "float32", "complex64", "int64", "bool"]),
    extra=st.sampled_from([{}, {"requires_grad": False}, {"contiguous": False}, {"contiguous": True}, {"data": [1.0]}]),
)
def test_fuzzed_sparse_entries(shape, layout, density, indices, masked, dist, dtype, extra):
    entry = {"shape": shape, "layout": layout, "density": density, "indices": indices, "masked": masked}
    entry.update({"dist": dist, "dtype": dtype, **extra})
    if "data" in entry:
        entry.pop("shape")
    agree(SCHEMA, {**BASE, "inputs": [{k: v for k, v in entry.items() if v is not None}]})
