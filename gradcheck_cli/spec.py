"""Spec files: YAML -> frozen dataclasses, with strict validation.

Every error names the file, the line where known, and the key path, and says what is allowed.
Only ``yaml.SafeLoader`` is used. A file may hold several documents; one broken document is
one error and the others are still read.
"""
from __future__ import annotations

import difflib
import math
import re
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any, Optional, Union

import yaml

from .checks import NAMES as CHECKS
from .results import EXPECTABLE

DTYPES = {
    "float64": "float64", "double": "float64", "float32": "float32", "float": "float32",
    "float16": "float16", "half": "float16", "bfloat16": "bfloat16",
    "complex128": "complex128", "cdouble": "complex128", "complex64": "complex64", "cfloat": "complex64",
    "int64": "int64", "long": "int64", "int32": "int32", "int": "int32", "int16": "int16",
    "int8": "int8", "uint8": "uint8", "bool": "bool",
}
DISTS = {"normal": ("mean", "std"), "uniform": ("low", "high"), "randint": ("low", "high"),
         "positive": ("low", "high"), "sorted": ("low", "high", "dim"), "simplex": ("dim",), "permutation": ("dim",),
         "symmetric": (), "spd": (), "orthogonal": ()}  # dist -> the keys it takes
DIST_DEFAULTS = {"mean": 0.0, "std": 1.0}
BOUNDS = {"uniform": (0.0, 1.0), "sorted": (0.0, 1.0), "positive": (0.1, 10.0)}  # default (low, high); randint's below
MATRIX_DISTS = ("symmetric", "spd", "orthogonal")  # the last two dimensions are a matrix
SET_DISTS = MATRIX_DISTS + ("simplex", "sorted", "permutation")  # a set: `avoid` (redrawing values) would leave it
SYMMETRIC_DISTS = ("symmetric", "spd")  # perturbed along the set: the check differentiates f(sym(X)), sym = (X + X^T)/2
MAX_DIMS = 64  # dimensions of a torch tensor, at most
SEEDS = 2**64  # seeds are 0 <= seed < SEEDS, the range of torch.Generator.manual_seed
TOP_KEYS = ("function", "import", "description", "seed", "device", "dtype", "tolerance", "strict", "checks", "repeat",
            "resample", "inputs", "kwargs", "init", "clone_inputs", "compile", "reference", "reference_dtype",
            "reference_backward", "expect", "cases")
CASE_KEYS = ("name",) + tuple(k for k in TOP_KEYS if k != "cases")
KINDS = ("shape", "data", "value", "same_as", "list", "dict")  # an argument entry has exactly one of these
TENSOR_KEYS = ("name", "shape", "data", "dtype", "dist", "mean", "std", "low", "high", "dim", "avoid", "requires_grad",
               "param")
TOLERANCE_KEYS = ("eps", "atol", "rtol", "nondet_tol", "reference")
RULES = {"relative": ("rule", "factor", "atol"), "allclose": ("rule", "atol", "rtol")}  # tolerance.reference: its keys
REFERENCE_DTYPES = ("float64", "float32", "float16", "bfloat16")  # reference_dtype (complex inputs: its complex kind)
INIT_KEYS = ("args", "kwargs", "mode")  # init: constructor arguments, and train | eval
INIT_MODES = ("train", "eval")  # init.mode: module.train() / module.eval() before checking
COMPILE_KEYS = ("backend", "atol", "rtol")  # `compile`: the compile check's backend and tolerances
COMPILE_BACKENDS = ("aot_eager", "inductor", "eager")
EXPECT_KEYS = ("reason", "checks")  # the other keys of `expect` are argument names
DEVICE_RE = re.compile(r"cpu|cuda(:\d+)?|mps")  # used with fullmatch: `$` would let a trailing newline in
FUNCTION_RE = re.compile(r"[A-Za-z_][\w.]*(:[A-Za-z_][\w.]*)?")  # likewise
MODULE_RE = re.compile(r"[A-Za-z_]\w*(\.[A-Za-z_]\w*)*")  # a module name for `import`; likewise
# a number written as a string ('1e-6': YAML 1.1 reads an exponent without a dot as text); the JSON
# Schema's `number` pattern is the same (a test compares them), so editors accept what runs accept
NUMERIC_RE = re.compile(r"[+-]?([0-9]+(\.[0-9]*)?|\.[0-9]+)([eE][+-]?[0-9]+)?", re.ASCII)
MAX_NODES = 1_000_000  # aliases may repeat a node: refuse documents that expand past this ("billion laughs")
MERGE_TAG = "tag:yaml.org,2002:merge"  # the tag of a plain `<<` key
Key = tuple[Union[str, int], ...]  # a key path into a document: mapping keys and list positions


class SpecError(Exception):
    """A spec that cannot be used. The message names file, line and key path."""

    def __init__(self, path: str, key: str, message: str, line: Optional[int] = None) -> None:
        self.path, self.key, self.line = path, key, line
        where = f"{path}:{line}" if line else path
        super().__init__(f"{where}: {key}: {message}" if key else f"{where}: {message}")


@dataclass(frozen=True)
class TensorArg:
    """A tensor drawn from a distribution (``shape``) or given literally (``data``)."""

    name: Optional[str] = None
    shape: Optional[tuple[int, ...]] = None
    data: Any = None
    dtype: Optional[str] = None
    dist: Optional[str] = None
    params: tuple[tuple[str, float], ...] = ()
    avoid: tuple[tuple[float, float], ...] = ()
    requires_grad: Optional[bool] = None
    key: str = ""  # key path in the spec, for messages
    line: Optional[int] = None
    dim: int = -1  # simplex, sorted, permutation: along this dimension
    size_of: tuple[tuple[str, str, int], ...] = ()  # (low | high, argument, dim): a bound that is that size
    param: Optional[str] = None  # import path of fn: the target gets fn(X), the check perturbs X

    @property
    def via(self) -> Optional[str]:
        """How the checks perturb it, where not element by element: through ``param``, or along the
        symmetric matrices (``sym``)."""
        return self.param or ("sym" if self.dist in SYMMETRIC_DISTS else None)


@dataclass(frozen=True)
class ValueArg:
    """A literal non-tensor argument (``value: null`` passes None)."""

    value: Any
    name: Optional[str] = None
    key: str = ""
    line: Optional[int] = None
    imported: Optional[str] = None  # `value: {import: pkg.mod:fn}`: the object that path names is passed


@dataclass(frozen=True)
class AliasArg:
    """The very same tensor object as another argument."""

    same_as: str
    name: Optional[str] = None
    key: str = ""
    line: Optional[int] = None


