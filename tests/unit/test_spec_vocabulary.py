"""The JSON Schema is the one description of a spec's keys and enums (``spec.vocabulary`` reads it), and
the loader and the schema cannot drift apart:

- the schema's annotations for the loader (``x-canonical``, ``x-parameters``, ``x-keys``) say what the
  schema's own conditions say (checked with jsonschema);
- every mapping the schema describes has a place in a document here (a new one fails until it has);
- at every such place, every key the schema lists is one the loader knows and reads, every other key of
  the format is an unknown key to the loader, and for every key, on values of every JSON type and every
  name its enums allow, the loader accepts what the schema accepts and rejects what it rejects (but for
  the rules the schema cannot express: test_spec_schema.SCHEMA_CANNOT);
- model.py's constants are the schema's names, in the schema's order (the order messages list them in).
"""

from __future__ import annotations

from typing import Any, Callable, Optional

import jsonschema
import pytest
from test_spec_schema import inexpressible

from gradcheck_cli import schemas, spec
from gradcheck_cli.results import EXPECTABLE
from gradcheck_cli.spec import Ctx, SpecError, keystr, parse_document, vocabulary

SCHEMA = schemas.load("spec")
DEFS = SCHEMA["$defs"]
VALIDATOR = jsonschema.Draft202012Validator(SCHEMA)
F = "pkg.mod:F"
X = {"name": "x", "shape": [3]}

# each mapping of the schema ('' for a document, else its $defs name) -> (where it sits in a document,
# a document with ``obj``'s keys added there): every other key of the document is valid
PLACES: dict[str, tuple[tuple[Any, ...], Callable[[dict[str, Any]], dict[str, Any]]]] = {
    "": ((), lambda obj: {"function": F, **obj}),
    "case": (("cases", 0), lambda obj: {"function": F, "cases": [obj]}),
    "tensor": (
        ("inputs", 0),
        lambda obj: {"function": F, "inputs": [{**({} if "data" in obj else {"shape": [3]}), **obj}]},
    ),
    "value": (("inputs", 0), lambda obj: {"function": F, "inputs": [{"value": 1, **obj}]}),
    "value_import": (
        ("inputs", 0, "value"),
        lambda obj: {"function": F, "inputs": [{"value": {"import": "pkg.mod:f", **obj}}]},
    ),
    "same_as": (("inputs", 1), lambda obj: {"function": F, "inputs": [X, {"same_as": "x", **obj}]}),
    "list": (("inputs", 0), lambda obj: {"function": F, "inputs": [{"list": [{"shape": [3]}], **obj}]}),
    "dict": (("inputs", 0), lambda obj: {"function": F, "inputs": [{"dict": {"a": {"shape": [3]}}, **obj}]}),
    "size_of": (
        ("inputs", 1, "high"),
        lambda obj: {"function": F, "inputs": [X, {"shape": [2], "dist": "randint", "high": {"size_of": "x", **obj}}]},
    ),
    "tolerance": (("tolerance",), lambda obj: {"function": F, "tolerance": obj}),
    "reference_rule": (("tolerance", "reference"), lambda obj: {"function": F, "tolerance": {"reference": obj}}),
    "init": (("init",), lambda obj: {"function": F, "init": obj}),
    "compile": (("compile",), lambda obj: {"function": F, "compile": obj}),
    "distributed": (("distributed",), lambda obj: {"function": F, "distributed": {"world_size": 2, **obj}}),
    "expect": (("expect",), lambda obj: {"function": F, "expect": {"reason": "why", "x": "fail", **obj}}),
    "expected": (("expect", "x"), lambda obj: {"function": F, "expect": {"reason": "why", "x": obj}}),
}
EVERY_KEY = sorted({k for name in PLACES for k in vocabulary.keys(name)})
# values of every JSON type, and the shapes the format's keys take
VALUES: list[Any] = [
    None,
    True,
    False,
    0,
    1,
    2,
    3,
    -1,
    1.5,
    2**64,
    "x",
    "",
    "0.5",
    "1e-3",
    "pkg.mod:f",
    "my_pkg.ops",
    "cpu",
    "cuda:1",
    [],
    [1],
    [3, 3],
    ["x"],
    [[0, 1]],
    [[1, 0]],
    {},
    {"a": 1},
    {"shape": [3]},
    [{"shape": [3]}],
    {"a": {"shape": [3]}},
    {"size_of": "x"},
    {"value": 1},
]


def refs(schema: Any, seen: frozenset[str] = frozenset()) -> list[Any]:
    """The names the enums and consts under ``schema`` allow, following ``$ref`` (each once)."""
    out: list[Any] = []
    if isinstance(schema, dict):
        ref = schema.get("$ref", "").rpartition("/")[2]
        if ref and ref not in seen:
            out += refs(DEFS[ref], seen | {ref})
        out += list(schema.get("enum", [])) + ([schema["const"]] if "const" in schema else [])
        out += [
            v for k, sub in schema.items() if k not in ("$ref", "enum", "const", "not", "if") for v in refs(sub, seen)
        ]
    elif isinstance(schema, list):
        out += [v for sub in schema for v in refs(sub, seen)]
    return out


