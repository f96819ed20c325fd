"""The spec's vocabulary, read from the JSON Schema (``schemas/spec.schema.json``), the one place it is
written: the keys of each mapping, the names each enum allows and the annotations the schema keeps for
the loader (``x-canonical``: the dtype an alias stands for; ``x-parameters``: the keys each dist takes;
``x-keys``: the keys each reference rule takes). Loaded once, when the spec package is imported.

The loader checks what a document holds against these names and says what is wrong in its own words;
the schema's other rules (types, ranges, patterns) are kept in step with the loader by tests."""

from __future__ import annotations

from typing import Any

from .. import schemas

SCHEMA: dict[str, Any] = schemas.load("spec")
DEFS: dict[str, Any] = SCHEMA["$defs"]


def keys(name: str = "") -> tuple[str, ...]:
    """The keys mapping ``name`` (a ``$defs`` entry; ``''``: a document) may hold, in the schema's order
    (the order messages list them in)."""
    return tuple((DEFS[name] if name else SCHEMA)["properties"])


def prop(name: str, key: str) -> dict[str, Any]:
    """The schema of key ``key`` of mapping ``name`` (a ``$defs`` entry)."""
    schema: dict[str, Any] = DEFS[name]["properties"][key]
    return schema


def enum(schema: dict[str, Any]) -> tuple[Any, ...]:
    """The names an ``enum`` allows, in order, without ``null`` (which means "not given")."""
    return tuple(v for v in schema["enum"] if v is not None)


def required(name: str) -> tuple[str, ...]:
    """The key that makes an entry of ``name`` (a ``$defs`` entry) that kind: its ``required`` keys, or
    those of each alternative of its ``oneOf`` (a tensor: ``shape`` or ``data``)."""
    schema = DEFS[name]
    if "required" in schema:
        return tuple(schema["required"])
    return tuple(k for alternative in schema["oneOf"] for k in alternative["required"])


def alternatives(name: str) -> tuple[str, ...]:
    """The ``$defs`` entries that ``name``'s ``oneOf`` refers to (an argument: tensor, value, ...)."""
    return tuple(alternative["$ref"].rpartition("/")[2] for alternative in DEFS[name]["oneOf"])


def resolve(schema: dict[str, Any]) -> dict[str, Any]:
    """``schema`` with its ``$ref`` (into ``$defs``) followed."""
    while "$ref" in schema:
        schema = DEFS[schema["$ref"].rpartition("/")[2]]
    return schema


def owned(name: str = "") -> dict[str, tuple[str, dict[str, Any]]]:
    """The keys of mapping ``name`` (a ``$defs`` entry; ``''``: a document) that a check owns, each with
    that check's name and the key's schema: those whose schema entry says ``x-check``."""
    properties = (DEFS[name] if name else SCHEMA)["properties"]
    return {k: (resolve(s)["x-check"], s) for k, s in properties.items() if "x-check" in resolve(s)}
