"""Fuzzing the spec loader (hypothesis): whatever the file holds, ``spec.load_file`` answers
with ``Case`` and ``SpecError`` items and never raises; every error names the file and a key
path that really occurs in the document; a mutation of a valid spec is reported at the key
it broke; valid specs load the same twice and build (on the CPU) the same tensors.

Properties:

- random YAML documents (spec-shaped and arbitrary nested values), random text, random
  bytes (raw, and decoded leniently), documents cut by random ``---`` lines: no exception
  escapes ``load_file``; each ``SpecError`` message starts with the file path, names a key
  path of the document (or says the key is missing) and a line inside the file; each
  ``Case`` is well formed; ``inputs.build(case, "cpu")`` raises nothing but ``InputError``
  whose key is a key path of the document;
- one mutation of a valid spec (the shipped ``specs/*.yaml`` and ``VALID`` below, which use
  every feature): delete a key or list entry, rename a key to a near miss, replace a value by
  one of another type (or by an alias to another node, possibly an enclosing one), insert an
  unknown key at any depth, duplicate a list entry, set a number to negative/NaN/inf/huge.
  At most one error, at (or right around) the mutated key path; where the mutation surely
  breaks the spec, exactly that error, and for unknown keys the list of the allowed ones;
- valid specs: loading twice gives equal cases; building succeeds, and the same seed gives
  identical tensors (and the same ``same_as`` aliasing).

Each example writes into a fresh temporary directory (hypothesis does not mix with
function-scoped fixtures such as ``tmp_path``). The regression tests at the end pin each bug
the fuzzer found.
"""

from __future__ import annotations

import contextlib
import copy
import dataclasses
import math
import re
import tempfile
from collections.abc import Iterator
from pathlib import Path
from typing import Any, Optional, Union

import pytest
import torch
import yaml
from hypothesis import HealthCheck, event, given, settings
from hypothesis import strategies as st

from gradcheck_cli import spec
from gradcheck_cli.spec import AliasArg, Case, DictArg, ListArg, SpecError, TensorArg, ValueArg, load_file
from gradcheck_cli.subject import inputs

ROOT = Path(__file__).resolve().parents[2]
SHIPPED = sorted((ROOT / "specs").glob("*.yaml"))

FUZZ = settings(deadline=None, database=None, suppress_health_check=[HealthCheck.too_slow])

VALID_ALL_FEATURES = """\
# every key of the format, at the top level and overridden in cases
function: gradcheck_cli.examples.linear:LinearFunction
description: every feature of the spec format
seed: 7
device: [cpu, cuda, "cuda:1"]
dtype: float32
tolerance: {eps: 1.0e-6, atol: 1.0e-5, rtol: 1.0e-3, nondet_tol: 0.0}
checks: [backward, double_backward]
inputs:
  - name: x
    shape: [3, 4]
    dist: normal
    mean: 0.5
    std: 2.0
    avoid: [[-0.01, 0.01], [0.99, 1.01]]
  - name: w
    shape: [2, 4]
    dtype: float64
    dist: uniform
    low: -1.0
    high: 1.0
  - {name: idx, shape: [5], dtype: int64, dist: randint, low: 0, high: 4, requires_grad: false}
  - {name: lit, data: [[1.0, 2.0], [3.0, 4.0]], requires_grad: true}
  - {name: ints, data: [1, 2, 3]}
  - {name: flags, data: [true, false], dtype: bool}
  - {name: z, shape: [2], dtype: complex128}
  - {name: scalar, shape: []}
  - {name: empty, shape: [0, 3]}
  - {name: alias, same_as: x}
  - {name: c, value: 2.5}
  - {value: null}
kwargs:
  dim: {value: -1}
  keepdim: {value: false}
  other: {shape: [2, 2], dtype: float64, avoid: [[-0.5, 0.5]]}
  again: {same_as: w}
init: {args: [1, 2], kwargs: {bias: true}}
cases:
  - name: base
  - name: overrides
    function: pkg.mod.OtherFunction
    description: a case overriding every key
    seed: 3
    device: cpu
    dtype: double
    tolerance: {atol: 1.0e-4}
    checks: all
    inputs:
      - {name: a, shape: [8, 8], avoid: [[-0.1, 0.1]]}
      - {same_as: a}
      - {name: half, shape: [2], dtype: half, dist: uniform, low: 1, high: 2}
    kwargs:
      dim: {value: [0, 1]}
    init: {args: [], kwargs: {}}
  - name: 7
    checks: backward
    device: "cuda:0"
"""

VALID_SEVERAL_DOCS = """\
function: pkg.mod:First
inputs: [{shape: [2, 3]}]
---
function: pkg.mod:Second
seed: 123456789
tolerance: {eps: "1e-6", atol: "1e-5"}
checks: forward_ad
inputs:
  - {shape: [4], dtype: float64, dist: randint, low: -3, high: 3, avoid: [[0, 0]]}
  - {data: 1.5}
  - {data: [[true]], dtype: float32}
cases:
  - {}
  - {inputs: [{shape: []}, {value: {nested: [1, 2, {deep: null}]}}]}
---
function: pkg.mod.Third
kwargs:
  scale: {data: [2.0, 3.0], dtype: complex64, requires_grad: false}
  flag: {value: true}
"""

VALID_MODULE = """\
function: torch.nn.Linear
init:
  args: [4, 3]
  kwargs: {bias: false, dtype: null}
inputs:
  - {name: input, shape: [2, 4], dist: uniform, low: 0, high: 1}
"""

VALID = {"all_features": VALID_ALL_FEATURES, "several_docs": VALID_SEVERAL_DOCS, "module": VALID_MODULE}
CORPUS = [(p.name, p.read_text(encoding="utf-8")) for p in SHIPPED] + sorted(VALID.items())

ALL_KEYS = set(
    spec.TOP_KEYS
    + spec.CASE_KEYS
    + spec.TENSOR_KEYS
    + spec.TOLERANCE_KEYS
    + ("value", "same_as", "list", "dict", "args", "kwargs")
)
NUMBER_KEYS = ("mean", "std", "low", "high", "eps", "atol", "rtol", "nondet_tol")

# Build only tensors that are small, or so large that allocating them fails at once.
SMALL_NUMEL, HOPELESS_NUMEL = 10**6, 2**50