def loader(doc: Any) -> Optional[str]:
    """The loader's verdict on ``doc``: None when it accepts it, else its message."""
    try:
        parse_document(doc, Ctx("s.yaml"))
    except SpecError as exc:
        return str(exc)
    return None


def schema_accepts(doc: Any) -> bool:
    return not list(VALIDATOR.iter_errors(doc))


def properties(name: str) -> dict[str, Any]:
    return (DEFS[name] if name else SCHEMA)["properties"]


def test_every_mapping_of_the_schema_has_a_place_here():
    described = {name for name, schema in DEFS.items() if "properties" in schema} | {""}
    assert described == set(PLACES)


@pytest.mark.parametrize("name", PLACES, ids=[n or "document" for n in PLACES])
def test_the_loader_knows_every_key_the_schema_lists_and_no_other(name):
    where, place = PLACES[name]
    contexts = [{}] + ([{"dist": d} for d in spec.DISTS] if name == "tensor" else [])  # low: for uniform, ...
    for key in vocabulary.keys(name):
        candidates = VALUES + refs(properties(name)[key])
        accepted = [v for v in candidates for c in contexts if loader(place({**c, key: v})) is None]
        assert accepted, f"{keystr(where + (key,))}: the loader takes none of {candidates}"
    if name == "expect":  # its other keys name arguments
        return
    for key in [k for k in EVERY_KEY if k not in vocabulary.keys(name)] + ["colour"]:
        doc = place({key: 1})
        message = loader(doc) or ""
        assert not schema_accepts(doc), doc
        if key not in spec.KINDS:  # a second kind of argument says so instead
            assert f"{keystr(where + (key,))}: unknown key" in message, (doc, message)


@pytest.mark.parametrize("name", PLACES, ids=[n or "document" for n in PLACES])
def test_the_loader_and_the_schema_agree_on_every_key_and_value(name):
    """For each key of the mapping, on values of every type and each name its enums allow (alone and in a
    list): the loader accepts what the schema accepts, and rejects what it rejects unless for a rule the
    schema cannot express. A key the schema types is one the loader reads (it rejects some value)."""
    _, place = PLACES[name]
    for key in vocabulary.keys(name):
        names = refs(properties(name)[key])
        rejected = 0
        for value in VALUES + names + [[v] for v in names if not isinstance(v, list)]:
            doc = place({key: value})
            message, accepts = loader(doc), schema_accepts(doc)
            assert accepts or message is not None, f"the loader accepts, the schema rejects: {doc}"
            assert not accepts or message is None or inexpressible(message), (
                f"the loader rejects ({message}), the schema accepts: {doc}"
            )
            rejected += message is not None
        if (name, key) != ("value", "value"):  # a literal argument may be anything
            assert rejected, f"{name}.{key}: the loader accepts every value"


def _accepts_tensor(**entry: Any) -> bool:
    return schema_accepts({"function": F, "inputs": [{"shape": [3, 3], **entry}]})


def test_x_parameters_are_the_keys_each_dist_takes_by_the_schemas_conditions():
    dist = DEFS["tensor"]["properties"]["dist"]
    assert tuple(dist["x-parameters"]) == vocabulary.enum(dist)
    valid = {"mean": 0.5, "std": 1, "low": 1, "high": 2, "dim": 0}
    params = {k for taken in dist["x-parameters"].values() for k in taken}
    assert params == set(valid)
    for name, taken in dist["x-parameters"].items():
        assert _accepts_tensor(dist=name), name
        for key, value in valid.items():
            entry = {"dist": name, key: value, **({"high": 2} if key == "low" and "high" in taken else {})}
            assert _accepts_tensor(**entry) is (key in taken), (name, key)
            assert (loader({"function": F, "inputs": [{"shape": [3, 3], **entry}]}) is None) is (key in taken), entry


def test_the_set_and_matrix_dists_stay_in_python_as_the_schemas_conditions_say():
    """MATRIX_DISTS and SET_DISTS (what the draws do) are Python's; the schema's conditions name the same."""
    for name in spec.DISTS:
        avoid = {"function": F, "inputs": [{"shape": [3, 3], "dist": name, "avoid": [[0, 0.01]]}]}
        assert schema_accepts(avoid) is (loader(avoid) is None) is (name not in spec.SET_DISTS), name
        vector = {"function": F, "inputs": [{"shape": [3], "dist": name}]}
        assert schema_accepts(vector) is (loader(vector) is None) is (name not in spec.MATRIX_DISTS), name


def test_x_keys_are_the_keys_each_reference_rule_takes_by_the_schemas_conditions():
    rule = DEFS["reference_rule"]["properties"]["rule"]
    assert tuple(rule["x-keys"]) == vocabulary.enum(rule)
    valid = {"factor": 2, "atol": 0.1, "rtol": 0.1}
    for name, taken in rule["x-keys"].items():
        assert taken[0] == "rule" and set(taken) <= set(DEFS["reference_rule"]["properties"])
        for key, value in valid.items():
            doc = {"function": F, "tolerance": {"reference": {"rule": name, key: value}}}
            assert schema_accepts(doc) is (key in taken), (name, key)
            assert (loader(doc) is None) is (key in taken), (name, key)


