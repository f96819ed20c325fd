"""The keys a check owns: a key whose schema entry says ``x-check: NAME`` (``repeat``: backward's,
``compile``: the compile check's) is read here from that entry alone, so a new check's key needs its
schema entry and no code in this package. The case keeps the value as written, checked and frozen
(``Case.settings``); the check reads it from its context and builds its own settings from it.

The schema forms a check's key may use: an object of known keys (``additionalProperties: false``), an
integer with ``minimum``/``maximum``, an ``enum``, a boolean, a non-negative number (``$ref:
non_negative``), each of them optional with ``null``; ``x-hint`` is the few words a message adds to say
what the value is for. ``tests/unit/test_spec_settings.py`` holds every owned key to these forms."""

from __future__ import annotations

from typing import Any

from .lines import Ctx
from .model import Key
from .values import mapping, number, show, whole
from .vocabulary import DEFS, resolve

Frozen = Any  # a setting's value: None, a bool, an int, a float, a str, or a tuple of (key, Frozen) pairs


def optional(schema: dict[str, Any]) -> tuple[dict[str, Any], bool]:
    """The form a value takes, and whether ``null`` is allowed (``anyOf: [FORM, {type: null}]`` or
    ``type: [FORM, null]``)."""
    schema = resolve(schema)
    if "anyOf" in schema:
        forms = [resolve(s) for s in schema["anyOf"] if s.get("type") != "null"]
        return (forms[0] if len(forms) == 1 else schema), len(forms) < len(schema["anyOf"])
    kind = schema.get("type")
    if isinstance(kind, list) and "null" in kind:
        rest = [k for k in kind if k != "null"]
        return {**schema, "type": rest[0] if len(rest) == 1 else rest}, True
    return schema, False


def setting(value: Any, schema: dict[str, Any], key: Key, ctx: Ctx) -> Frozen:
    """``value`` checked against ``schema`` (a check's key, or a key inside it): the value, with a
    mapping frozen as a tuple of (key, value) pairs in the order written; a spec error naming the key
    and what is allowed otherwise."""
    form, nullable = optional(schema)
    if value is None and nullable:
        return None
    hint = f" ({form['x-hint']})" if "x-hint" in form else ""
    if form is DEFS["non_negative"]:
        amount = number(value, key, ctx)
        if amount < 0:
            raise ctx.fail(key, f"expected a non-negative number, got {show(value)}")
        return amount
    if "enum" in form:
        allowed = [v for v in form["enum"] if v is not None]
        if not isinstance(value, (str, int, float)) or isinstance(value, bool) or value not in allowed:
            raise ctx.fail(key, f"expected one of {', '.join(map(str, allowed))}{hint}, got {show(value)}")
        return value
    kind = form.get("type")
    if kind == "object":
        properties = form["properties"]
        mapping(value, key, tuple(properties), ctx)
        return tuple((str(k), setting(v, properties[k], key + (k,), ctx)) for k, v in value.items())
    if kind == "integer":
        low, high = form.get("minimum"), form.get("maximum")
        found = whole(value)
        if found is None or (low is not None and found < low) or (high is not None and found > high):
            raise ctx.fail(key, f"expected an integer from {low} to {high}{hint}, got {show(value)}")
        return found
    if kind == "boolean":
        if not isinstance(value, bool):
            raise ctx.fail(key, f"expected true or false{hint}, got {show(value)}")
        return value
    raise NotImplementedError(f"schema form of a check's key at {key}: {form}")  # a test keeps this unreachable


def thawed(value: Frozen) -> Any:
    """A setting as the check reads it: a frozen mapping as a dict again (None: the key was not given)."""
    if isinstance(value, tuple):
        return {k: thawed(v) for k, v in value}
    return value
