"""The spec's vocabulary and its data: the keys, dtypes and distributions a spec may use (read from the
JSON Schema by ``vocabulary``, named here), SpecError, and the frozen dataclasses a document becomes
(Case and its arguments, tolerances and expectations).

Pure data: no YAML and no validation here (``lines`` reads the YAML, ``arguments`` and ``document``
validate it)."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Optional, Union

from ..core.tolerance import Tolerance
from .vocabulary import DEFS, alternatives, enum, keys, owned, prop, required

_DTYPE, _DIST, _RULE = DEFS["dtype"], prop("tensor", "dist"), prop("reference_rule", "rule")
DTYPES = {name: _DTYPE["x-canonical"].get(name, name) for name in enum(_DTYPE)}  # name or alias -> the dtype
DISTS = {dist: tuple(_DIST["x-parameters"][dist]) for dist in enum(_DIST)}  # dist -> the keys it takes
DIST_DEFAULTS = {"mean": 0.0, "std": 1.0}
BOUNDS = {"uniform": (0.0, 1.0), "sorted": (0.0, 1.0), "positive": (0.1, 10.0)}  # default (low, high); randint's below
MATRIX_DISTS = ("symmetric", "spd", "orthogonal")  # the last two dimensions are a matrix
SET_DISTS = MATRIX_DISTS + ("simplex", "sorted", "permutation")  # a set: `avoid` (redrawing values) would leave it
SYMMETRIC_DISTS = ("symmetric", "spd")  # perturbed along the set: the check differentiates f(sym(X)), sym = (X + X^T)/2
MAX_DIMS: int = prop("tensor", "shape")["maxItems"]  # dimensions of a torch tensor, at most
TOP_KEYS = keys()
CASE_KEYS = keys("case")
KINDS = tuple(k for alternative in alternatives("argument") for k in required(alternative))  # exactly one of these
TENSOR_KEYS = keys("tensor")
DIST_KEYS = tuple(k for k in TENSOR_KEYS if any(k in taken for taken in DISTS.values()))  # the dists' parameters
VALUE_KEYS, ALIAS_KEYS, SIZE_OF_KEYS = keys("value"), keys("same_as"), keys("size_of")
IMPORT_KEYS = keys("value_import")  # `value: {import: pkg.mod:fn}`
CONTAINER_KEYS = {kind: keys(kind) for kind in ("list", "dict")}  # `list:` and `dict:` entries
TOLERANCE_KEYS = keys("tolerance")
RULES = {rule: tuple(_RULE["x-keys"][rule]) for rule in enum(_RULE)}  # tolerance.reference: its keys
REFERENCE_DTYPES = tuple(dict.fromkeys(DTYPES[n] for n in enum(DEFS["reference_dtype"])))  # complex: its complex kind
INIT_KEYS = keys("init")  # init: constructor arguments, and train | eval
INIT_MODES = enum(prop("init", "mode"))  # init.mode: module.train() / module.eval() before checking
OWNED = owned()  # the keys a check owns (`repeat`, `compile`): key -> (check, schema); see ``settings``
EXPECT_KEYS = keys("expect")  # the other keys of `expect` are argument names
EXPECTED_KEYS = keys("expected")  # an argument's expectation written as a mapping
CHECKS = enum(DEFS["check_name"])  # `checks: all` runs them in this order (the registry's, which a test compares)
Key = tuple[Union[str, int], ...]  # a key path into a document: mapping keys and list positions


class SpecError(Exception):
    """A spec that cannot be used. The message names file, line and key path."""

    def __init__(self, path: str, key: str, message: str, line: Optional[int] = None) -> None:
        self.path, self.key, self.line = path, key, line
        where = f"{path}:{line}" if line else path
        super().__init__(f"{where}: {key}: {message}" if key else f"{where}: {message}")


@dataclass(frozen=True)
class Sparse:
    """A sparse input's layout and its specified elements: ``indices`` (each an index into the dense shape),
    or ``density`` (a fraction drawn from the input's stream), or neither (``data``'s non-zero elements)."""

    layout: str  # sparse_coo | sparse_csr
    density: Optional[float] = None
    indices: Optional[tuple[tuple[int, ...], ...]] = None
    masked: bool = True  # only the specified elements are variables (torch's masked=True)


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
    contiguous: bool = True  # False: the tensor reaches the target non-contiguous (checks.noncontiguous.relaid)
    key: str = ""  # key path in the spec, for messages
    line: Optional[int] = None
    dim: int = -1  # simplex, sorted, permutation: along this dimension
    size_of: tuple[tuple[str, str, int], ...] = ()  # (low | high, argument, dim): a bound that is that size
    param: Optional[str] = None  # import path of fn: the target gets fn(X), the check perturbs X
    placement: Optional[str] = None  # under `distributed`: replicate (None), shard(d) or per_rank
    sparse: Optional[Sparse] = None  # `layout: sparse_coo | sparse_csr`: the tensor reaches the target sparse
    lines: tuple[tuple[str, int], ...] = field(default=(), compare=False)  # each key of the entry: its line

    def line_of(self, key: str) -> Optional[int]:
        """The line of the entry's key ``key`` (``placement``) where it is written, else the entry's."""
        return dict(self.lines).get(key, self.line)

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
class Distributed:
    """``distributed:``: how many ranks, the backend (None: gloo on the CPU, nccl on CUDA) and the
    seconds without progress on any rank after which every rank is ended."""

    world_size: int
    backend: Optional[str] = None
    timeout: float = 60.0


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
    resample: bool = False  # draw again (next seed) when an input sits on a kink or domain edge
    inputs: tuple[Arg, ...] = ()
    kwargs: tuple[tuple[str, Arg], ...] = ()
    init_args: tuple[Any, ...] = ()
    init_kwargs: tuple[tuple[str, Any], ...] = ()
    init_mode: Optional[str] = None  # `init.mode`: train | eval (None: as the constructor leaves it)
    clone_inputs: bool = False  # call the target on copies of its tensor arguments (an in-place Function)
    settings: tuple[tuple[str, Any], ...] = ()  # the keys checks own (OWNED), as written and checked
    reference: Optional[str] = None  # import path of a reference implementation
    reference_dtype: str = "float64"  # the reference runs on copies of the inputs in this dtype
    reference_backward: Optional[str] = None  # import path of fn(inputs, grad_outputs) -> the intended gradients
    expect: Optional[Expect] = None
    distributed: Optional[Distributed] = None  # `distributed:`: run on several ranks
    outputs: tuple[str, ...] = ()  # under `distributed`: each output's placement (none given: replicate)
    line: Optional[int] = None
    doc: int = 1  # 1-based document number within the file
    n_docs: int = 1

    @property
    def name(self) -> str:
        """Stable id stem: ``path::label``, with ``#doc`` when the file holds several documents."""
        doc = f"#{self.doc}" if self.n_docs > 1 else ""
        return f"{self.path}{doc}::{self.label}"

    def setting(self, key: str) -> Any:
        """The value of ``key``, a key a check owns, as the spec wrote it (a mapping frozen as (key, value)
        pairs), or None where the spec does not give it."""
        return dict(self.settings).get(key)


def leaves(arg: Arg, path: str = "") -> list[tuple[str, Arg]]:
    """The ordinary entries under ``arg`` (itself, when it is one), each with its path after the
    argument's name: ``''`` for the argument itself, ``[0]``, ``.q``, ``[1].k``, depth first in order."""
    if isinstance(arg, ListArg):
        return [leaf for i, item in enumerate(arg.items) for leaf in leaves(item, f"{path}[{i}]")]
    if isinstance(arg, DictArg):
        return [leaf for k, item in arg.items for leaf in leaves(item, f"{path}.{k}")]
    return [(path, arg)]
