"""YAML -> documents, with the map from each key path to its line: read with the safe loader only;
duplicate keys, complex keys, cycles through aliases and alias expansion past MAX_NODES refused; merge
keys (``<<``) resolved as YAML 1.1 says. ``Ctx`` carries a document's path and line map, and builds the
SpecError that names file, line and key path."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Optional, Union

import yaml

from .model import Key, SpecError

MAX_NODES = 1_000_000  # aliases may repeat a node: refuse documents that expand past this ("billion laughs")
MERGE_TAG = "tag:yaml.org,2002:merge"  # the tag of a plain `<<` key


@dataclass
class Ctx:
    """Where a document is read: its file, the line of each key path, and a prefix for the paths."""

    path: str
    lines: dict[Key, int] = field(default_factory=dict)
    prefix: Key = ()

    def fail(self, key: Key, message: str) -> SpecError:
        """The error at ``key``, with the line of the nearest key path above it that has one."""
        full = self.prefix + key
        line = next((self.lines[full[:i]] for i in range(len(full), -1, -1) if full[:i] in self.lines), None)
        return SpecError(self.path, keystr(full), message, line)


def keystr(key: Key) -> str:
    """A key path as messages write it: ``inputs[0].shape``."""
    out = ""
    for part in key:
        out += f"[{part}]" if isinstance(part, int) else (f".{part}" if out else str(part))
    return out


def documents(text: str, path: str) -> tuple[list[tuple[int, Union[Ctx, SpecError], Any]], Optional[SpecError]]:
    """(position, context with the lines of its key paths or the error that refused it, data) of
    each non-empty document, read with the safe loader, and the syntax error that stopped the
    reading, if any: the documents before it are kept."""
    loader = None
    docs: list[tuple[int, Union[Ctx, SpecError], Any]] = []
    try:
        loader = yaml.SafeLoader(text)  # refuses control characters at once
        index = 0
        while loader.check_node():
            node = loader.get_node()
            if node is None:  # not after check_node() said a document follows; for the type checker
                break
            index += 1
            ctx = Ctx(path)
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
        return docs, SpecError(
            path,
            "",
            f"not valid YAML: {problem}; fix the syntax at this line",
            mark.line + 1 if mark is not None else None,
        )
    except RecursionError:
        return docs, SpecError(path, "", "not readable: lists or mappings nested too deeply")
    finally:
        if loader is not None:
            loader.dispose()
    return docs, None


def _node_lines(node: yaml.Node, key: Key, ctx: Ctx, sizes: Optional[dict[int, Optional[int]]] = None) -> int:
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
            raise SpecError(
                ctx.path, keystr(key), "an alias inside the node it names: a spec cannot be infinite", lines[key]
            )
        return known
    sizes[id(node)] = None
    size = 1
    merges: list[tuple[str, yaml.Node]] = []  # (the key as written, its value) of a mapping's merge keys (<<)
    if isinstance(node, yaml.MappingNode):
        seen: set[str] = set()
        for k, v in node.value:
            if not isinstance(k, yaml.ScalarNode):  # `? [a, b]: ...` or `? {a: 1}: ...`, a complex key
                raise SpecError(
                    ctx.path,
                    keystr(key),
                    "a key must be a plain name, not a list or a mapping "
                    "(a line that starts with `? ` writes a complex key)",
                    k.start_mark.line + 1,
                )
            name = k.value
            if name in seen:
                also = "; to merge several mappings, list them: `<<: [*a, *b]`" if k.tag == MERGE_TAG else ""
                raise SpecError(
                    ctx.path, keystr(key + (name,)), f"duplicate key: keep one{also}", k.start_mark.line + 1
                )
            seen.add(name)
            lines[key + (name,)] = k.start_mark.line + 1
            size += _node_lines(v, key + (name,), ctx, sizes)
            if k.tag == MERGE_TAG:
                merges.append((name, v))
    elif isinstance(node, yaml.SequenceNode):
        for i, v in enumerate(node.value):
            size += _node_lines(v, key + (i,), ctx, sizes)
    if size > MAX_NODES:
        raise SpecError(ctx.path, keystr(key), f"aliases expand this to more than {MAX_NODES} values", lines[key])
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


def _merged(value: yaml.Node, key: Key, ctx: Ctx, name: str = "<<") -> list[tuple[yaml.Node, yaml.Node]]:
    """The (key, value) pairs that ``<<: value`` brings into a mapping, the winner of each key
    first (YAML 1.1): a mapping's own keys before those it merges, an earlier mapping of a list
    before a later one. The mapping's explicit keys beat them all. ``value`` was walked (no cycle);
    ``name`` is the merge key as written (`<<`, or `!!merge NAME`), for the message."""
    maps = value.value if isinstance(value, yaml.SequenceNode) else [value]
    pairs: list[tuple[yaml.Node, yaml.Node]] = []
    for m in maps:
        if not isinstance(m, yaml.MappingNode):
            raise SpecError(
                ctx.path,
                keystr(key + (name,)),
                "a merge key `<<` takes a mapping or a list of mappings, e.g. `<<: *defaults` or `<<: [*a, *b]`",
                m.start_mark.line + 1,
            )
        own = [(k, v) for k, v in m.value if k.tag != MERGE_TAG]
        pairs += own + [pair for k, v in m.value if k.tag == MERGE_TAG for pair in _merged(v, key, ctx, k.value)]
    return pairs
