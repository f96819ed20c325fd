"""A spec error names the line of the key it is about, also when the key is inherited: a case that takes the
document's inputs (and changes `distributed:`), or an entry that merges an anchor (`<<: *x`). The placement and
layout errors pointed at the argument entry's first line."""

from __future__ import annotations

import pytest

from gradcheck_cli.spec import SpecError, load_file


def error_of(write_spec, text: str) -> SpecError:
    [error] = [item for item in load_file(write_spec(text)) if isinstance(item, SpecError)]
    return error


@pytest.mark.parametrize(
    "text, key, line",
    [
        (
            """\
            function: pkg.mod:F
            inputs:
              - name: x
                shape: [3]
                placement: shard(0)
            """,
            "inputs[0].placement",
            5,
        ),
        (
            """\
            function: pkg.mod:F
            distributed: {world_size: 2}
            inputs:
              - name: x
                shape: [4]
                placement: shard(0)
            cases:
              - name: even
              - name: odd
                distributed: {world_size: 3}
            """,
            "inputs[0].placement",
            6,  # the document's key, which case 'odd' inherits
        ),
        (
            """\
            function: pkg.mod:F
            distributed: {world_size: 2}
            inputs:
              - &x
                name: x
                shape: [4]
                placement: shard(0)
              - <<: *x
                name: y
                shape: [3]
            """,
            "inputs[1].placement",
            7,  # y's placement is the one merged from x's entry: its line there
        ),
        (
            """\
            function: pkg.mod:F
            distributed: {world_size: 2}
            kwargs:
              x:
                shape: [4, 4]
                density: 0.5
                layout: sparse_coo
            """,
            "kwargs.x.layout",
            7,
        ),
    ],
)
def test_a_distributed_error_names_the_line_of_its_key(write_spec, text, key, line):
    error = error_of(write_spec, text)
    assert (error.key, error.line) == (key, line), str(error)