# ----------------------------------------------------------------------- files and paths


@contextlib.contextmanager
def spec_file(content: Union[str, bytes], name: str = "spec.yaml") -> Iterator[str]:
    """A fresh directory holding one file with ``content``; yields the file's path."""
    with tempfile.TemporaryDirectory(prefix="gradcheck-fuzz-") as folder:
        path = Path(folder) / name
        path.write_bytes(content if isinstance(content, bytes) else content.encode("utf-8"))
        yield str(path)


def key_paths(text: str) -> Optional[set[str]]:
    """Every key path of the documents the loader can read in ``text``, written the way
    messages write them (``inputs[1].shape``): by the keys' Python values and by their YAML
    spelling (duplicate keys are caught on the latter). None when the document is too big
    to enumerate (aliases) or too deep."""
    paths: set[str] = set()
    budget = [200_000]

    def walk(value: Any, key: tuple, open_: set, node: bool) -> None:
        budget[0] -= 1
        if budget[0] < 0:
            raise OverflowError
        paths.add(spec.keystr(key))
        if id(value) in open_:
            return
        open_.add(id(value))
        if node and isinstance(value, yaml.MappingNode):
            for k, v in value.value:
                walk(v, key + (k.value,), open_, node)
        elif node and isinstance(value, yaml.SequenceNode):
            for i, v in enumerate(value.value):
                walk(v, key + (i,), open_, node)
        elif isinstance(value, dict):
            for k, v in value.items():
                walk(v, key + (k,), open_, node)
        elif isinstance(value, list):
            for i, v in enumerate(value):
                walk(v, key + (i,), open_, node)
        open_.discard(id(value))

    loader = None
    try:
        loader = yaml.SafeLoader(text)
        while loader.check_node():
            node = loader.get_node()
            walk(node, (), set(), True)  # before construction flattens merge keys (<<)
            data = loader.construct_document(node)
            walk(node, (), set(), True)
            walk(data, (), set(), False)
    except (OverflowError, RecursionError):
        return None
    except Exception:  # a syntax error, or a tagged value that does not parse (`!!int x`): the documents so far
        pass
    finally:
        if loader is not None:
            loader.dispose()
    return paths


def n_lines(text: str) -> int:
    return len(re.split("\r\n|[\r\n\x85\u2028\u2029]", text))


def numel(arg: TensorArg) -> int:
    if arg.shape is None:
        return 0
    return math.prod(arg.shape)


def all_args(case: Case) -> list:
    """The case's argument entries, each list and dict replaced by its leaves (which have no name of their own)."""
    out = []
    for arg in list(case.inputs) + [a for _, a in case.kwargs]:
        if isinstance(arg, (ListArg, DictArg)):
            assert arg.items and arg.key and all(a.name is None for _, a in spec.leaves(arg)), arg
        out += [a for _, a in spec.leaves(arg)]
    return out


def buildable(case: Case) -> bool:
    args = all_args(case)
    return all(not isinstance(a, TensorArg) or numel(a) <= SMALL_NUMEL or numel(a) >= HOPELESS_NUMEL for a in args)


# ----------------------------------------------------------------------- the checks


def check_error(err: SpecError, path: str, text: Optional[str], paths: Optional[set[str]]) -> None:
    msg = str(err)
    assert isinstance(err, SpecError)
    assert err.path == path and msg.startswith(path), msg
    if err.key:
        assert re.match(rf"^{re.escape(path)}(:\d+)?: {re.escape(err.key)}: \S", msg), msg
        if paths is not None:
            assert err.key in paths or "missing" in msg or defaulted(err, paths), (err.key, msg, sorted(paths)[:50])
    else:
        assert re.match(rf"^{re.escape(path)}(:\d+)?: \S", msg), msg
    if err.line is not None:
        assert isinstance(err.line, int) and 1 <= err.line <= (n_lines(text) if text is not None else err.line), msg


def defaulted(err: SpecError, paths: set[str]) -> bool:
    """``high`` left at its default below the given ``low`` is reported at ``high`` (pinned by
    test_spec.py::test_high_must_be_above_low), with the default value in the message."""
    entry, _, last = err.key.rpartition(".")
    return last == "high" and entry in paths and "expected high > low" in str(err)


def check_case(case: Case, path: str) -> None:
    """The resolved fields have the types and values the rest of the tool relies on."""
    assert case.path == path
    assert isinstance(case.label, str) and isinstance(case.description, str)
    assert isinstance(case.function, str) and spec.is_import_path(case.function)
    assert isinstance(case.seed, int) and not isinstance(case.seed, bool) and 0 <= case.seed < 2**64
    assert case.devices and all(isinstance(d, str) and re.fullmatch(r"cpu|cuda(:\d+)?|mps", d) for d in case.devices)
    assert case.dtype in spec.DTYPES.values()
    for k in spec.TOLERANCE_KEYS:
        v = getattr(case.tolerance, k)
        if k == "reference":
            assert v.rule in (None, *spec.RULES) and v.factor > 0
            assert all(t is None or (isinstance(t, float) and math.isfinite(t) and t >= 0) for t in (v.atol, v.rtol))
            continue
        assert isinstance(v, float) and math.isfinite(v) and v >= 0
    assert case.tolerance.eps > 0
    assert case.reference_dtype in spec.REFERENCE_DTYPES
    for path in (case.reference, case.reference_backward):
        assert path is None or spec.is_import_path(path)
    if case.expect is not None:
        assert case.expect.reason.strip() and case.expect.args and set(case.expect.checks) <= set(spec.CHECKS)
    assert case.checks and set(case.checks) <= set(spec.CHECKS)
    for arg in all_args(case):
        assert isinstance(arg, (TensorArg, ValueArg, AliasArg)) and arg.key
        assert arg.name is None or isinstance(arg.name, str)
        if isinstance(arg, TensorArg):
            assert (arg.shape is None) != (arg.data is None)
            assert arg.shape is None or all(isinstance(d, int) and d >= 0 for d in arg.shape)
            assert arg.dtype is None or arg.dtype in spec.DTYPES.values()
            assert all(math.isfinite(v) for _, v in arg.params)
            assert all(lo <= hi for lo, hi in arg.avoid)
            if arg.dist in ("uniform", "randint"):
                params = dict(arg.params)
                assert params["low"] < params["high"]
        elif isinstance(arg, AliasArg):
            assert isinstance(arg.same_as, str)


