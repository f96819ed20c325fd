"""One document -> its cases: the top-level keys, the case entries and what each overrides, and the
keys' values (tolerance and its reference rule, checks, init, expect); the keys a check owns are read
by ``settings``."""

from __future__ import annotations

from dataclasses import replace
from typing import Any

from ..core.rng import SEEDS
from ..core.tolerance import ReferenceRule, Tolerance
from ..results import EXPECTABLE
from .arguments import argument
from .distributed import consistent, distributed, outputs
from .lines import Ctx, keystr
from .model import (
    CASE_KEYS,
    CHECKS,
    EXPECT_KEYS,
    EXPECTED_KEYS,
    INIT_KEYS,
    INIT_MODES,
    OWNED,
    REFERENCE_DTYPES,
    RULES,
    TOLERANCE_KEYS,
    TOP_KEYS,
    Arg,
    Case,
    Expect,
    Expected,
    Key,
)
from .rules import contradicts, name_taken
from .settings import setting
from .values import devices, dtype_of, import_path, mapping, module_names, number, show, whole


def parse_document(doc: Any, ctx: Ctx, doc_index: int = 1, n_docs: int = 1) -> list[Case]:
    """Validate one YAML document and expand its cases."""
    mapping(doc, (), TOP_KEYS, ctx)
    if "function" not in doc:
        raise ctx.fail(("function",), "missing; name the Function to check, e.g. `function: pkg.mod:MyFunction`")
    base = Case(path=ctx.path, label="default", function="", line=ctx.lines.get(()), doc=doc_index, n_docs=n_docs)
    base = _apply(base, doc, (), ctx)
    cases = doc.get("cases")
    if cases is None:
        return [consistent(_default_checks(base), ctx, ())]
    if not isinstance(cases, list) or not cases:
        raise ctx.fail(("cases",), f"expected a non-empty list of cases, got {show(cases)}")
    out: list[Case] = []
    names: set[str] = set()
    for i, entry in enumerate(cases):
        mapping(entry, ("cases", i), CASE_KEYS, ctx)
        name = entry.get("name", f"case{i}")
        name = name if isinstance(name, str) else whole(name)
        if "name" not in entry and name_taken(name, names):
            raise ctx.fail(
                ("cases", i), f"its default name {name!r} is taken by another case; give it a unique `name:`"
            )
        if name is None or name_taken(name, names):
            raise ctx.fail(("cases", i, "name"), f"expected a unique name, got {show(entry['name'])}")
        names.add(str(name))
        case = replace(base, label=str(name), line=ctx.lines.get(("cases", i)))
        where = ("cases", i) if "outputs" in entry else ()  # where the case's `outputs` was written
        out.append(consistent(_default_checks(_apply(case, entry, ("cases", i), ctx)), ctx, where))
    return out


def _default_checks(case: Case) -> Case:
    """Without `checks`: the reference check where the spec gives a reference (the oracle it chose;
    finite differences on request), else backward."""
    if case.checks_given or not (case.reference or case.reference_backward):
        return case
    return replace(case, checks=("reference",))