@dataclass(frozen=True)
class ListArg:
    """``list: [ENTRY, ...]``: a Python list of arguments (``torch.cat``-like targets, ``Tensor[]`` of a
    custom op); every leaf is an ordinary entry, named by its path (``tensors[0]``)."""

    items: tuple[Arg, ...]
    name: Optional[str] = None
    key: str = ""
    line: Optional[int] = None


@dataclass(frozen=True)
class DictArg:
    """``dict: {KEY: ENTRY, ...}``: a Python dict of arguments, in the order written; every leaf is an
    ordinary entry, named by its path (``feats.q``)."""

    items: tuple[tuple[str, Arg], ...]
    name: Optional[str] = None
    key: str = ""
    line: Optional[int] = None


Arg = Union[TensorArg, ValueArg, AliasArg, ListArg, DictArg]
Container = (ListArg, DictArg)  # the entries that hold other entries


@dataclass(frozen=True)
class ReferenceRule:
    """``tolerance.reference``: how the reference check compares the target with the reference.

    ``relative`` (flash-attention's rule): the target's max error against the reference run in
    ``reference_dtype`` is at most ``factor`` times the reference's own error when run in the
    target's dtype, plus ``atol``. ``allclose``: ``|target - reference| <= atol + rtol * |reference|``
    elementwise. None: the defaults (``relative`` where the target runs in a lower precision than the
    reference, else ``allclose``; atol and rtol per dtype)."""

    rule: Optional[str] = None
    factor: float = 2.0
    atol: Optional[float] = None
    rtol: Optional[float] = None


@dataclass(frozen=True)
class Tolerance:
    eps: float = 1e-6
    atol: float = 1e-5
    rtol: float = 1e-3
    nondet_tol: float = 0.0
    # the keys the spec set (the others may be adapted, e.g. to a low dtype)
    given: tuple[str, ...] = field(default=(), compare=False)
    # `strict: true` / --strict: a constant factor within tolerance but well beyond the finite
    # differences' own error estimate fails (by default it is a warning, as torch.autograd.gradcheck passes it)
    strict: bool = False
    reference: ReferenceRule = ReferenceRule()


@dataclass(frozen=True)
class Expected:
    """One argument's documented mismatch: any failure (``pattern`` None), or a pattern (``sign_flip``,
    ``constant_ratio``, ...), with the constant ``ratio`` analytical / numerical where given."""

    arg: str
    pattern: Optional[str] = None
    ratio: Optional[float] = None
    key: str = ""
    line: Optional[int] = None

    def __str__(self) -> str:
        what = "a failure" if self.pattern is None else self.pattern
        return what + (f" with ratio {self.ratio:g}" if self.ratio is not None else "")


@dataclass(frozen=True)
class Expect:
    """``expect:``: mismatches the spec documents as intended (a straight-through estimator, gradient
    reversal), with the ``reason``, in the rows of ``checks``."""

    reason: str
    args: tuple[Expected, ...]
    checks: tuple[str, ...] = ("backward",)
    key: str = "expect"
    line: Optional[int] = None
    checks_given: bool = False  # `expect.checks` was written (else: backward's rows, where backward runs)


@dataclass(frozen=True)
class CompileOptions:
    """`compile`: the compile check's torch.compile backend and tolerances (None: per dtype)."""

    backend: str = "aot_eager"
    atol: Optional[float] = None
    rtol: Optional[float] = None


@dataclass(frozen=True)
class Case:
    """One fully resolved case of one spec document: everything needed to check it."""

    path: str
    label: str  # the case name, or "default"
    function: str
    imports: tuple[str, ...] = ()  # `import`: modules imported before `function` is resolved (they register ops)
    description: str = ""
    seed: int = 0
    devices: tuple[str, ...] = ("cpu",)
    dtype: str = "float64"
    tolerance: Tolerance = Tolerance()
    checks: tuple[str, ...] = ("backward",)
    checks_given: bool = False  # `checks` was written (else: backward, or reference where one is given)
    all_checks: bool = False  # `checks: all`: every applicable check (an unsupported one skips, a named one fails)
    spec_checks: tuple[str, ...] = ()  # the checks the spec's `checks:` names (none for `all` or no `checks:`)
    repeat: int = 3  # backward calls with the same grad_output that must agree (determinism)
    resample: bool = False  # draw again (next seed) when an input sits on a kink or domain edge
    inputs: tuple[Arg, ...] = ()
    kwargs: tuple[tuple[str, Arg], ...] = ()
    init_args: tuple[Any, ...] = ()
    init_kwargs: tuple[tuple[str, Any], ...] = ()
    init_mode: Optional[str] = None  # `init.mode`: train | eval (None: as the constructor leaves it)
    clone_inputs: bool = False  # call the target on copies of its tensor arguments (an in-place Function)
    compile: CompileOptions = CompileOptions()
    reference: Optional[str] = None  # import path of a reference implementation
    reference_dtype: str = "float64"  # the reference runs on copies of the inputs in this dtype
    reference_backward: Optional[str] = None  # import path of fn(inputs, grad_outputs) -> the intended gradients
    expect: Optional[Expect] = None
    line: Optional[int] = None
    doc: int = 1  # 1-based document number within the file
    n_docs: int = 1

    @property
    def name(self) -> str:
        """Stable id stem: ``path::label``, with ``#doc`` when the file holds several documents."""
        doc = f"#{self.doc}" if self.n_docs > 1 else ""
        return f"{self.path}{doc}::{self.label}"


@dataclass
class _Ctx:
    path: str
    lines: dict[Key, int] = field(default_factory=dict)
    prefix: Key = ()

    def fail(self, key: Key, message: str) -> SpecError:
        full = self.prefix + key
        line = next((self.lines[full[:i]] for i in range(len(full), -1, -1) if full[:i] in self.lines), None)
        return SpecError(self.path, _keystr(full), message, line)


def _keystr(key: Key) -> str:
    out = ""
    for part in key:
        out += f"[{part}]" if isinstance(part, int) else (f".{part}" if out else str(part))
    return out


def load_file(path: Union[str, Path]) -> list[Union[Case, SpecError]]:
    """Read a spec file: a list with one entry per case, or a SpecError per unusable document."""
    path = str(path)
    try:
        text = Path(path).read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as exc:
        return [SpecError(path, "", f"cannot read the file: {exc}")]
    docs, syntax_error = _documents(text, path)
    if not docs and syntax_error is None:
        return [SpecError(path, "", "the file holds no spec; it needs at least a `function:` key")]
    out: list[Union[Case, SpecError]] = []
    n_docs = max((i for i, _, _ in docs), default=0) + (syntax_error is not None)
    for i, ctx, doc in docs:
        if isinstance(ctx, SpecError):
            out.append(ctx)
            continue
        try:
            out.extend(parse_document(doc, ctx, doc_index=i, n_docs=n_docs))
        except SpecError as exc:
            out.append(exc)
    return out + ([syntax_error] if syntax_error else [])