def check_build(case: Case, paths: Optional[set[str]]) -> Optional[tuple]:
    """Build on the CPU: the arguments, or None after an InputError that names a key."""
    if not buildable(case):
        return None
    try:
        return inputs.build(case, "cpu")
    except inputs.InputError as exc:
        assert exc.key and str(exc), exc
        if paths is not None:
            assert exc.key in paths, (exc.key, str(exc))
        return None


def check_file(content: Union[str, bytes], build: bool = True) -> list[Union[Case, SpecError]]:
    """Load ``content`` from a fresh file and check every item; return the items."""
    text: Optional[str] = content if isinstance(content, str) else None
    if text is None:
        try:
            text = content.decode("utf-8")  # type: ignore[union-attr]
        except UnicodeDecodeError:
            text = None
    paths = key_paths(text) if text is not None else None
    with spec_file(content) as path:
        items = load_file(path)
        assert isinstance(items, list) and items
        for item in items:
            assert isinstance(item, (Case, SpecError)), item
            if isinstance(item, SpecError):
                check_error(item, path, text, paths)
            else:
                check_case(item, path)
                if build:
                    check_build(item, paths)
    return items


def same_tensors(a: Any, b: Any) -> None:
    """Two builds hold the same values (bitwise, NaN included), types and aliasing."""
    assert type(a) is type(b)
    if isinstance(a, torch.Tensor):
        assert a.dtype == b.dtype and a.shape == b.shape and a.device == b.device
        assert a.requires_grad == b.requires_grad and a.layout == b.layout
        if a.layout is not torch.strided:  # a sparse input: the same specified elements, with the same values
            a, b = a.detach().to_sparse_coo().coalesce(), b.detach().to_sparse_coo().coalesce()
            assert torch.equal(a.indices(), b.indices())
            a, b = a.values(), b.values()
        ra = torch.view_as_real(a.detach()) if a.is_complex() else a.detach()
        rb = torch.view_as_real(b.detach()) if b.is_complex() else b.detach()
        assert torch.equal(ra, rb) or (
            ra.is_floating_point()
            and torch.equal(ra.isnan(), rb.isnan())
            and torch.equal(ra.nan_to_num(), rb.nan_to_num())
        )
    else:
        assert repr(a) == repr(b)


def flat(values: list) -> list:
    """The values with the lists and dicts of ``list:`` / ``dict:`` entries spread into their leaves (a literal
    ``value: [...]`` too: its items compare alike)."""
    out = []
    for v in values:
        out += flat(list(v.values()) if isinstance(v, dict) else v) if isinstance(v, (list, dict)) else [v]
    return out


def same_builds(first: tuple, second: tuple) -> None:
    (pos1, kw1), (pos2, kw2) = first, second
    values1 = flat([v for _, v in pos1] + [v for _, v in kw1])
    values2 = flat([v for _, v in pos2] + [v for _, v in kw2])
    assert [n for n, _ in pos1] == [n for n, _ in pos2] and [n for n, _ in kw1] == [n for n, _ in kw2]
    assert len(values1) == len(values2)
    for a, b in zip(values1, values2):
        same_tensors(a, b)
    ids1 = [[j for j, w in enumerate(values1) if w is v] for v in values1]
    ids2 = [[j for j, w in enumerate(values2) if w is v] for v in values2]
    assert ids1 == ids2  # same_as gives the very same object, in both builds alike


# ----------------------------------------------------------------------- strategies


VOCAB = (
    sorted(ALL_KEYS)
    + list(spec.CHECKS)
    + sorted(spec.DTYPES)
    + list(spec.DISTS)
    + [
        "all",
        "cpu",
        "cuda",
        "cuda:0",
        "cuda:12",
        "mps",
        "cpu\n",
        "gpu",
        "pkg.mod:Fn",
        "pkg.mod.Fn",
        "mod:Fn",
        "gradcheck_cli.examples.linear:LinearFunction",
        "1e-6",
        "-1",
        "nan",
        "inf",
        "-inf",
        "",
        " ",
        "x",
        "0x10",
    ]
)
HUGE = [2**63, 2**64, 10**30, -(10**30), 10**400, 1e300, -1e300, 1.7976931348623157e308]
FUNCTIONS = ["pkg.mod:Fn", "gradcheck_cli.examples.relu:ReLU", "a.b.C", "my kern/ops.py::Fn", "C:\\x\\ops.py::A.B"]

small_ints = st.integers(-3, 12)
scalars = st.one_of(
    st.none(),
    st.booleans(),
    small_ints,
    st.integers(),
    st.sampled_from(HUGE),
    st.floats(allow_nan=True, allow_infinity=True),
    st.floats(-10, 10),
    st.sampled_from(VOCAB),
    st.text(max_size=10),
    st.binary(max_size=4),
)
keys = st.one_of(st.sampled_from(sorted(ALL_KEYS)), st.text(max_size=8), st.integers(-2, 3), st.booleans(), st.none())
values = st.recursive(
    scalars, lambda inner: st.lists(inner, max_size=4) | st.dictionaries(keys, inner, max_size=4), max_leaves=12
)


def sometimes_wrong(good: st.SearchStrategy) -> st.SearchStrategy:
    """Mostly ``good`` values, now and then anything at all."""
    return st.one_of(good, good, good, values)


numbers = st.one_of(
    small_ints,
    st.floats(-5, 5),
    st.sampled_from([math.nan, math.inf, -math.inf, "1e-3", "x", None, True]),
    st.sampled_from(HUGE),
)
names = st.sampled_from(["x", "w", "b", "input", "weight", "dim", "a"])
shapes = st.lists(st.integers(0, 4), max_size=3)
shapes_odd = st.lists(
    st.one_of(st.integers(-2, 4), st.sampled_from([2**62, 2**63, 10**30, 1.5, "2", None, True])), max_size=3
)
nested_data = st.recursive(
    st.one_of(st.floats(-3, 3), small_ints, st.booleans(), st.sampled_from([math.nan, "x", None])),
    lambda inner: st.lists(inner, max_size=3),
    max_leaves=10,
)
avoids = st.lists(
    st.one_of(st.lists(numbers, min_size=2, max_size=2), st.lists(numbers, max_size=3), values), max_size=3
)
dtypes = st.sampled_from(sorted(spec.DTYPES) + ["float128", "Float64"])
dists = st.sampled_from(list(spec.DISTS) + ["gamma"])