def _apply(case: Case, doc: dict[str, Any], key: Key, ctx: Ctx) -> Case:
    """Return ``case`` with the keys present in ``doc`` (a document or a case entry) applied."""
    changes: dict[str, Any] = {}
    if "function" in doc:
        changes["function"] = import_path(doc["function"], key + ("function",), ctx)
    if "import" in doc:
        changes["imports"] = module_names(doc["import"], key + ("import",), ctx)
    if "description" in doc:
        if isinstance(doc["description"], (list, dict)):
            raise ctx.fail(key + ("description",), f"expected text, got {show(doc['description'])}")
        changes["description"] = str(doc["description"] or "")
    if "seed" in doc:
        seed = whole(doc["seed"])
        if seed is None or not 0 <= seed < SEEDS:
            raise ctx.fail(key + ("seed",), f"expected a non-negative integer below 2**64, got {show(doc['seed'])}")
        changes["seed"] = seed
    if "device" in doc:
        changes["devices"] = devices(doc["device"], key + ("device",), ctx)
    if "dtype" in doc:
        changes["dtype"] = dtype_of(doc["dtype"], key + ("dtype",), ctx)
    if "tolerance" in doc:
        changes["tolerance"] = _tolerance(doc["tolerance"], case.tolerance, key + ("tolerance",), ctx)
    if "strict" in doc:
        if not isinstance(doc["strict"], bool):
            raise ctx.fail(
                key + ("strict",),
                f"expected true or false (fail a systematic factor within tolerance), got {show(doc['strict'])}",
            )
        changes["tolerance"] = replace(changes.get("tolerance", case.tolerance), strict=doc["strict"])
    if "checks" in doc:
        changes["checks"] = _checks(doc["checks"], key + ("checks",), ctx)
        changes["checks_given"] = True
        changes["all_checks"] = doc["checks"] in ("all", ["all"])
        changes["spec_checks"] = () if changes["all_checks"] else changes["checks"]
    if "resample" in doc:
        if not isinstance(doc["resample"], bool):
            raise ctx.fail(key + ("resample",), f"expected true or false, got {show(doc['resample'])}")
        changes["resample"] = doc["resample"]
    if "inputs" in doc:
        entries = doc["inputs"]
        if isinstance(entries, dict) and key:  # a case: override the document's arguments by name
            changes["inputs"] = _override(case.inputs, entries, key + ("inputs",), ctx)
        elif not isinstance(entries, list):
            also = " (or, in a case, a mapping NAME: entry that replaces the named ones)" if key else ""
            raise ctx.fail(key + ("inputs",), f"expected a list of argument entries{also}, got {show(entries)}")
        else:
            changes["inputs"] = tuple(argument(e, key + ("inputs", i), ctx) for i, e in enumerate(entries))
    if "kwargs" in doc:
        kw = {} if doc["kwargs"] is None else doc["kwargs"]
        if not isinstance(kw, dict):
            raise ctx.fail(key + ("kwargs",), f"expected a mapping of name -> argument entry, got {show(kw)}")
        changes["kwargs"] = tuple((str(k), argument(v, key + ("kwargs", k), ctx, name=str(k))) for k, v in kw.items())
    if "init" in doc:
        init = {} if doc["init"] is None else doc["init"]
        mapping(init, key + ("init",), INIT_KEYS, ctx)
        mode = init.get("mode")
        if mode is not None and mode not in INIT_MODES:
            raise ctx.fail(
                key + ("init", "mode"),
                f"expected train or eval (module.train() / module.eval() before checking), got {show(mode)}",
            )
        changes["init_mode"] = mode
        args, kwargs = init.get("args"), init.get("kwargs")
        args, kwargs = [] if args is None else args, {} if kwargs is None else kwargs
        if not isinstance(args, list):
            raise ctx.fail(key + ("init", "args"), f"expected a list, got {show(args)}")
        if not isinstance(kwargs, dict):
            raise ctx.fail(key + ("init", "kwargs"), f"expected a mapping, got {show(kwargs)}")
        changes["init_args"], changes["init_kwargs"] = tuple(args), tuple((str(k), v) for k, v in kwargs.items())
    if "clone_inputs" in doc:
        if not isinstance(doc["clone_inputs"], bool):
            raise ctx.fail(
                key + ("clone_inputs",),
                f"expected true or false (call the target on copies of its tensor "
                f"arguments), got {show(doc['clone_inputs'])}",
            )
        changes["clone_inputs"] = doc["clone_inputs"]
    owned = {k: setting(doc[k], OWNED[k][1], key + (k,), ctx) for k in OWNED if k in doc}
    if owned:
        changes["settings"] = tuple({**dict(case.settings), **owned}.items())
    for name in ("reference", "reference_backward"):
        if name in doc:
            changes[name] = None if doc[name] is None else import_path(doc[name], key + (name,), ctx)
    if "reference_dtype" in doc:
        dtype = dtype_of(doc["reference_dtype"], key + ("reference_dtype",), ctx)
        if dtype not in REFERENCE_DTYPES:
            raise ctx.fail(
                key + ("reference_dtype",),
                f"expected a floating dtype ({', '.join(REFERENCE_DTYPES)}), "
                f"got {dtype}; complex inputs take its complex kind",
            )
        changes["reference_dtype"] = dtype
    if "expect" in doc:
        changes["expect"] = None if doc["expect"] is None else _expect(doc["expect"], key + ("expect",), ctx)
    if "distributed" in doc:
        changes["distributed"] = distributed(doc["distributed"], key + ("distributed",), ctx)
    if "outputs" in doc:
        changes["outputs"] = outputs(doc["outputs"], key + ("outputs",), ctx)
    return replace(case, **changes)


def _override(inputs: tuple[Arg, ...], entries: dict[Any, Any], key: Key, ctx: Ctx) -> tuple[Arg, ...]:
    """A case's ``inputs: {NAME: entry}``: the document's ``inputs`` with the arguments named NAME
    (by their ``name:``) replaced by the case's entries, in place; the others are kept."""
    named = [a.name for a in inputs]
    out = list(inputs)
    if entries and not inputs:  # the document's list is what a mapping overrides
        raise ctx.fail(
            key[:-3] + ("inputs",),
            f"missing (or empty): {keystr(key)} overrides arguments by name, "
            "which needs the document's `inputs:` list; give the document one, "
            "or give the case a list",
        )
    for raw, entry in entries.items():
        name = str(raw)  # the key path as written (`0:` is a name here, not a position)
        if name not in named:
            known = ", ".join(n for n in named if n) or "none"
            unnamed = sum(n is None for n in named)
            hint = (
                f"; {unnamed} of them {'has' if unnamed == 1 else 'have'} no `name:` (give it one there to "
                "override it by name)"
                if unnamed
                else ""
            )
            raise ctx.fail(
                key + (name,), f"no argument named {name!r} in the document's inputs; the arguments are {known}{hint}"
            )
        if isinstance(entry, dict) and "name" in entry and entry["name"] != name:
            raise ctx.fail(key + (name, "name"), f"the key names the argument ({name!r}): drop `name:` here")
        out[named.index(name)] = argument(entry, key + (name,), ctx, name=name)
    return tuple(out)


