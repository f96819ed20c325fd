"""The spec's vocabulary and its data: the keys, dtypes and distributions a spec may use, SpecError,
and the frozen dataclasses a document becomes (Case and its arguments, tolerances and expectations).

Pure data: no YAML and no validation here (``lines`` reads the YAML, ``arguments`` and ``document``
validate it)."""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Optional, Union

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


def leaves(arg: Arg, path: str = "") -> list[tuple[str, Arg]]:
    """The ordinary entries under ``arg`` (itself, when it is one), each with its path after the
    argument's name: ``''`` for the argument itself, ``[0]``, ``.q``, ``[1].k``, depth first in order."""
    if isinstance(arg, ListArg):
        return [leaf for i, item in enumerate(arg.items) for leaf in leaves(item, f"{path}[{i}]")]
    if isinstance(arg, DictArg):
        return [leaf for k, item in arg.items for leaf in leaves(item, f"{path}.{k}")]
    return [(path, arg)]