tensor_entry = st.fixed_dictionaries(
    {"shape": st.one_of(shapes, shapes, shapes_odd)},
    optional={
        "name": sometimes_wrong(names),
        "dtype": sometimes_wrong(dtypes),
        "dist": sometimes_wrong(dists),
        "mean": numbers,
        "std": numbers,
        "low": numbers,
        "high": numbers,
        "avoid": avoids,
        "requires_grad": sometimes_wrong(st.booleans()),
    },
)
data_entry = st.fixed_dictionaries(
    {"data": sometimes_wrong(nested_data)},
    optional={"name": names, "dtype": sometimes_wrong(dtypes), "requires_grad": st.booleans(), "dist": dists},
)
value_entry = st.fixed_dictionaries({"value": values}, optional={"name": sometimes_wrong(names)})
alias_entry = st.fixed_dictionaries({"same_as": sometimes_wrong(names)}, optional={"name": names})
any_entry = st.dictionaries(
    st.sampled_from(spec.TENSOR_KEYS + ("value", "same_as", "list", "dict", "bogus")), values, max_size=4
)
plain_entries = st.one_of(tensor_entry, tensor_entry, data_entry, value_entry, alias_entry, any_entry, values)
container_entries = st.recursive(  # list: / dict: entries, nested, their items now and then named (an error)
    plain_entries,
    lambda inner: st.one_of(
        st.fixed_dictionaries({"list": sometimes_wrong(st.lists(inner, max_size=3))}, optional={"name": names}),
        st.fixed_dictionaries(
            {"dict": sometimes_wrong(st.dictionaries(st.one_of(names, keys), inner, max_size=3))},
            optional={"name": names},
        ),
    ),
    max_leaves=5,
).filter(lambda e: isinstance(e, dict) and ("list" in e or "dict" in e))
arg_entries = st.one_of(
    tensor_entry, tensor_entry, data_entry, value_entry, alias_entry, any_entry, values, container_entries
)

devices = sometimes_wrong(
    st.one_of(
        st.sampled_from(["cpu", "cuda", "cuda:1", "mps", "tpu"]),
        st.lists(st.sampled_from(["cpu", "cuda", "cuda:0", "x"]), max_size=3),
    )
)
checks = sometimes_wrong(
    st.one_of(
        st.sampled_from(list(spec.CHECKS) + ["all", "nope"]),
        st.lists(st.sampled_from(list(spec.CHECKS) + ["all", "nope"]), max_size=3),
    )
)
tolerances = sometimes_wrong(st.dictionaries(st.sampled_from(spec.TOLERANCE_KEYS + ("tol",)), numbers, max_size=3))
inits = sometimes_wrong(
    st.fixed_dictionaries({}, optional={"args": sometimes_wrong(st.lists(values, max_size=3)), "kwargs": values})
)
fields = {
    "description": values,
    "seed": sometimes_wrong(st.integers(0, 2**64 + 10)),
    "device": devices,
    "dtype": sometimes_wrong(dtypes),
    "tolerance": tolerances,
    "checks": checks,
    "inputs": sometimes_wrong(st.lists(arg_entries, max_size=4)),
    "kwargs": sometimes_wrong(st.dictionaries(names, arg_entries, max_size=3)),
    "init": inits,
}
case_entries = sometimes_wrong(
    st.fixed_dictionaries(
        {},
        optional={
            "name": sometimes_wrong(st.sampled_from(["a", "b", 1, "case1"])),
            "function": sometimes_wrong(st.sampled_from(FUNCTIONS)),
            **fields,
        },
    )
)
spec_docs = st.tuples(
    st.fixed_dictionaries(
        {"function": sometimes_wrong(st.sampled_from(FUNCTIONS))},
        optional={**fields, "cases": sometimes_wrong(st.lists(case_entries, max_size=3))},
    ),
    st.one_of(st.just({}), st.just({}), st.dictionaries(keys, values, max_size=2)),
    st.sets(st.sampled_from(["function"]), max_size=1),
).map(lambda t: {k: v for k, v in {**t[0], **t[1]}.items() if k not in t[2]})
documents = st.one_of(spec_docs, spec_docs, spec_docs, values)

YAML_TOKENS = list("abcfinpsu_.:0123456789 -[]{},#&*!|>'\"%@`?\n\t\\~") + [
    "function: pkg.mod:Fn\n",
    "inputs:\n",
    "  - ",
    "shape: [2, 3]",
    "shape: ",
    "value: ",
    "same_as: ",
    "data: ",
    "---\n",
    "...\n",
    "\n  ",
    "&a ",
    "*a",
    "<<: ",
    "<<: *a",
    "!!binary ",
    "!!python/object:os.system ",
    "!!str ",
    "!!int ",
    "!!float ",
    "!!set ",
    "!!omap ",
    "!!timestamp ",
    "!!bool ",
    "!!null ",
    "!!map ",
    "!!seq ",
    "!!value ",
    "!!merge ",
    "2001-13-45",
    "0b",
    "0x",
    "1:60",
    "? ",
    "\ufeff",
    "\x00",
    "\x85",
    "\u2028",
    "\r\n",
    "%YAML 1.1\n",
    "%TAG ! tag:x,2000:\n",
    ".nan",
    ".inf",
    "1e999",
    "0o17",
    "0x1F",
    "9" * 30,
    "~",
    "null",
    "yes",
    "no",
]
yaml_text = st.lists(st.sampled_from(YAML_TOKENS), max_size=60).map("".join)


def dump(docs: list, flow: Optional[bool]) -> str:
    return yaml.safe_dump_all(docs, default_flow_style=flow, sort_keys=False, allow_unicode=True)


# ----------------------------------------------------------------------- random input


@settings(FUZZ, max_examples=300)
@given(docs=st.lists(documents, min_size=1, max_size=3), flow=st.sampled_from([False, True, None]))
def test_random_yaml_documents(docs, flow):
    check_file(dump(docs, flow))