def _documents(text: str, path: str) -> tuple[list[tuple[int, Union[_Ctx, SpecError], Any]], Optional[SpecError]]:
    """(position, context with the lines of its key paths or the error that refused it, data) of
    each non-empty document, read with the safe loader, and the syntax error that stopped the
    reading, if any: the documents before it are kept."""
    loader = None
    docs: list[tuple[int, Union[_Ctx, SpecError], Any]] = []
    try:
        loader = yaml.SafeLoader(text)  # refuses control characters at once
        index = 0
        while loader.check_node():
            node = loader.get_node()
            if node is None:  # not after check_node() said a document follows; for the type checker
                break
            index += 1
            ctx = _Ctx(path)
            try:  # walked as written: construction flattens merge keys (<<) into the mappings
                _node_lines(node, (), ctx)
            except SpecError as exc:
                docs.append((index, exc, None))
                continue
            _resolve_merges(node, set())
            try:
                data = loader.construct_document(node)
            except (ValueError, TypeError, LookupError, ArithmeticError, AttributeError) as exc:
                # a value that does not fit its tag (`!!int x`) raises these, not a YAMLError
                return docs, SpecError(path, "", f"not valid YAML: a value does not fit its explicit tag: {exc}")
            if data is not None:
                docs.append((index, ctx, data))
    except yaml.YAMLError as exc:
        mark = getattr(exc, "problem_mark", None)
        problem = getattr(exc, "problem", None) or str(exc)
        return docs, SpecError(path, "", f"not valid YAML: {problem}; fix the syntax at this line",
                               mark.line + 1 if mark is not None else None)
    except RecursionError:
        return docs, SpecError(path, "", "not readable: lists or mappings nested too deeply")
    finally:
        if loader is not None:
            loader.dispose()
    return docs, None


def _node_lines(node: yaml.Node, key: Key, ctx: _Ctx, sizes: Optional[dict[int, Optional[int]]] = None) -> int:
    """Map every key path to its 1-based line; refuse duplicate keys (YAML would keep the last; a key
    that overrides one merged in by ``<<`` is no duplicate),
    an alias inside the node it names (a cycle) and aliases that expand past MAX_NODES.
    A node met again through an alias is not walked again: the paths below it take the
    alias's line. Returns the node's size with aliases expanded."""
    sizes = {} if sizes is None else sizes  # id(node) -> expanded size; None while inside it
    lines = ctx.lines
    lines.setdefault(key, node.start_mark.line + 1)
    if id(node) in sizes:
        known = sizes[id(node)]
        if known is None:
            raise SpecError(ctx.path, _keystr(key), "an alias inside the node it names: a spec cannot be infinite",
                            lines[key])
        return known
    sizes[id(node)] = None
    size = 1
    merges: list[tuple[str, yaml.Node]] = []  # (the key as written, its value) of a mapping's merge keys (<<)
    if isinstance(node, yaml.MappingNode):
        seen: set[str] = set()
        for k, v in node.value:
            if not isinstance(k, yaml.ScalarNode):  # `? [a, b]: ...` or `? {a: 1}: ...`, a complex key
                raise SpecError(ctx.path, _keystr(key), "a key must be a plain name, not a list or a mapping "
                                "(a line that starts with `? ` writes a complex key)", k.start_mark.line + 1)
            name = k.value
            if name in seen:
                also = "; to merge several mappings, list them: `<<: [*a, *b]`" if k.tag == MERGE_TAG else ""
                raise SpecError(ctx.path, _keystr(key + (name,)), f"duplicate key: keep one{also}",
                                k.start_mark.line + 1)
            seen.add(name)
            lines[key + (name,)] = k.start_mark.line + 1
            size += _node_lines(v, key + (name,), ctx, sizes)
            if k.tag == MERGE_TAG:
                merges.append((name, v))
    elif isinstance(node, yaml.SequenceNode):
        for i, v in enumerate(node.value):
            size += _node_lines(v, key + (i,), ctx, sizes)
    if size > MAX_NODES:
        raise SpecError(ctx.path, _keystr(key), f"aliases expand this to more than {MAX_NODES} values", lines[key])
    for merged_key, _ in (pair for name, v in merges for pair in _merged(v, key, ctx, name)):
        lines.setdefault(key + (merged_key.value,), merged_key.start_mark.line + 1)  # where its value is written
    sizes[id(node)] = size
    return size


def _resolve_merges(node: yaml.Node, done: set[int]) -> None:
    """Replace every merge key (<<) by the pairs it brings, in place, as YAML 1.1 says: a mapping's own
    keys win, then the earlier mapping of a list. Not left to PyYAML: its 6.0.4 lets a later mapping of
    the list win where the earlier one merged the same keys. ``node`` was walked by _node_lines (no cycle,
    merge values are mappings)."""
    if id(node) in done:
        return
    done.add(id(node))
    if isinstance(node, yaml.SequenceNode):
        for value in node.value:
            _resolve_merges(value, done)
    if not isinstance(node, yaml.MappingNode):
        return
    for _, value in node.value:
        _resolve_merges(value, done)  # merged mappings first lose their own merge keys
    if not any(k.tag == MERGE_TAG for k, _ in node.value):
        return
    pairs = [(k, v) for k, v in node.value if k.tag != MERGE_TAG]
    names = {k.value for k, _ in pairs}
    for k, value in node.value:
        if k.tag != MERGE_TAG:
            continue
        for mapping in value.value if isinstance(value, yaml.SequenceNode) else [value]:
            for mk, mv in mapping.value:
                if mk.value not in names:
                    names.add(mk.value)
                    pairs.append((mk, mv))
    node.value = pairs


def _merged(value: yaml.Node, key: Key, ctx: _Ctx, name: str = "<<") -> list[tuple[yaml.Node, yaml.Node]]:
    """The (key, value) pairs that ``<<: value`` brings into a mapping, the winner of each key
    first (YAML 1.1): a mapping's own keys before those it merges, an earlier mapping of a list
    before a later one. The mapping's explicit keys beat them all. ``value`` was walked (no cycle);
    ``name`` is the merge key as written (`<<`, or `!!merge NAME`), for the message."""
    maps = value.value if isinstance(value, yaml.SequenceNode) else [value]
    pairs: list[tuple[yaml.Node, yaml.Node]] = []
    for m in maps:
        if not isinstance(m, yaml.MappingNode):
            raise SpecError(ctx.path, _keystr(key + (name,)), "a merge key `<<` takes a mapping or a list of "
                            "mappings, e.g. `<<: *defaults` or `<<: [*a, *b]`", m.start_mark.line + 1)
        own = [(k, v) for k, v in m.value if k.tag != MERGE_TAG]
        pairs += own + [pair for k, v in m.value if k.tag == MERGE_TAG for pair in _merged(v, key, ctx, k.value)]
    return pairs