def _tolerance(value: Any, base: Tolerance, key: Key, ctx: Ctx) -> Tolerance:
    mapping(value, key, TOLERANCE_KEYS, ctx)
    vals: dict[str, Any] = {
        k: number(v, key + (k,), ctx, positive=k == "eps") for k, v in value.items() if k != "reference"
    }
    for k, v in vals.items():
        if v < 0:
            raise ctx.fail(key + (k,), f"expected a non-negative number, got {v}")
    if "reference" in value:
        vals["reference"] = _rule(value["reference"], key + ("reference",), ctx)
    return replace(base, **vals, given=tuple(sorted(set(base.given) | set(vals))))


def _rule(value: Any, key: Key, ctx: Ctx) -> ReferenceRule:
    """``tolerance.reference``: ``{rule: relative, factor, atol}`` or ``{rule: allclose, atol, rtol}``."""
    mapping(value, key, tuple(dict.fromkeys(k for keys in RULES.values() for k in keys)), ctx)
    rule = value.get("rule")
    if rule is not None and (not isinstance(rule, str) or rule not in RULES):  # a list or mapping is unhashable
        raise ctx.fail(
            key + ("rule",),
            f"unknown rule {show(rule)}; use relative (the target's error at most "
            "`factor` times the reference's own in the target's dtype) or allclose",
        )
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


def _expect(value: Any, key: Key, ctx: Ctx) -> Expect:
    """``expect: {reason: ..., checks: [...], ARG: fail | PATTERN | {pattern: ..., ratio: ...}}``."""
    if not isinstance(value, dict):
        raise ctx.fail(
            key,
            f"expected a mapping: `reason:` and the arguments whose mismatch is intended, e.g. "
            f"`expect: {{x: sign_flip, reason: gradient reversal}}`; got {show(value)}",
        )
    reason = value.get("reason")
    if not isinstance(reason, str) or not reason.strip():
        said = "missing" if "reason" not in value else "required"
        raise ctx.fail(
            key + ("reason",),
            f"{said}: say why the mismatch is intended (a sentence a reviewer "
            f"reads), e.g. `reason: straight-through estimator`; got {show(reason)}",
        )
    checks = _checks(value.get("checks", ["backward"]), key + ("checks",), ctx)
    args = tuple(_expected(str(k), v, key + (k,), ctx) for k, v in value.items() if k not in EXPECT_KEYS)
    if not args:
        raise ctx.fail(
            key,
            "names no argument: add `NAME: fail` (or a pattern such as sign_flip) for each argument "
            "whose mismatch is intended",
        )
    return Expect(reason.strip(), args, checks, keystr(key), ctx.lines.get(ctx.prefix + key), "checks" in value)


def _expected(arg: str, value: Any, key: Key, ctx: Ctx) -> Expected:
    line = ctx.lines.get(ctx.prefix + key)
    allowed = f"`fail` (any mismatch), a pattern ({', '.join(EXPECTABLE)}), or {{ratio: R}}"
    if value == "fail":
        return Expected(arg, None, None, keystr(key), line)
    if isinstance(value, str):
        if value not in EXPECTABLE:
            raise ctx.fail(key, f"unknown expectation {show(value)}; use {allowed}")
        return Expected(arg, value, None, keystr(key), line)
    if not isinstance(value, dict):
        raise ctx.fail(key, f"expected {allowed}; got {show(value)}")
    mapping(value, key, EXPECTED_KEYS, ctx)
    pattern = value.get("pattern", "constant_ratio" if "ratio" in value else None)
    if pattern is not None and pattern not in EXPECTABLE:
        raise ctx.fail(key + ("pattern",), f"unknown pattern {show(pattern)}; use one of {', '.join(EXPECTABLE)}")
    ratio = number(value["ratio"], key + ("ratio",), ctx) if "ratio" in value else None
    if ratio is not None and pattern not in ("constant_ratio", "sign_flip"):
        raise ctx.fail(key + ("ratio",), f"a ratio belongs to pattern constant_ratio or sign_flip, not {pattern}")
    contradiction = contradicts(pattern, ratio, value.get("ratio"))
    if contradiction:
        raise ctx.fail(key, contradiction)
    return Expected(arg, pattern, ratio, keystr(key), line)


def _checks(value: Any, key: Key, ctx: Ctx) -> tuple[str, ...]:
    if value == "all" or value == ["all"]:
        return CHECKS
    single = isinstance(value, str)
    items = [value] if single else value
    if not isinstance(items, list) or not items:
        raise ctx.fail(key, f"expected a list of check names or `all`, got {show(value)}")
    for i, name in enumerate(items):
        if name not in CHECKS:
            raise ctx.fail(
                key if single else key + (i,),
                f"unknown check {show(name)}; known checks: {', '.join(CHECKS)}, or `all`",
            )
    return tuple(dict.fromkeys(items))