@settings(FUZZ, max_examples=200)
@given(text=st.one_of(yaml_text, yaml_text, st.text(max_size=120)))
def test_random_text(text):
    check_file(text)


@settings(FUZZ, max_examples=100)
@given(raw=st.binary(max_size=120), how=st.sampled_from(["raw", "replace", "latin-1"]))
def test_random_bytes(raw, how):
    if how == "raw":
        check_file(raw)
    elif how == "replace":
        check_file(raw.decode("utf-8", errors="replace"))
    else:
        check_file(raw.decode("latin-1"))


@settings(FUZZ, max_examples=150)
@given(data=st.data())
def test_documents_cut_by_random_separators(data):
    base = data.draw(
        st.one_of(
            st.sampled_from([t for _, t in CORPUS]),
            st.lists(documents, min_size=1, max_size=2).map(lambda d: dump(d, None)),
        )
    )
    lines = base.splitlines(keepends=True)
    cuts = data.draw(st.lists(st.integers(0, len(lines)), max_size=4))
    marker = data.draw(st.sampled_from(["---\n", "--- \n", "---\n---\n", "...\n---\n", "--- |\n", "--- # c\n", "---"]))
    for cut in sorted(cuts, reverse=True):
        lines.insert(cut, marker)
    text = "".join(lines)
    if data.draw(st.booleans()):  # and one cut anywhere, inside a line too
        at = data.draw(st.integers(0, len(text)))
        text = text[:at] + "\n---\n" + text[at:]
    check_file(text)


# ----------------------------------------------------------------------- mutations of valid specs


def walk(value: Any, key: tuple = ()) -> Iterator[tuple[tuple, Any]]:
    """(key path, value) of every node, the root first."""
    yield key, value
    if isinstance(value, dict):
        for k, v in value.items():
            yield from walk(v, key + (k,))
    elif isinstance(value, list):
        for i, v in enumerate(value):
            yield from walk(v, key + (i,))


def get(doc: Any, key: tuple) -> Any:
    for part in key:
        doc = doc[part]
    return doc


def role(doc: Any, key: tuple) -> str:
    """What the node at ``key`` of a valid document is: top, case, arg, tolerance, init, kwargs, or free."""
    if key == ():
        return "top"
    parent = role(doc, key[:-1])
    last = key[-1]
    if parent == "top" and last == "cases":
        return "cases"
    if parent == "cases":
        return "case"
    if parent in ("top", "case"):
        return {"tolerance": "tolerance", "init": "init", "kwargs": "kwargs", "inputs": "inputs"}.get(last, "field")
    if parent in ("inputs", "kwargs", "list", "dict"):  # a list's or dict's items are argument entries too
        return "arg"
    if parent == "arg" and last in ("list", "dict"):
        return last
    return "free"


def allowed_keys(doc: Any, key: tuple) -> Optional[tuple]:
    """The keys a mapping at ``key`` may hold, or None where any key goes."""
    r = role(doc, key)
    if r == "arg":
        entry = get(doc, key)
        kind = next((k for k in ("value", "same_as", "list", "dict") if k in entry), None)
        return ("name", kind) if kind else spec.TENSOR_KEYS
    return {"top": spec.TOP_KEYS, "case": spec.CASE_KEYS, "tolerance": spec.TOLERANCE_KEYS, "init": spec.INIT_KEYS}.get(
        r
    )


def near_misses(name: str) -> list[str]:
    out = {name[:i] + name[i + 1 :] for i in range(len(name))}
    out |= {name[:i] + name[i + 1] + name[i] + name[i + 2 :] for i in range(len(name) - 1)}
    out |= {name[:i] + name[i] + name[i:] for i in range(len(name))}
    out |= {name.capitalize(), name.upper(), name + "s", name + "_", " " + name, name.replace("_", "-")}
    return sorted(n for n in out if n and n != name and n not in ALL_KEYS)


def type_class(value: Any) -> str:
    if isinstance(value, bool):
        return "bool"
    return "number" if isinstance(value, (int, float)) else type(value).__name__


def related(err: str, mutated: tuple, doc: Any) -> bool:
    """An error key at the mutated key path, inside it, at most two levels above it, or (for
    an argument entry or an `expect`, whose keys constrain each other) at a sibling key."""
    if mutated == ():
        return True
    here = spec.keystr(mutated)
    if err == here or err.startswith(here + ".") or err.startswith(here + "["):
        return True
    if err and err in {spec.keystr(mutated[:j]) for j in range(max(1, len(mutated) - 2), len(mutated))}:
        return True
    if mutated[0] == "inputs" and re.fullmatch(r"cases\[\d+\]\.inputs(\..*)?", err):
        return True  # a case's `inputs: {NAME: ...}` names entries of the document's list
    if mutated[0] == "cases" and re.fullmatch(r"cases\[\d+\]\.name", err):
        return True  # case names are unique: a changed case can clash with another one's name
    if re.search(r"(\.placement|outputs)$", err) and ("distributed" in mutated or "shape" in mutated):
        return True  # a placement needs `distributed`, and shard(d) fits the shape to the world size
    parent = mutated[:-1]
    if parent and parent[-1] == "expect" and err in {spec.keystr(parent + (k,)) for k in spec.EXPECT_KEYS}:
        return True  # renaming `reason` (or removing it) leaves `reason` missing
    try:
        is_arg = role(doc, parent) == "arg"
    except (KeyError, IndexError, TypeError):
        is_arg = False
    return is_arg and err in {spec.keystr(parent + (k,)) for k in spec.TENSOR_KEYS}


def alike_keys(value: Any) -> bool:
    """Whether ``value`` holds a mapping with two keys that YAML writes alike ('0' and 0, 'true' and true)."""
    if isinstance(value, dict):
        texts = ["null" if k is None else str(k).lower() if isinstance(k, bool) else str(k) for k in value]
        return len(set(texts)) < len(texts) or any(alike_keys(v) for v in value.values())
    if isinstance(value, list):
        return any(alike_keys(v) for v in value)
    return False