def parse_document(doc: Any, ctx: _Ctx, doc_index: int = 1, n_docs: int = 1) -> list[Case]:
    """Validate one YAML document and expand its cases."""
    _mapping(doc, (), TOP_KEYS, ctx)
    if "function" not in doc:
        raise ctx.fail(("function",), "missing; name the Function to check, e.g. `function: pkg.mod:MyFunction`")
    base = Case(path=ctx.path, label="default", function="", line=ctx.lines.get(()), doc=doc_index, n_docs=n_docs)
    base = _apply(base, doc, (), ctx)
    cases = doc.get("cases")
    if cases is None:
        return [_default_checks(base)]
    if not isinstance(cases, list) or not cases:
        raise ctx.fail(("cases",), f"expected a non-empty list of cases, got {_show(cases)}")
    out, names = [], set()
    for i, entry in enumerate(cases):
        _mapping(entry, ("cases", i), CASE_KEYS, ctx)
        name = entry.get("name", f"case{i}")
        name = name if isinstance(name, str) else whole(name)
        if "name" not in entry and name in names:
            raise ctx.fail(("cases", i),
                           f"its default name {name!r} is taken by another case; give it a unique `name:`")
        if name is None or str(name) in names:
            raise ctx.fail(("cases", i, "name"), f"expected a unique name, got {_show(entry['name'])}")
        names.add(str(name))
        case = replace(base, label=str(name), line=ctx.lines.get(("cases", i)))
        out.append(_default_checks(_apply(case, entry, ("cases", i), ctx)))
    return out


def _default_checks(case: Case) -> Case:
    """Without `checks`: the reference check where the spec gives a reference (the oracle it chose;
    finite differences on request), else backward."""
    if case.checks_given or not (case.reference or case.reference_backward):
        return case
    return replace(case, checks=("reference",))


def _apply(case: Case, doc: dict[str, Any], key: Key, ctx: _Ctx) -> Case:
    """Return ``case`` with the keys present in ``doc`` (a document or a case entry) applied."""
    changes: dict[str, Any] = {}
    if "function" in doc:
        changes["function"] = _function(doc["function"], key + ("function",), ctx)
    if "import" in doc:
        changes["imports"] = _modules(doc["import"], key + ("import",), ctx)
    if "description" in doc:
        if isinstance(doc["description"], (list, dict)):
            raise ctx.fail(key + ("description",), f"expected text, got {_show(doc['description'])}")
        changes["description"] = str(doc["description"] or "")
    if "seed" in doc:
        seed = whole(doc["seed"])
        if seed is None or not 0 <= seed < SEEDS:
            raise ctx.fail(key + ("seed",), f"expected a non-negative integer below 2**64, got {_show(doc['seed'])}")
        changes["seed"] = seed
    if "device" in doc:
        changes["devices"] = _devices(doc["device"], key + ("device",), ctx)
    if "dtype" in doc:
        changes["dtype"] = _dtype(doc["dtype"], key + ("dtype",), ctx)
    if "tolerance" in doc:
        changes["tolerance"] = _tolerance(doc["tolerance"], case.tolerance, key + ("tolerance",), ctx)
    if "strict" in doc:
        if not isinstance(doc["strict"], bool):
            raise ctx.fail(key + ("strict",), f"expected true or false (fail a systematic factor within tolerance), "
                                              f"got {_show(doc['strict'])}")
        changes["tolerance"] = replace(changes.get("tolerance", case.tolerance), strict=doc["strict"])
    if "checks" in doc:
        changes["checks"] = _checks(doc["checks"], key + ("checks",), ctx)
        changes["checks_given"] = True
        changes["all_checks"] = doc["checks"] in ("all", ["all"])
        changes["spec_checks"] = () if changes["all_checks"] else changes["checks"]
    if "repeat" in doc:
        repeat = whole(doc["repeat"])
        if repeat is None or not 2 <= repeat <= 1000:
            raise ctx.fail(key + ("repeat",), f"expected an integer from 2 to 1000 (backward calls compared for "
                                              f"determinism), got {_show(doc['repeat'])}")
        changes["repeat"] = repeat
    if "resample" in doc:
        if not isinstance(doc["resample"], bool):
            raise ctx.fail(key + ("resample",), f"expected true or false, got {_show(doc['resample'])}")
        changes["resample"] = doc["resample"]
    if "inputs" in doc:
        entries = doc["inputs"]
        if isinstance(entries, dict) and key:  # a case: override the document's arguments by name
            changes["inputs"] = _override(case.inputs, entries, key + ("inputs",), ctx)
        elif not isinstance(entries, list):
            also = " (or, in a case, a mapping NAME: entry that replaces the named ones)" if key else ""
            raise ctx.fail(key + ("inputs",), f"expected a list of argument entries{also}, got {_show(entries)}")
        else:
            changes["inputs"] = tuple(_arg(e, key + ("inputs", i), ctx) for i, e in enumerate(entries))
    if "kwargs" in doc:
        kw = {} if doc["kwargs"] is None else doc["kwargs"]
        if not isinstance(kw, dict):
            raise ctx.fail(key + ("kwargs",), f"expected a mapping of name -> argument entry, got {_show(kw)}")
        changes["kwargs"] = tuple((str(k), _arg(v, key + ("kwargs", k), ctx, name=str(k))) for k, v in kw.items())
    if "init" in doc:
        init = {} if doc["init"] is None else doc["init"]
        _mapping(init, key + ("init",), INIT_KEYS, ctx)
        mode = init.get("mode")
        if mode is not None and mode not in INIT_MODES:
            raise ctx.fail(key + ("init", "mode"), f"expected train or eval (module.train() / module.eval() before "
                                                   f"checking), got {_show(mode)}")
        changes["init_mode"] = mode
        args, kwargs = init.get("args"), init.get("kwargs")
        args, kwargs = [] if args is None else args, {} if kwargs is None else kwargs
        if not isinstance(args, list):
            raise ctx.fail(key + ("init", "args"), f"expected a list, got {_show(args)}")
        if not isinstance(kwargs, dict):
            raise ctx.fail(key + ("init", "kwargs"), f"expected a mapping, got {_show(kwargs)}")
        changes["init_args"], changes["init_kwargs"] = tuple(args), tuple((str(k), v) for k, v in kwargs.items())
    if "clone_inputs" in doc:
        if not isinstance(doc["clone_inputs"], bool):
            raise ctx.fail(key + ("clone_inputs",), f"expected true or false (call the target on copies of its tensor "
                                                    f"arguments), got {_show(doc['clone_inputs'])}")
        changes["clone_inputs"] = doc["clone_inputs"]
    if "compile" in doc:
        changes["compile"] = _compile(doc["compile"], key + ("compile",), ctx)
    for name in ("reference", "reference_backward"):
        if name in doc:
            changes[name] = None if doc[name] is None else _function(doc[name], key + (name,), ctx)
    if "reference_dtype" in doc:
        dtype = _dtype(doc["reference_dtype"], key + ("reference_dtype",), ctx)
        if dtype not in REFERENCE_DTYPES:
            raise ctx.fail(key + ("reference_dtype",), f"expected a floating dtype ({', '.join(REFERENCE_DTYPES)}), "
                                                       f"got {dtype}; complex inputs take its complex kind")
        changes["reference_dtype"] = dtype
    if "expect" in doc:
        changes["expect"] = None if doc["expect"] is None else _expect(doc["expect"], key + ("expect",), ctx)
    return replace(case, **changes)


