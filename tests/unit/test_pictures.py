"""Where the mismatches are: the JSON's mismatched_indices (capped, the cap stated) and the error maps
the HTML report draws, from the numerics up to the rows of real checks."""

from __future__ import annotations

import json

import jsonschema
import torch

from gradcheck_cli import check, schemas
from gradcheck_cli.checks.parts.argument_rows import INDEX_CAP, MAP_CELLS
from gradcheck_cli.numerics import ArgumentComparison
from gradcheck_cli.numerics.maps import downsample, first_indices, view_2d
from gradcheck_cli.reporters import json_
from gradcheck_cli.results import Report

SOME_WRONG = """
    import torch
    class SomeWrong(torch.autograd.Function):
        '''y = 2 x; backward is wrong at x[1, 2] and x[3, 0], and everywhere in rows 5.. .'''
        @staticmethod
        def forward(ctx, x):
            return 2 * x
        @staticmethod
        def backward(ctx, g):
            d = 2 * g
            d[1, 2] *= 3
            d[3, 0] *= 3
            d[5:] = 0
            return d
"""


def test_downsample_keeps_small_maps_and_pools_large_ones_by_their_max():
    small, block = downsample(torch.arange(12.0), (3, 4), 4096)
    assert block == (1, 1) and small.tolist() == torch.arange(12.0).view(3, 4).tolist()
    values = torch.zeros(200 * 100)
    values[150 * 100 + 37] = 5.0  # one hot element
    grid, block = downsample(values, (200, 100), 4096)
    assert grid.numel() <= 4096 and block[0] * block[1] > 1
    assert float(grid.max()) == 5.0 and int((grid > 0).sum()) == 1  # the max of its block survives
    r, c = divmod(int(grid.argmax()), grid.shape[1])
    assert r == 150 // block[0] and c == 37 // block[1]
    assert view_2d(()) == (1, 1) and view_2d((7,)) == (1, 7) and view_2d((2, 3, 5)) == (6, 5)


def test_first_indices_are_multi_indices_in_row_major_order_capped():
    mask = torch.zeros(2, 3, 4, dtype=torch.bool)
    mask[0, 1, 3] = mask[1, 0, 0] = mask[1, 2, 1] = True
    assert first_indices(mask, (2, 3, 4), 100) == [[0, 1, 3], [1, 0, 0], [1, 2, 1]]
    assert first_indices(mask, (2, 3, 4), 2) == [[0, 1, 3], [1, 0, 0]]


def test_entry_keeps_each_columns_largest_error():
    entry = ArgumentComparison(3, atol=1e-5, rtol=1e-3)
    a = torch.tensor([[1.0, 2.0], [0.0, 0.0], [5.0, -1.0]], dtype=torch.float64)  # column per row of a
    n = torch.tensor([[1.0, 2.5], [0.0, 0.0], [2.0, -1.0]], dtype=torch.float64)
    entry.update(a, n, 0, torch.ones(2, dtype=torch.float64))
    assert entry.err.tolist() == [0.5, 0.0, 3.0]


def test_json_lists_the_mismatching_indices_and_the_cap(user_module):
    mod = user_module(SOME_WRONG)
    from importlib import import_module

    fn = import_module(mod).SomeWrong
    result = check(fn, [torch.randn(40, 4, dtype=torch.float64, requires_grad=True)])
    row = result.checks[0].inputs[0]
    assert row.mismatched == 2 + 35 * 4
    assert row.mismatched_indices[:3] == [[1, 2], [3, 0], [5, 0]]
    assert len(row.mismatched_indices) == INDEX_CAP == row.mismatched_indices_cap < row.mismatched
    data = json.loads(json.dumps(json_.as_dict(Report([result]), "2.13.0")))
    jsonschema.validate(data, schemas.load("report"))
    entry = data["results"][0]["checks"][0]["inputs"][0]
    assert entry["mismatched_indices"][:2] == [[1, 2], [3, 0]] and entry["mismatched_indices_cap"] == INDEX_CAP
    assert "error_map" not in entry  # a picture's data, not the report's


def test_error_map_of_a_failing_argument_shows_where_it_is_wrong(user_module):
    mod = user_module(SOME_WRONG)
    from importlib import import_module

    x = torch.randn(6, 4, dtype=torch.float64, requires_grad=True)
    row = check(import_module(mod).SomeWrong, [x]).checks[0].inputs[0]
    picture = row.error_map
    assert (picture.rows, picture.cols, picture.block) == (6, 4, [1, 1])
    err = torch.tensor(picture.error).view(6, 4)
    assert err[1, 2] == err[3, 0] == 4.0 and float(err[5].min()) == 2.0  # |6 - 2|, |0 - 2|
    assert float(err[:5].sum()) == 8.0  # right elsewhere
    # small and real: both sides kept, gradients for the same grad_output
    a, n = torch.tensor(picture.analytical).view(6, 4), torch.tensor(picture.numerical).view(6, 4)
    assert torch.allclose(a[0], n[0]) and torch.allclose(a[1, 2], 3 * n[1, 2]) and bool((a[5] == 0).all())


def test_passing_arguments_and_large_ones_keep_small_pictures():
    from gradcheck_cli.examples.broken import LinearDoubleBias

    args = [
        torch.randn(70, 80, dtype=torch.float64, requires_grad=True),
        torch.randn(3, 80, dtype=torch.float64, requires_grad=True),
        torch.randn(3, dtype=torch.float64, requires_grad=True),
    ]
    rows = check(LinearDoubleBias, args).checks[0].inputs
    assert [r.error_map is None for r in rows] == [True, True, False]  # only the failing argument has one
    assert rows[0].mismatched_indices is None and rows[2].mismatched_indices == [[0], [1], [2]]
    assert len(rows[2].error_map.error) <= MAP_CELLS


def test_reference_check_fills_indices_and_map_from_its_own_comparison(user_module):
    mod = user_module("""
        import torch
        def ref(x):
            return x.exp()
        class Kernel(torch.autograd.Function):
            @staticmethod
            def forward(ctx, x):
                ctx.save_for_backward(x)
                return x.exp()
            @staticmethod
            def backward(ctx, g):
                x, = ctx.saved_tensors
                d = g * x.exp()
                d[0, 1] = 0
                return d
    """)
    from importlib import import_module

    m = import_module(mod)
    row = (
        check(m.Kernel, [torch.randn(3, 5, dtype=torch.float64, requires_grad=True)], reference=m.ref)
        .checks[0]
        .inputs[0]
    )
    assert row.mismatched == 1 and row.mismatched_indices == [[0, 1]] and row.mismatched_indices_cap == INDEX_CAP
    err = torch.tensor(row.error_map.error).view(3, 5)
    assert int((err > 0).sum()) == 1 and float(err[0, 1]) > 0
    assert row.error_map.analytical[1] == 0.0 and row.error_map.numerical[1] != 0.0