def mutate(doc: Any, data: st.DataObject) -> tuple[Any, tuple, Optional[str], tuple]:
    """One random mutation of ``doc`` (a valid document, changed in place where it can be):
    (new document, mutated key path, the error key the mutation surely causes or None,
    the keys that error must list as allowed)."""
    nodes = list(walk(doc))
    kind = data.draw(
        st.sampled_from(["delete", "rename", "retype", "insert", "duplicate", "number", "alias"]), label="kind"
    )
    event(f"mutation: {kind}")
    inner = [(k, v) for k, v in nodes if k]
    if kind == "delete":
        key, _ = data.draw(st.sampled_from(inner), label="delete")
        parent, last = get(doc, key[:-1]), key[-1]
        r = role(doc, key[:-1])
        sure = None
        if key == ("function",):
            sure = "function"
        elif r == "arg" and last in spec.KINDS:
            sure = spec.keystr(key[:-1])
        elif (
            isinstance(parent, list)
            and len(parent) == 1
            and role(doc, key[:-1]) in ("cases", "field", "list")
            and key[-2] != "import"
        ):  # `import: []` imports nothing, which is fine
            sure = spec.keystr(key[:-1])  # the only case, device, check or item of a list
        del parent[last]
        return doc, key, sure, ()
    if kind == "rename":
        candidates = [(k, v) for k, v in inner if isinstance(k[-1], str) and near_misses(k[-1])]
        key, _ = data.draw(st.sampled_from(candidates), label="rename")
        parent, old = get(doc, key[:-1]), key[-1]
        new = data.draw(st.sampled_from([n for n in near_misses(old) if n not in parent]), label="to")
        allowed = allowed_keys(doc, key[:-1])
        sure = None
        is_kind = role(doc, key[:-1]) == "arg" and old in spec.KINDS
        if allowed is not None:  # the typo is named, also a kind's (`shpe:`), before what is missing
            sure = spec.keystr(key[:-1] + (new,))
        items = [(new if k == old else k, v) for k, v in parent.items()]
        parent.clear()
        parent.update(items)
        return doc, key[:-1] + (new,), sure, (allowed if sure and not is_kind else ())
    if kind == "retype":
        key, old = data.draw(st.sampled_from(nodes), label="retype")
        new = data.draw(values.filter(lambda v: type_class(v) != type_class(old)), label="to")
        sure = None
        r = role(doc, key)
        if key and r in ("case", "arg") and new is not None:
            sure = spec.keystr(key)
        elif (
            key[-1:] in (("function",), ("seed",), ("shape",))
            and role(doc, key[:-1]) in ("top", "case", "arg")
            and not (key[-1] == "shape" and isinstance(new, list))
            and not (key[-1] == "seed" and type_class(new) == "number")
        ):
            sure = spec.keystr(key)
        if not key:
            return new, key, None, ()
        get(doc, key[:-1])[key[-1]] = new
        return doc, key, sure, ()
    if kind == "insert":
        mappings = [(k, v) for k, v in nodes if isinstance(v, dict)]
        key, mapping = data.draw(st.sampled_from(mappings), label="into")
        new = data.draw(
            st.from_regex(r"[a-z][a-z_]{0,10}", fullmatch=True).filter(
                lambda n: n not in ALL_KEYS and n not in mapping
            ),
            label="key",
        )
        mapping[new] = value = data.draw(values, label="value")
        allowed = allowed_keys(doc, key)
        # a value holding two keys written alike ('0' and 0) is first a duplicate key inside it
        sure = spec.keystr(key + (new,)) if allowed and not alike_keys(value) else None
        return doc, key + (new,), sure, (allowed or ()) if sure else ()
    if kind == "duplicate":
        lists = [(k, v) for k, v in nodes if isinstance(v, list) and v]
        if not lists:
            return doc, (), None, ()
        key, seq = data.draw(st.sampled_from(lists), label="list")
        i = data.draw(st.integers(0, len(seq) - 1), label="entry")
        seq.insert(i + 1, copy.deepcopy(seq[i]))
        sure = None
        if role(doc, key) == "cases" and isinstance(seq[i], dict) and "name" in seq[i]:
            sure = spec.keystr(key + (i + 1, "name"))
        return doc, key + (i + 1,), sure, ()
    if kind == "number":
        nums = [(k, v) for k, v in inner if type_class(v) == "number"]
        if not nums:
            return doc, (), None, ()
        key, old = data.draw(st.sampled_from(nums), label="number")
        new = data.draw(
            st.sampled_from([-old if old else -1, -abs(old) - 1, math.nan, math.inf, -math.inf] + HUGE), label="to"
        )
        get(doc, key[:-1])[key[-1]] = new
        r = role(doc, key[:-1])
        finite = isinstance(new, int) or math.isfinite(new)
        sure = None
        if r == "arg" and key[-1] in NUMBER_KEYS and not finite:
            sure = spec.keystr(key)
        elif r == "tolerance" and (not finite or new < 0):
            sure = spec.keystr(key)
        elif r in ("top", "case") and key[-1] == "seed" and not (spec.whole(new) is not None and 0 <= new < 2**64):
            sure = spec.keystr(key)
        elif (
            len(key) >= 2
            and key[-2] == "shape"
            and role(doc, key[:-2]) == "arg"
            and not (spec.whole(new) is not None and new >= 0)
        ):  # 1.0 is a whole number, as in JSON
            sure = spec.keystr(key[:-1])
        elif len(key) >= 3 and key[-3] == "avoid" and role(doc, key[:-3]) == "arg" and not finite:
            sure = spec.keystr(key)
        return doc, key, sure, ()
    # alias: a node becomes the very same object as another node (YAML &anchor / *alias),
    # possibly one that contains it (a cycle)
    containers = [(k, v) for k, v in nodes if isinstance(v, (dict, list))]
    key, _ = data.draw(st.sampled_from(inner), label="alias at")
    _, target = data.draw(st.sampled_from(containers), label="alias of")
    get(doc, key[:-1])[key[-1]] = target
    return doc, key, None, ()