def _override(inputs: tuple[Arg, ...], entries: dict[Any, Any], key: Key, ctx: _Ctx) -> tuple[Arg, ...]:
    """A case's ``inputs: {NAME: entry}``: the document's ``inputs`` with the arguments named NAME
    (by their ``name:``) replaced by the case's entries, in place; the others are kept."""
    named = [a.name for a in inputs]
    out = list(inputs)
    if entries and not inputs:  # the document's list is what a mapping overrides
        raise ctx.fail(key[:-3] + ("inputs",), f"missing (or empty): {_keystr(key)} overrides arguments by name, "
                                               "which needs the document's `inputs:` list; give the document one, "
                                               "or give the case a list")
    for raw, entry in entries.items():
        name = str(raw)  # the key path as written (`0:` is a name here, not a position)
        if name not in named:
            known = ", ".join(n for n in named if n) or "none"
            unnamed = sum(n is None for n in named)
            hint = (f"; {unnamed} of them {'has' if unnamed == 1 else 'have'} no `name:` (give it one there to "
                    "override it by name)" if unnamed else "")
            raise ctx.fail(key + (name,), f"no argument named {name!r} in the document's inputs; the arguments "
                                          f"are {known}{hint}")
        if isinstance(entry, dict) and "name" in entry and entry["name"] != name:
            raise ctx.fail(key + (name, "name"), f"the key names the argument ({name!r}): drop `name:` here")
        out[named.index(name)] = _arg(entry, key + (name,), ctx, name=name)
    return tuple(out)


def _compile(value: Any, key: Key, ctx: _Ctx) -> CompileOptions:
    """`compile: {backend, atol, rtol}`."""
    value = value or {}
    _mapping(value, key, COMPILE_KEYS, ctx)
    backend = value.get("backend", "aot_eager")
    if backend not in COMPILE_BACKENDS:
        raise ctx.fail(key + ("backend",), f"expected one of {', '.join(COMPILE_BACKENDS)} (torch.compile's backend), "
                                           f"got {_show(backend)}")
    tols = {k: number(value[k], key + (k,), ctx) for k in ("atol", "rtol") if value.get(k) is not None}
    for k, v in tols.items():
        if v < 0:
            raise ctx.fail(key + (k,), f"expected a non-negative number, got {_show(value[k])}")
    return CompileOptions(backend, tols.get("atol"), tols.get("rtol"))


def _mapping(value: Any, key: Key, allowed: tuple[str, ...], ctx: _Ctx) -> None:
    if not isinstance(value, dict):
        raise ctx.fail(key, f"expected a mapping with keys {', '.join(allowed)}; got {_show(value)}")
    for k in value:
        if k not in allowed:
            raise ctx.fail(key + (k,), f"unknown key{_did_you_mean(k, allowed)}; allowed keys here: "
                                       f"{', '.join(allowed)}")


def _did_you_mean(key: Any, allowed: tuple[str, ...]) -> str:
    """`` (did you mean 'shape'?)`` for a key written close to an allowed one (a typo), else ''."""
    close = difflib.get_close_matches(str(key), list(allowed), n=1, cutoff=0.6)
    return f" (did you mean {close[0]!r}?)" if close else ""


def _show(value: Any) -> str:
    text = repr(value)
    return text if len(text) <= 60 else text[:57] + "..."


def is_device(text: str) -> bool:
    """cpu, cuda, cuda:N or mps, exactly."""
    return DEVICE_RE.fullmatch(text) is not None


def is_import_path(text: str) -> bool:
    """'pkg.mod:Name' or 'pkg.mod.Name' (at least one dot), exactly."""
    return FUNCTION_RE.fullmatch(text) is not None and "." in text.replace(":", ".")


def parse_argument(entry: Any, where: str) -> Arg:
    """One argument entry given outside a spec file (e.g. on the command line), validated like
    an entry of ``inputs``; a SpecError names ``where``."""
    return replace(_arg(entry, (), _Ctx(where)), key=where)


def _function(value: Any, key: Key, ctx: _Ctx) -> str:
    if not isinstance(value, str) or not is_import_path(value):
        raise ctx.fail(key, "expected an import path like 'pkg.mod:MyFunction' or 'pkg.mod.MyFunction', "
                            f"got {_show(value)}")
    return value


def _modules(value: Any, key: Key, ctx: _Ctx) -> tuple[str, ...]:
    """``import``: one module name or a list of them (``null`` or ``[]``: none)."""
    items = [] if value is None else [value] if isinstance(value, str) else value
    if not isinstance(items, list):
        raise ctx.fail(key, f"expected a module name or a list of them, e.g. `import: [my_pkg.ops]`, "
                            f"got {_show(value)}")
    for i, name in enumerate(items):
        if not isinstance(name, str) or not is_module_name(name):
            raise ctx.fail(key if isinstance(value, str) else key + (i,),
                           f"expected a module name like 'my_pkg.ops' (no ':' and no attribute), got {_show(name)}")
    return tuple(dict.fromkeys(items))


def is_module_name(text: str) -> bool:
    """'pkg' or 'pkg.mod', exactly."""
    return MODULE_RE.fullmatch(text) is not None


def _devices(value: Any, key: Key, ctx: _Ctx) -> tuple[str, ...]:
    items = value if isinstance(value, list) else [value]
    if not items or not all(isinstance(d, str) and is_device(d) for d in items):
        raise ctx.fail(key, f"expected cpu, cuda, cuda:N (or a list of these), got {_show(value)}")
    return tuple(dict.fromkeys(items))


def _dtype(value: Any, key: Key, ctx: _Ctx) -> str:
    if not isinstance(value, str) or value not in DTYPES:  # a list or mapping is unhashable
        raise ctx.fail(key, f"unknown dtype {_show(value)}; use one of {', '.join(sorted(set(DTYPES.values())))}")
    return DTYPES[value]


