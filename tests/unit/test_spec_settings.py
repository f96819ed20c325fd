"""The keys a check owns (``x-check`` in the spec schema): read from their schema entry alone
(``spec.settings``), kept on the case as written, and turned into each check's own ``Settings``."""

from __future__ import annotations

import importlib
from dataclasses import fields
from typing import Any

import pytest

from gradcheck_cli import checks
from gradcheck_cli.checks.parts.base import CheckContext
from gradcheck_cli.spec import OWNED, SpecError, document
from gradcheck_cli.spec.document import parse_document
from gradcheck_cli.spec.lines import Ctx
from gradcheck_cli.spec.settings import optional, setting, thawed
from gradcheck_cli.spec.vocabulary import DEFS, SCHEMA, owned

F = "m:F"
BAD = [[1], {"x": 1}, "text", -1, 2.5, True]  # each leaf form refuses some of these


def _leaves(schema: dict[str, Any], key: tuple[Any, ...]) -> list[tuple[tuple[Any, ...], dict[str, Any]]]:
    form, _ = optional(schema)
    if form.get("type") == "object":
        return [leaf for k, s in form["properties"].items() for leaf in _leaves(s, key + (k,))]
    return [(key, schema)]


def _ctx(**settings: Any) -> CheckContext:
    return CheckContext(None, None, settings=settings)  # type: ignore[arg-type]  # Settings.of reads only settings


def test_every_owned_key_is_a_registered_checks_and_in_the_case_too():
    assert OWNED and set(owned("case")) == set(OWNED)
    for key, (check, _) in OWNED.items():
        assert check in checks.REGISTRY, key


@pytest.mark.parametrize("key", list(OWNED))
def test_every_leaf_of_an_owned_key_uses_a_form_the_reader_knows(key):
    # a form `setting` does not know would raise NotImplementedError, which is a traceback for the user
    for path, schema in _leaves(OWNED[key][1], (key,)):
        refused = 0
        for value in BAD:
            try:
                setting(value, schema, path, Ctx("s.yaml"))
            except SpecError as exc:
                refused += 1
                assert f"s.yaml: {'.'.join(map(str, path))}: " in str(exc)
        assert refused, path


@pytest.mark.parametrize("key", list(OWNED))
def test_each_owning_checks_settings_default_to_the_schemas_defaults(key):
    check, schema = OWNED[key]
    module = importlib.import_module(f"gradcheck_cli.checks.{checks.REGISTRY[check]}")
    settings = module.Settings.of(_ctx())
    form, _ = optional(schema)
    defaults = {p: s["default"] for p, s in form.get("properties", {key: form}).items() if "default" in s}
    assert defaults and all(getattr(settings, name) == value for name, value in defaults.items()), defaults
    assert {f.name for f in fields(settings)} >= set(defaults)


def test_a_case_keeps_an_owned_key_as_written_and_a_case_entry_replaces_it_whole():
    doc = {
        "function": F,
        "compile": {"backend": "inductor", "atol": "1e-3"},
        "repeat": 4.0,
        "cases": [{"name": "a"}, {"name": "b", "compile": {"rtol": 0.5}}, {"name": "c", "compile": None}],
    }
    a, b, c = parse_document(doc, Ctx("s.yaml"))
    assert thawed(a.setting("compile")) == {"backend": "inductor", "atol": 1e-3} and a.setting("repeat") == 4
    assert thawed(b.setting("compile")) == {"rtol": 0.5} and b.setting("repeat") == 4
    assert c.setting("compile") is None and parse_document({"function": F}, Ctx("s.yaml"))[0].settings == ()
    hash(a)  # frozen all the way down: a case can key a dict


def test_the_checks_build_their_settings_from_what_the_spec_gave():
    from gradcheck_cli.checks import backward, compile

    assert backward.Settings.of(_ctx(repeat=9)).repeat == 9
    made = compile.Settings.of(_ctx(compile={"backend": "eager", "rtol": 0.5}))
    assert made.backend == "eager" and (made.rule.rule, made.rule.atol, made.rule.rtol) == ("allclose", None, 0.5)
    assert compile.Settings.of(_ctx(compile=None)) == compile.Settings()


@pytest.mark.parametrize(
    "doc,key,words",
    [
        ({"repeat": 1}, "repeat", "expected an integer from 2 to 1000 (backward calls compared for determinism)"),
        ({"compile": {"backend": "tvm"}}, "compile.backend", "expected one of aot_eager, inductor, eager"),
        ({"compile": {"atol": -1}}, "compile.atol", "expected a non-negative number, got -1"),
        ({"compile": {"bakend": "eager"}}, "compile.bakend", "unknown key (did you mean 'backend'?)"),
        ({"compile": 3}, "compile", "expected a mapping with keys backend, atol, rtol; got 3"),
    ],
)
def test_a_bad_owned_key_names_the_key_and_what_is_allowed(doc, key, words):
    with pytest.raises(SpecError) as err:
        parse_document({"function": F, **doc}, Ctx("s.yaml"))
    assert f"s.yaml: {key}: " in str(err.value) and words in str(err.value), str(err.value)


def test_a_new_checks_key_needs_only_its_schema_entry(monkeypatch):
    # what a new check adds to the schema: a key marked x-check; the document reader has no code for it
    entry = {"x-check": "my_check", "type": "integer", "minimum": 1, "maximum": 8, "x-hint": "samples per argument"}
    monkeypatch.setitem(DEFS, "my_check", entry)
    monkeypatch.setitem(SCHEMA["properties"], "my_check", {"$ref": "#/$defs/my_check"})
    monkeypatch.setattr(document, "OWNED", owned())
    monkeypatch.setattr(document, "TOP_KEYS", (*document.TOP_KEYS, "my_check"))
    (case,) = parse_document({"function": F, "my_check": 5}, Ctx("s.yaml"))
    assert case.setting("my_check") == 5
    with pytest.raises(SpecError, match=r"s.yaml: my_check: expected an integer from 1 to 8 \(samples per argument\)"):
        parse_document({"function": F, "my_check": 9}, Ctx("s.yaml"))