@pytest.mark.slow
@settings(FUZZ, max_examples=400)
@given(data=st.data())
def test_mutations_of_valid_specs(data):
    name, text = data.draw(st.sampled_from(CORPUS), label="spec")
    docs = list(yaml.safe_load_all(text))
    d = data.draw(st.integers(0, len(docs) - 1), label="doc")
    original = copy.deepcopy(docs[d])
    docs[d], key, sure, allowed = mutate(docs[d], data)
    mutated_text = dump(docs, data.draw(st.sampled_from([False, True, None]), label="flow"))
    items = check_file(mutated_text)
    errors = [i for i in items if isinstance(i, SpecError)]
    event("outcome: " + ("surely invalid" if sure else "invalid" if errors else "valid"))
    assert len(errors) <= 1, [str(e) for e in errors]  # one broken document, one error
    for err in errors:
        assert related(err.key, key, original), (spec.keystr(key), str(err))
    if sure is not None:
        assert errors and errors[0].key == sure, (spec.keystr(key), sure, [str(e) for e in errors])
        if allowed:
            msg = str(errors[0])
            assert "unknown key" in msg and "allowed keys" in msg, msg
            listed = msg.split("allowed keys here:", 1)[1]
            assert [k.strip() for k in listed.split(",")] == list(allowed), msg
    if not errors:  # still valid: loads the same again
        with spec_file(mutated_text) as path:
            again = load_file(path)
        assert len(again) == len(items)
        assert repr([replace_path(c) for c in again]) == repr([replace_path(c) for c in items])


def replace_path(case: Case) -> Case:
    return dataclasses.replace(case, path="")


# ----------------------------------------------------------------------- valid specs


@pytest.mark.parametrize("name,text", CORPUS, ids=[n for n, _ in CORPUS])
def test_valid_specs_load_equal_twice_and_build_identically(name, text):
    with spec_file(text, name) as path:
        first = load_file(path)
        second = load_file(path)
    assert all(isinstance(c, Case) for c in first), [str(c) for c in first]
    assert first == second
    for case in first:
        check_case(case, path)
        built = inputs.build(case, "cpu")  # the valid specs all build
        same_builds(built, inputs.build(case, "cpu"))


@settings(FUZZ, max_examples=60)
@given(data=st.data(), seed=st.one_of(st.integers(0, 2**64 - 1), st.integers(0, 10)))
def test_same_seed_gives_identical_tensors(data, seed):
    name, text = data.draw(st.sampled_from(CORPUS), label="spec")
    docs = list(yaml.safe_load_all(text))
    for doc in docs:
        doc["seed"] = seed
        for case in doc.get("cases", []):
            case.pop("seed", None)
    with spec_file(dump(docs, None), name) as path:
        cases = load_file(path)
        again = load_file(path)
    assert all(isinstance(c, Case) and c.seed == seed for c in cases), [str(c) for c in cases]
    assert cases == again
    for case, other in zip(cases, again):
        same_builds(inputs.build(case, "cpu"), inputs.build(other, "cpu"))


# ----------------------------------------------------------------------- regressions: what the fuzzer found


def load_one(text: str) -> tuple[str, list[Union[Case, SpecError]]]:
    with spec_file(text) as path:
        return path, load_file(path)


def only_error(text: str, key: str, *gist: str) -> SpecError:
    """``text`` loads as exactly one SpecError, at ``key``, saying each ``gist``; checked like the fuzzer does."""
    with spec_file(text) as path:
        items = load_file(path)
        assert len(items) == 1 and isinstance(items[0], SpecError), items
        err = items[0]
        check_error(err, path, text, key_paths(text))
    assert err.key == key, str(err)
    for g in gist:
        assert g in str(err), (g, str(err))
    return err


def only_case_of(text: str) -> Case:
    with spec_file(text) as path:
        items = load_file(path)
    assert len(items) == 1 and isinstance(items[0], Case), [str(i) for i in items]
    return items[0]


@pytest.mark.parametrize(
    "text, key",
    [
        ("function: a.b:C\ndtype: []\n", "dtype"),
        ("function: a.b:C\ndtype: {float64: 1}\n", "dtype"),
        ("function: a.b:C\ninputs: [{shape: [2], dtype: [float64]}]\n", "inputs[0].dtype"),
        ("function: a.b:C\ninputs: [{shape: [2], dist: {normal: 1}}]\n", "inputs[0].dist"),
    ],
)
def test_unhashable_dtype_or_dist_is_an_error_not_a_type_error(text, key):
    # was: TypeError: unhashable type: 'list' (from `value not in DTYPES` / `dist not in DISTS`)
    only_error(text, key, "unknown")


@pytest.mark.parametrize("text", ["\x1f", "function: a.b:C\n\x00\n", "\x08function: a.b:C\n"])
def test_control_characters_are_a_yaml_error(text):
    # was: yaml.reader.ReaderError escaping load_file (SafeLoader(text) refuses them before the try)
    only_error(text, "", "not valid YAML", "unacceptable character")


@pytest.mark.parametrize(
    "tagged",
    [
        "!!float a",
        "!!int a",
        "!!int 0x",
        "!!int 0o9",
        "!!float",
        "!!int",
        "!!bool x",
        "!!bool",
        "!!timestamp 2001-13-45",
        "!!timestamp",
        "!!timestamp 2001-01-01 00:00:00 +99:99",
    ],
)
def test_a_value_that_does_not_fit_its_tag_is_a_yaml_error(tagged):
    # was: ValueError / IndexError / KeyError / AttributeError from PyYAML's SafeConstructor
    only_error(f"function: a.b:C\nseed: {tagged}\n", "", "not valid YAML", "explicit tag")
    path, items = load_one(f"function: a.b:C\n---\nfunction: a.b:D\nseed: {tagged}\n")
    assert isinstance(items[0], Case) and items[0].function == "a.b:C"  # the documents before it are kept
    assert isinstance(items[1], SpecError) and "explicit tag" in str(items[1])


@pytest.mark.parametrize(
    "opening, closing, depth",
    [
        ("[", "]", 100),
        ("[", "]", 300),
        ("[", "]", 500),  # PyYAML reads nested flow lists in quadratic time
        ("{a: ", "}", 100),
        ("{a: ", "}", 400),
        ("{a: ", "}", 20000),
        ("- ", "", 1000),
    ],
)
def test_deeply_nested_documents_never_raise(opening, closing, depth):
    # was: RecursionError from PyYAML's composer
    nested = opening * depth + "1" + closing * depth
    for text in (
        f"function: a.b:C\ndescription: {nested}\n",
        f"function: a.b:C\ninputs: [{{data: {nested}}}]\n",
        f"function: a.b:C\ninputs: [{{value: {nested}}}]\n",
        nested,
    ):
        items = check_file(text)
        if depth <= 100:
            assert not any("nested too deeply" in str(i) for i in items)