def whole(value: Any) -> Optional[int]:
    """An integer, also written as a whole float (``1.0``: JSON, and so the JSON Schema and editors, do
    not tell 1.0 from 1); None for anything else (a bool, a fraction, text)."""
    if isinstance(value, float) and value.is_integer():
        return int(value)
    return value if isinstance(value, int) and not isinstance(value, bool) else None


def number(value: Any, key: Key, ctx: _Ctx, positive: bool = False) -> float:
    """A YAML number; also a numeric string such as '1e-6' (YAML 1.1 reads that as text)."""
    written = value
    if isinstance(value, str) and NUMERIC_RE.fullmatch(value):
        value = float(value)
    try:
        bad = (isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value)
               or (positive and not value > 0))
    except OverflowError:  # an int too large for a float
        bad = True
    if bad:
        raise ctx.fail(key, f"expected a finite {'positive ' if positive else ''}number, got {_show(written)}")
    return float(value)


def _tolerance(value: Any, base: Tolerance, key: Key, ctx: _Ctx) -> Tolerance:
    _mapping(value, key, TOLERANCE_KEYS, ctx)
    vals: dict[str, Any] = {k: number(v, key + (k,), ctx, positive=k == "eps") for k, v in value.items()
                            if k != "reference"}
    for k, v in vals.items():
        if v < 0:
            raise ctx.fail(key + (k,), f"expected a non-negative number, got {v}")
    if "reference" in value:
        vals["reference"] = _rule(value["reference"], key + ("reference",), ctx)
    return replace(base, **vals, given=tuple(sorted(set(base.given) | set(vals))))


def _rule(value: Any, key: Key, ctx: _Ctx) -> ReferenceRule:
    """``tolerance.reference``: ``{rule: relative, factor, atol}`` or ``{rule: allclose, atol, rtol}``."""
    _mapping(value, key, tuple(dict.fromkeys(k for keys in RULES.values() for k in keys)), ctx)
    rule = value.get("rule")
    if rule is not None and rule not in RULES:
        raise ctx.fail(key + ("rule",), f"unknown rule {_show(rule)}; use relative (the target's error at most "
                                        "`factor` times the reference's own in the target's dtype) or allclose")
    for k in value:
        if rule is not None and k not in RULES[rule]:
            raise ctx.fail(key + (k,), f"`{k}` does not apply to rule {rule}; it takes {', '.join(RULES[rule][1:])}")
    nums = {k: number(v, key + (k,), ctx, positive=k == "factor") for k, v in value.items() if k != "rule"}
    for k, v in nums.items():
        if v < 0:
            raise ctx.fail(key + (k,), f"expected a non-negative number, got {v}")
    if rule is None and "factor" in nums and "rtol" in nums:
        raise ctx.fail(key, "`factor` belongs to rule relative, `rtol` to rule allclose: give `rule:` and its keys")
    rule = rule or ("relative" if "factor" in nums else "allclose" if "rtol" in nums else None)
    return ReferenceRule(rule, **nums)


def _expect(value: Any, key: Key, ctx: _Ctx) -> Expect:
    """``expect: {reason: ..., checks: [...], ARG: fail | PATTERN | {pattern: ..., ratio: ...}}``."""
    if not isinstance(value, dict):
        raise ctx.fail(key, f"expected a mapping: `reason:` and the arguments whose mismatch is intended, e.g. "
                            f"`expect: {{x: sign_flip, reason: gradient reversal}}`; got {_show(value)}")
    reason = value.get("reason")
    if not isinstance(reason, str) or not reason.strip():
        said = "missing" if "reason" not in value else "required"
        raise ctx.fail(key + ("reason",), f"{said}: say why the mismatch is intended (a sentence a reviewer "
                                          f"reads), e.g. `reason: straight-through estimator`; got {_show(reason)}")
    checks = _checks(value.get("checks", ["backward"]), key + ("checks",), ctx)
    args = tuple(_expected(str(k), v, key + (k,), ctx) for k, v in value.items() if k not in EXPECT_KEYS)
    if not args:
        raise ctx.fail(key, "names no argument: add `NAME: fail` (or a pattern such as sign_flip) for each argument "
                            "whose mismatch is intended")
    return Expect(reason.strip(), args, checks, _keystr(key), ctx.lines.get(ctx.prefix + key), "checks" in value)


def _expected(arg: str, value: Any, key: Key, ctx: _Ctx) -> Expected:
    line = ctx.lines.get(ctx.prefix + key)
    allowed = f"`fail` (any mismatch), a pattern ({', '.join(EXPECTABLE)}), or {{ratio: R}}"
    if value == "fail":
        return Expected(arg, None, None, _keystr(key), line)
    if isinstance(value, str):
        if value not in EXPECTABLE:
            raise ctx.fail(key, f"unknown expectation {_show(value)}; use {allowed}")
        return Expected(arg, value, None, _keystr(key), line)
    if not isinstance(value, dict):
        raise ctx.fail(key, f"expected {allowed}; got {_show(value)}")
    _mapping(value, key, ("pattern", "ratio"), ctx)
    pattern = value.get("pattern", "constant_ratio" if "ratio" in value else None)
    if pattern is not None and pattern not in EXPECTABLE:
        raise ctx.fail(key + ("pattern",), f"unknown pattern {_show(pattern)}; use one of {', '.join(EXPECTABLE)}")
    ratio = number(value["ratio"], key + ("ratio",), ctx) if "ratio" in value else None
    if ratio is not None and pattern not in ("constant_ratio", "sign_flip"):
        raise ctx.fail(key + ("ratio",), f"a ratio belongs to pattern constant_ratio or sign_flip, not {pattern}")
    contradiction = contradicts(pattern, ratio, value.get("ratio"))
    if contradiction:
        raise ctx.fail(key, contradiction)
    return Expected(arg, pattern, ratio, _keystr(key), line)


def contradicts(pattern: Optional[str], ratio: Optional[float], written: Any = None) -> Optional[str]:
    """Why an expectation's fields cannot all hold at once (None: they can): a sign flip is the ratio -1, and
    only the ratio patterns have a ratio."""
    if ratio is not None and pattern not in (None, "constant_ratio", "sign_flip"):
        return f"a ratio belongs to pattern constant_ratio or sign_flip, not {pattern}"
    if pattern == "sign_flip" and ratio is not None and ratio != -1:
        return (f"pattern sign_flip means ratio -1, got ratio {_show(ratio if written is None else written)}: "
                f"give the pattern or the ratio (`{{ratio: {ratio:g}}}` for a constant ratio)")
    return None