def test_x_canonical_names_the_dtype_each_alias_stands_for():
    dtype = DEFS["dtype"]
    aliases = dtype["x-canonical"]
    assert set(aliases) < set(dtype["enum"])
    assert set(aliases.values()) <= set(dtype["enum"]) - set(aliases)  # a canonical name is no alias
    integer = {k for k in dtype["enum"] if aliases.get(k, k).startswith(("int", "uint", "bool"))}
    assert set(DEFS["int_dtype"]["enum"]) == integer
    assert set(DEFS["reference_dtype"]["enum"]) <= set(dtype["enum"])
    for name in dtype["enum"]:
        case = parse_document({"function": F, "dtype": name}, Ctx("s.yaml"))[0]
        assert case.dtype == aliases.get(name, name)


def test_the_expectable_patterns_are_the_schemas():
    assert DEFS["expected"]["properties"]["pattern"]["enum"] == [*EXPECTABLE, None]  # null: any mismatch
    assert DEFS["expect"]["additionalProperties"]["anyOf"][0]["enum"] == ["fail", *EXPECTABLE]


def test_the_model_names_the_schemas_vocabulary_in_its_order():
    assert spec.TOP_KEYS == tuple(SCHEMA["properties"])
    assert spec.CASE_KEYS == ("name",) + tuple(k for k in spec.TOP_KEYS if k != "cases")
    assert spec.KINDS == ("shape", "data", "value", "same_as", "list", "dict")
    assert spec.TENSOR_KEYS == tuple(DEFS["tensor"]["properties"])
    assert spec.DISTS == {
        d: tuple(DEFS["tensor"]["properties"]["dist"]["x-parameters"][d])
        for d in DEFS["tensor"]["properties"]["dist"]["enum"]
    }
    assert spec.CHECKS == tuple(DEFS["check_name"]["enum"])
    assert {key: check for key, (check, _) in spec.OWNED.items()} == {
        "repeat": "backward",
        "order": "double_backward",
        "compile": "compile",
    }
    assert spec.INIT_MODES == ("train", "eval")
    assert spec.REFERENCE_DTYPES == ("float64", "float32", "float16", "bfloat16")
    assert spec.RULES == {"relative": ("rule", "factor", "atol"), "allclose": ("rule", "atol", "rtol")}
    assert spec.MAX_DIMS == DEFS["tensor"]["properties"]["shape"]["maxItems"] == 64
    assert vocabulary.SCHEMA == SCHEMA


# the drifts the tests above found, each pinned: the loader now refuses what the schema refuses

DRIFTS = [  # (document, the loader's message)
    (
        {"function": F, "tolerance": {"reference": {"rule": ["relative"]}}},  # was: TypeError (unhashable), exit 4
        "s.yaml: tolerance.reference.rule: unknown rule ['relative']; use relative (the target's error at most "
        "`factor` times the reference's own in the target's dtype) or allclose",
    ),
    (
        {"function": F, "compile": False},  # was: read as `compile: {}`
        "s.yaml: compile: expected a mapping with keys backend, atol, rtol; got false",
    ),
    (
        {"function": F, "cases": [{"compile": 0}]},
        "s.yaml: cases[0].compile: expected a mapping with keys backend, atol, rtol; got 0",
    ),
    (
        {"function": F, "inputs": [{"shape": [3], "mean": {}}]},  # was: ignored
        "s.yaml: inputs[0].mean: expected a finite number, got {}",
    ),
    (
        {"function": F, "inputs": [{"shape": [3], "dist": "normal", "std": {"size_of": "x"}}]},
        "s.yaml: inputs[0].std: expected a finite number, got {'size_of': 'x'}",
    ),
    (
        {"function": F, "inputs": [{"shape": [3], "dist": None}]},  # was: read as no dist
        "s.yaml: inputs[0].dist: unknown distribution null; use one of normal, uniform, randint, positive, sorted, "
        "simplex, permutation, symmetric, spd, orthogonal",
    ),
]


@pytest.mark.parametrize("doc, message", DRIFTS)
def test_the_loader_refuses_what_the_schema_refuses(doc, message):
    assert not schema_accepts(doc)
    assert loader(doc) == message


ACCEPTED = [  # what the loader always read as "not given", and the schema now allows too
    {"function": F, "compile": {"atol": None, "rtol": "1e-3"}},
    {"function": F, "tolerance": {"reference": {"rule": None, "factor": 3}}},
    {"function": F, "expect": {"reason": "why", "x": {"pattern": None}}},
    {"function": F, "inputs": [{"shape": [3], "param": None, "requires_grad": None}]},
]


@pytest.mark.parametrize("doc", ACCEPTED)
def test_the_schema_accepts_the_nulls_the_loader_reads_as_not_given(doc):
    assert loader(doc) is None
    assert schema_accepts(doc)