@pytest.mark.parametrize(
    "text, key",
    [
        ("function: a.b:C\ninputs: &a [*a]\n", "inputs[0]"),
        ("function: a.b:C\ninputs: [&e {shape: [2], name: *e}]\n", "inputs[0].name"),
        ("function: a.b:C\ninputs: [{data: &d [1.0, *d]}]\n", "inputs[0].data[1]"),
        ("function: a.b:C\ninputs: [{value: &v {next: *v}}]\n", "inputs[0].value.next"),
        ("&top\nfunction: a.b:C\ndescription: *top\n", "description"),
    ],
)
def test_an_alias_inside_the_node_it_names_is_an_error(text, key):
    # was: RecursionError in _node_lines (a YAML cycle: the loader builds a self-containing list)
    only_error(text, key, "alias", "infinite")


def test_aliases_that_expand_exponentially_are_refused_quickly():
    # was: _node_lines walked every expanded path: 9**9 for this "billion laughs" document
    rows = ["a0: &a0 [x, x, x, x, x, x, x, x, x]"]
    rows += [f"a{i}: &a{i} [{', '.join([f'*a{i - 1}'] * 9)}]" for i in range(1, 10)]
    text = "function: a.b:C\ndescription: {" + ", ".join(rows) + "}\n"
    only_error(text, "description.a6", "aliases expand", str(spec.MAX_NODES))


def test_shared_aliases_still_work_and_keep_their_lines():
    text = "function: a.b:C\ninputs:\n  - {shape: &s [2, 3], name: x}\n  - {shape: *s, name: y}\n  - {shape: *s, dist: gamma}\n"
    with spec_file(text) as path:
        (err,) = load_file(path)
    assert str(err).startswith(f"{path}:5: inputs[2].dist: unknown distribution")
    case = only_case_of(text.rsplit("  - ", 1)[0])
    assert [a.shape for a in case.inputs] == [(2, 3), (2, 3)]


@pytest.mark.parametrize(
    "text, key",
    [
        (f"function: a.b:C\ntolerance: {{atol: {10**400}}}\n", "tolerance.atol"),
        (f"function: a.b:C\ntolerance: {{eps: {10**400}}}\n", "tolerance.eps"),
        (f"function: a.b:C\ninputs: [{{shape: [2], mean: {10**400}}}]\n", "inputs[0].mean"),
        (f"function: a.b:C\ninputs: [{{shape: [2], avoid: [[0, {10**400}]]}}]\n", "inputs[0].avoid[0][1]"),
    ],
)
def test_an_int_too_large_for_a_float_is_an_error(text, key):
    # was: OverflowError: int too large to convert to float (math.isfinite in spec.number)
    only_error(text, key, "expected a finite")


def test_seed_must_fit_the_generator():
    # was: a valid Case whose inputs.build raised ValueError "Overflow when unpacking long long"
    only_error(f"function: a.b:C\nseed: {2**64}\n", "seed", "below 2**64")
    case = only_case_of(f"function: a.b:C\nseed: {2**64 - 1}\ninputs: [{{shape: [3]}}]\n")
    same_builds(inputs.build(case, "cpu"), inputs.build(case, "cpu"))


@pytest.mark.parametrize(
    "text, key",
    [
        ('function: a.b:C\ndevice: "cpu\\n"\n', "device"),
        ('function: a.b:C\ndevice: [cpu, "cuda:0\\n"]\n', "device"),
        ('function: "a.b:C\\n"\n', "function"),
    ],
)
def test_a_trailing_newline_does_not_pass_for_a_device_or_a_function(text, key):
    # was: accepted (`$` matches before a final newline); torch.device("cpu\n") then raised
    only_error(text, key, "expected")


@pytest.mark.parametrize(
    "bounds, key",
    [
        ("low: 0.2, high: 0.8", "inputs[0].low"),  # int() made both 0: torch.randint(0, 0) raised
        ("low: 0, high: 2.5", "inputs[0].high"),
        (f"low: 0, high: {2**63}", "inputs[0].high"),  # torch: Overflow when unpacking long long
        ("low: -1.0e+30", "inputs[0].low"),
    ],
)
def test_randint_bounds_must_be_int64_whole_numbers(bounds, key):
    only_error(f"function: a.b:C\ninputs: [{{shape: [2], dist: randint, {bounds}}}]\n", key, "whole number")
    case = only_case_of("function: a.b:C\ninputs: [{shape: [50], dist: randint, low: -2.0, high: 2}]\n")
    ((_, x),) = inputs.build(case, "cpu")[0]
    assert set(x.tolist()) <= {-2, -1, 0, 1}


def test_a_default_case_name_that_is_taken_is_reported_at_the_case():
    # was: reported at cases[1].name, a key the document does not have
    only_error("function: a.b:C\ncases: [{name: case1}, {}]\n", "cases[1]", "'case1'", "name:")


@pytest.mark.parametrize("shape", [[10**30], [2**62], [0, 2**63], [2**40, 2**40]])
def test_a_shape_too_large_to_draw_is_an_input_error(shape):
    # was: TypeError / RuntimeError from torch escaping inputs.build
    case = only_case_of(f"function: a.b:C\ninputs: [{{shape: {shape}}}]\n")
    with pytest.raises(inputs.InputError) as info:
        inputs.build(case, "cpu")
    assert info.value.key == "inputs[0].shape" and "cannot draw" in str(info.value)


def test_data_with_an_int_too_large_for_a_float_is_an_input_error():
    # was: OverflowError from torch.tensor escaping inputs.build
    case = only_case_of(f"function: a.b:C\ninputs: [{{data: [{10**400}, 3.0]}}]\n")
    with pytest.raises(inputs.InputError) as info:
        inputs.build(case, "cpu")
    assert info.value.key == "inputs[0].data"


def test_merge_keys_may_be_overridden():
    # was: "duplicate key", because the mapping was walked after PyYAML flattened the merge into it
    case = only_case_of("function: a.b:C\ninputs: [&x {shape: [2]}, {<<: *x, shape: [3]}]\n")
    assert [a.shape for a in case.inputs] == [(2,), (3,)]