def _checks(value: Any, key: Key, ctx: _Ctx) -> tuple[str, ...]:
    if value == "all" or value == ["all"]:
        return CHECKS
    single = isinstance(value, str)
    items = [value] if single else value
    if not isinstance(items, list) or not items:
        raise ctx.fail(key, f"expected a list of check names or `all`, got {_show(value)}")
    for i, name in enumerate(items):
        if name not in CHECKS:
            raise ctx.fail(key if single else key + (i,),
                           f"unknown check {_show(name)}; known checks: {', '.join(CHECKS)}, or `all`")
    return tuple(dict.fromkeys(items))


def _arg(entry: Any, key: Key, ctx: _Ctx, name: Optional[str] = None, leaf: bool = False) -> Arg:
    """One input or kwargs entry: exactly one of shape/data, value, same_as, list, dict. ``leaf``: an
    entry inside a list or dict, named by its path (no ``name:`` of its own)."""
    if not isinstance(entry, dict):
        raise ctx.fail(key, f"expected a mapping with one of {', '.join(KINDS)}; got {_show(entry)}")
    kinds = [k for k in KINDS if k in entry]
    if not kinds:  # a typo of a kind's key (`shpe:`) says so before what is missing
        every = tuple(dict.fromkeys(TENSOR_KEYS + KINDS))
        unknown = [k for k in entry if k not in every]
        if unknown:
            raise ctx.fail(key + (unknown[0],), f"unknown key{_did_you_mean(unknown[0], every)}; an argument needs "
                                                f"exactly one of {', '.join(KINDS)}")
    if len(kinds) != 1:
        found = f"found {', '.join(kinds)}" if kinds else "found none"
        raise ctx.fail(key, f"an argument needs exactly one of {', '.join(KINDS)} ({found})")
    if "name" in entry and leaf:
        raise ctx.fail(key + ("name",), "an entry inside a list or dict is named by its place (e.g. xs[0], "
                                        "feats.q): drop `name:` here, or name the list or dict itself")
    if "name" in entry and not isinstance(entry["name"], str):
        raise ctx.fail(key + ("name",), f"expected a string, got {_show(entry['name'])}")
    name = entry.get("name", name)
    keystr = _keystr(key)
    line = ctx.lines.get(ctx.prefix + key)
    if kinds in (["list"], ["dict"]):
        return _container(entry, kinds[0], name, key, ctx)
    if kinds == ["value"]:
        _mapping(entry, key, ("name", "value"), ctx)
        value = entry["value"]
        if isinstance(value, dict) and "import" in value:  # a callable: `value: {import: pkg.mod:fn}`
            _mapping(value, key + ("value",), ("import",), ctx)
            return ValueArg(None, name, keystr, line, _function(value["import"], key + ("value", "import"), ctx))
        return ValueArg(value, name, keystr, line)
    if kinds == ["same_as"]:
        _mapping(entry, key, ("name", "same_as"), ctx)
        if not isinstance(entry["same_as"], str):
            raise ctx.fail(key + ("same_as",), f"expected the name of another argument, got {_show(entry['same_as'])}")
        return AliasArg(entry["same_as"], name, keystr, line)
    _mapping(entry, key, TENSOR_KEYS, ctx)
    return replace(_tensor(entry, name, key, keystr, ctx), line=line)


def _container(entry: dict[str, Any], kind: str, name: Optional[str], key: Key, ctx: _Ctx) -> Arg:
    """``list: [ENTRY, ...]`` or ``dict: {KEY: ENTRY, ...}``: non-empty, every item an argument entry."""
    _mapping(entry, key, ("name", kind), ctx)
    items, keystr, line = entry[kind], _keystr(key), ctx.lines.get(ctx.prefix + key)
    if kind == "list":
        if not isinstance(items, list) or not items:
            raise ctx.fail(key + ("list",), f"expected a non-empty list of argument entries, e.g. "
                                            f"`list: [{{shape: [2, 3]}}, {{shape: [4, 3]}}]`, got {_show(items)}; "
                                            "for a literal list (of numbers, or empty) write `value: [...]`")
        return ListArg(tuple(_arg(e, key + ("list", i), ctx, leaf=True) for i, e in enumerate(items)), name, keystr,
                       line)
    if not isinstance(items, dict) or not items:
        raise ctx.fail(key + ("dict",), f"expected a non-empty mapping of KEY: argument entry, e.g. "
                                        f"`dict: {{q: {{shape: [2, 3]}}, k: {{shape: [2, 3]}}}}`, got {_show(items)}; "
                                        "for a literal mapping (or an empty one) write `value: {...}`")
    return DictArg(tuple((str(k), _arg(e, key + ("dict", str(k)), ctx, leaf=True)) for k, e in items.items()), name,
                   keystr, line)


def leaves(arg: Arg, path: str = "") -> list[tuple[str, Arg]]:
    """The ordinary entries under ``arg`` (itself, when it is one), each with its path after the
    argument's name: ``''`` for the argument itself, ``[0]``, ``.q``, ``[1].k``, depth first in order."""
    if isinstance(arg, ListArg):
        return [leaf for i, item in enumerate(arg.items) for leaf in leaves(item, f"{path}[{i}]")]
    if isinstance(arg, DictArg):
        return [leaf for k, item in arg.items for leaf in leaves(item, f"{path}.{k}")]
    return [(path, arg)]


def _not_a_number(data: Any) -> list[Any]:
    """The first value in ``data`` (a number or nested lists of them) that is neither a number, a
    boolean nor a list, as a list of one; an empty list when there is none."""
    todo = [data]
    while todo:
        item = todo.pop()
        if isinstance(item, list):
            todo.extend(reversed(item))
        elif not isinstance(item, (int, float, bool)):
            return [item]
    return []


def _depth(data: Any) -> int:
    """How deep the first elements of nested lists go: the dimensions of a tensor made from ``data``."""
    depth = 0
    while isinstance(data, list):
        depth += 1
        data = data[0] if data else None
    return depth


