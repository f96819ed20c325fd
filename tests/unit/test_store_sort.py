"""The store of a Jacobian's non-zero entries sorted on a GPU (``rows.sorted_there``) is the store the host
builds (``rows.from_keys``): the same rows, values and column bounds, entry for entry. CI has no GPU, and
``sorted_there`` is device-agnostic torch, so it runs here on the CPU against the host's path, on random
entries in random order, where the host packs keys with their places and where it cannot (an argsort)."""

from __future__ import annotations

import pytest
import torch

from gradcheck_cli.numerics.rows import SparseRows, from_keys, sorted_there


def entries(n_rows: int, n_cols: int, count: int, seed: int) -> tuple[torch.Tensor, torch.Tensor]:
    gen = torch.Generator().manual_seed(seed)
    if n_rows * n_cols <= 10**6:
        keys = torch.randperm(n_rows * n_cols, generator=gen)[:count]
    else:  # too many places for a permutation: distinct random keys
        keys = torch.unique(torch.randint(0, n_rows * n_cols, (count,), generator=gen))
        keys = keys[torch.randperm(len(keys), generator=gen)]
    return keys, torch.randn(len(keys), dtype=torch.float64, generator=gen)


def same_store(a: SparseRows, b: SparseRows) -> bool:
    return (
        a.rows.dtype == b.rows.dtype
        and torch.equal(a.rows, b.rows)
        and torch.equal(a.vals, b.vals)
        and torch.equal(a.bounds, b.bounds)
        and a.starts == b.starts
    )


@pytest.mark.parametrize(
    "n_rows, n_cols, count",
    [
        (1, 1, 1),
        (7, 5, 35),
        (64, 48, 1000),
        (300, 200, 20_000),
        (2**20, 2**21, 5000),
        (2**31 + 5, 64, 3000),
        (2**40 + 3, 2**20, 3000),
    ],
)
@pytest.mark.parametrize("seed", [0, 1])
def test_sorted_there_is_the_hosts_store(n_rows: int, n_cols: int, count: int, seed: int) -> None:
    keys, vals = entries(n_rows, n_cols, count, seed)
    host = from_keys(keys.clone(), vals.clone(), n_rows, n_cols)  # from_keys overwrites its keys
    there = sorted_there(keys, vals, n_rows, n_cols)
    assert same_store(host, there)
    # and both hold exactly the entries given: column-major, each once
    cols = torch.repeat_interleave(torch.arange(n_cols), torch.diff(there.bounds))
    assert torch.equal(torch.sort(cols * n_rows + there.rows.long()).values, torch.sort(keys).values)


def test_no_entries_make_an_empty_store() -> None:
    keys, vals = torch.empty(0, dtype=torch.long), torch.empty(0, dtype=torch.float64)
    store = sorted_there(keys, vals, 4, 3)
    assert same_store(store, from_keys(keys.clone(), vals.clone(), 4, 3)) and store.starts == [0, 0, 0, 0]
