"""Spec files: YAML -> frozen dataclasses, with strict validation.

Every error names the file, the line where known, and the key path, and says what is allowed.
Only ``yaml.SafeLoader`` is used. A file may hold several documents; one broken document is
one error and the others are still read.

The package, bottom up: ``model`` (the keys, SpecError and the dataclasses), ``lines`` (YAML ->
documents with each key path's line), ``values`` (one value read and checked), ``arguments`` (argument
entries), ``settings`` (the keys a check owns), ``document`` (a document and its cases); here
``load_file``, and every public name.
"""

from __future__ import annotations

from pathlib import Path
from typing import Union

from ..core.tolerance import ReferenceRule, Tolerance
from ..results import EXPECTABLE
from .arguments import argument, parse_argument
from .document import parse_document
from .lines import MAX_NODES, MERGE_TAG, Ctx, documents, keystr
from .model import (
    BOUNDS,
    CASE_KEYS,
    CHECKS,
    DIST_DEFAULTS,
    DISTS,
    DTYPES,
    EXPECT_KEYS,
    INIT_KEYS,
    INIT_MODES,
    KINDS,
    MATRIX_DISTS,
    MAX_DIMS,
    OWNED,
    REFERENCE_DTYPES,
    RULES,
    SET_DISTS,
    SYMMETRIC_DISTS,
    TENSOR_KEYS,
    TOLERANCE_KEYS,
    TOP_KEYS,
    AliasArg,
    Arg,
    Case,
    Container,
    DictArg,
    Distributed,
    Expect,
    Expected,
    Key,
    ListArg,
    Sparse,
    SpecError,
    TensorArg,
    ValueArg,
    leaves,
)
from .rules import contradicts
from .values import (
    DEVICE_RE,
    FILE_TARGET_RE,
    FUNCTION_RE,
    MODULE_RE,
    NUMERIC_RE,
    file_target,
    is_device,
    is_import_path,
    is_module_name,
    number,
    whole,
)

__all__ = [
    "BOUNDS",
    "CASE_KEYS",
    "CHECKS",
    "DEVICE_RE",
    "DISTS",
    "DIST_DEFAULTS",
    "DTYPES",
    "EXPECTABLE",
    "EXPECT_KEYS",
    "FILE_TARGET_RE",
    "FUNCTION_RE",
    "INIT_KEYS",
    "INIT_MODES",
    "KINDS",
    "MATRIX_DISTS",
    "MAX_DIMS",
    "MAX_NODES",
    "OWNED",
    "MERGE_TAG",
    "MODULE_RE",
    "NUMERIC_RE",
    "REFERENCE_DTYPES",
    "RULES",
    "SET_DISTS",
    "SYMMETRIC_DISTS",
    "TENSOR_KEYS",
    "TOLERANCE_KEYS",
    "TOP_KEYS",
    "AliasArg",
    "Arg",
    "Case",
    "Container",
    "Ctx",
    "DictArg",
    "Distributed",
    "Expect",
    "Expected",
    "Key",
    "ListArg",
    "ReferenceRule",
    "Sparse",
    "SpecError",
    "TensorArg",
    "Tolerance",
    "ValueArg",
    "argument",
    "contradicts",
    "file_target",
    "is_device",
    "is_import_path",
    "is_module_name",
    "keystr",
    "leaves",
    "load_file",
    "number",
    "parse_argument",
    "parse_document",
    "whole",
]


def load_file(path: Union[str, Path]) -> list[Union[Case, SpecError]]:
    """Read a spec file: a list with one entry per case, or a SpecError per unusable document."""
    path = str(path)
    try:
        text = Path(path).read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as exc:
        return [SpecError(path, "", f"cannot read the file: {exc}")]
    docs, syntax_error = documents(text, path)
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