def _tensor(entry: dict[str, Any], name: Optional[str], key: Key, keystr: str, ctx: _Ctx) -> TensorArg:
    shape = entry.get("shape")
    if "shape" in entry:
        dims = [whole(d) for d in shape] if isinstance(shape, list) else [None]
        if not all(d is not None and d >= 0 for d in dims):
            raise ctx.fail(key + ("shape",), f"expected a list of non-negative ints, got {_show(shape)}")
        shape = dims
    if shape is not None and len(shape) > MAX_DIMS:
        raise ctx.fail(key + ("shape",), f"{len(shape)} dimensions: torch tensors have at most {MAX_DIMS}")
    bad = _not_a_number(entry["data"]) if "data" in entry else []
    if bad:
        raise ctx.fail(key + ("data",), f"expected a number or a (nested) list of numbers, got {_show(bad[0])}")
    if "data" in entry and _depth(entry["data"]) > MAX_DIMS:
        raise ctx.fail(key + ("data",), f"lists nested {_depth(entry['data'])} deep: torch tensors have at most "
                                        f"{MAX_DIMS} dimensions")
    dtype = _dtype(entry["dtype"], key + ("dtype",), ctx) if "dtype" in entry else None
    dist = entry.get("dist")
    if dist is not None and (not isinstance(dist, str) or dist not in DISTS):
        raise ctx.fail(key + ("dist",), f"unknown distribution {_show(dist)}; use one of {', '.join(DISTS)}")
    if dist is not None and "data" in entry:
        raise ctx.fail(key + ("dist",), "`dist` draws values, `data` gives them: use one or the other")
    dist = dist or ("randint" if dtype and (dtype.startswith(("int", "uint")) or dtype == "bool") else "normal")
    allowed = DISTS[dist]
    for k in ("mean", "std", "low", "high", "dim"):
        if k in entry and k not in allowed:
            takes = f"it takes {', '.join(allowed)}" if allowed else "it takes no parameters"
            raise ctx.fail(key + (k,), f"`{k}` does not apply to dist {dist}; {takes}")
    _structure(dist, shape, dtype, entry, key, ctx)
    size_of = tuple(_size_of(k, entry[k], dist, key + (k,), ctx) for k in ("low", "high")
                    if isinstance(entry.get(k), dict))
    params = {k: number(entry[k], key + (k,), ctx) for k in allowed
              if k in entry and k != "dim" and not isinstance(entry[k], dict)}
    if dist == "normal":
        params = {**DIST_DEFAULTS, **params}
        if params["std"] < 0:
            raise ctx.fail(key + ("std",), "expected a non-negative number")
    elif dist in BOUNDS:
        low, high = BOUNDS[dist]
        params = {"low": params.get("low", low), "high": params.get("high", high)}
        if dist == "positive" and params["low"] <= 0:
            raise ctx.fail(key + ("low",), f"dist positive draws values above low: expected low > 0, "
                                           f"got {_show(entry.get('low', params['low']))}")
    elif dist == "randint":
        params = {"low": params.get("low", 0.0), "high": params.get("high", 2.0 if dtype == "bool" else 10.0)}
        for k, v in params.items():
            if k in entry and isinstance(entry[k], dict):
                continue
            if not (v.is_integer() and -2 ** 63 <= v < 2 ** 63):
                raise ctx.fail(key + (k,), "randint draws integers: expected a whole number within int64, "
                                           f"got {_show(entry[k])}")
    if not size_of and params.get("low", 0) >= params.get("high", 1):
        raise ctx.fail(key + ("high",), f"expected high > low, got low={params['low']}, high={params['high']}")
    if entry.get("avoid") and dist in SET_DISTS:  # an empty list avoids nothing
        raise ctx.fail(key + ("avoid",), f"`avoid` redraws single values, which would leave the set dist {dist} "
                                         "draws from: drop it")
    param = _function(entry["param"], key + ("param",), ctx) if entry.get("param") is not None else None
    avoid = entry.get("avoid", [])
    if not isinstance(avoid, list) or not all(
        isinstance(iv, list) and len(iv) == 2 and all(isinstance(x, (int, float, str)) for x in iv) for iv in avoid
    ):
        raise ctx.fail(key + ("avoid",), f"expected a list of [lo, hi] intervals, got {_show(avoid)}")
    intervals = tuple(
        (number(lo, key + ("avoid", i, 0), ctx), number(hi, key + ("avoid", i, 1), ctx))
        for i, (lo, hi) in enumerate(avoid)
    )
    if any(lo > hi for lo, hi in intervals):
        raise ctx.fail(key + ("avoid",), "each interval must be [lo, hi] with lo <= hi")
    rg = entry.get("requires_grad")
    if rg is not None and not isinstance(rg, bool):
        raise ctx.fail(key + ("requires_grad",), f"expected true or false, got {_show(rg)}")
    return TensorArg(
        name=name, shape=tuple(shape) if shape is not None else None, data=entry.get("data"), dtype=dtype,
        dist=None if "data" in entry else dist, params=tuple(params.items()), avoid=intervals,
        requires_grad=rg, key=keystr, dim=_dim(entry, shape, key, ctx), size_of=size_of, param=param,
    )


def _structure(dist: str, shape: Optional[list[int]], dtype: Optional[str], entry: dict[str, Any], key: Key,
               ctx: _Ctx) -> None:
    """What a structured dist asks of the shape and dtype: a (batch of) matrices, a real dtype."""
    if dist not in SET_DISTS + ("positive",):
        return
    if dtype is not None and dtype.startswith("complex"):
        raise ctx.fail(key + ("dtype",), f"dist {dist} draws real tensors; use a floating dtype")
    if dist != "permutation" and dtype is not None and not dtype.startswith(("float", "bfloat")):
        raise ctx.fail(key + ("dtype",), f"dist {dist} draws floating-point values; use a floating dtype "
                                         "(randint or permutation draw integers)")
    if dist in MATRIX_DISTS and shape is not None:
        if len(shape) < 2:
            raise ctx.fail(key + ("shape",), f"dist {dist} draws matrices: expected at least 2 dimensions "
                                             f"(..., n, n), got {shape}")
        if dist != "orthogonal" and shape[-1] != shape[-2]:
            raise ctx.fail(key + ("shape",), f"dist {dist} draws square matrices: the last two dimensions must "
                                             f"be equal, got {shape}")


def _dim(entry: dict[str, Any], shape: Optional[list[int]], key: Key, ctx: _Ctx) -> int:
    """``dim`` of simplex, sorted and permutation: an int within the shape's dimensions (default -1)."""
    dim = entry.get("dim", -1)
    n = len(shape) if shape is not None else None
    if not isinstance(dim, int) or isinstance(dim, bool) or (n is not None and not -max(n, 1) <= dim < max(n, 1)):
        within = f" within shape {shape}" if n is not None else ""
        raise ctx.fail(key + ("dim",), f"expected a dimension (an int{within}, negative counts from the end), "
                                       f"got {_show(dim)}")
    return dim


def _size_of(bound: str, value: dict[str, Any], dist: str, key: Key, ctx: _Ctx) -> tuple[str, str, int]:
    """``high: {size_of: NAME, dim: D}``: the bound is the size of argument NAME along D (default 0)."""
    if dist != "randint":
        raise ctx.fail(key, f"a bound tied to another argument's size is for dist randint (indices), not {dist}")
    _mapping(value, key, ("size_of", "dim"), ctx)
    other, dim = value.get("size_of"), value.get("dim", 0)
    if not isinstance(other, str) or not other:
        raise ctx.fail(key + ("size_of",), f"expected the name of another argument, got {_show(other)}")
    if not isinstance(dim, int) or isinstance(dim, bool):
        raise ctx.fail(key + ("dim",), f"expected a dimension of '{other}' (an int), got {_show(dim)}")
    return bound, other, dim
