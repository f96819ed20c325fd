"""--shard I/N: the N shards partition the cases and spec errors, their sizes differ by one at most,
and they are the same however the spec paths are written and wherever the checkout lies."""

from __future__ import annotations

import json
import random
import shutil
from pathlib import Path

import pytest

from gradcheck_cli.run import plan
from gradcheck_cli.spec import Case, SpecError

SQUARE = """
import torch

class Square(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x):
        ctx.save_for_backward(x)
        return x * x

    @staticmethod
    def backward(ctx, g):
        (x,) = ctx.saved_tensors
        return 2 * x * g
"""
SEVEN = (
    "function: usermod:Square\ninputs: [{shape: [2]}]\ncases: ["
    + ", ".join(f"{{name: c{i}}}" for i in range(7))
    + "]\n"
)


def items_of(paths: list[str]) -> list[Case | SpecError]:
    """Three cases and a spec error per path."""
    out: list[Case | SpecError] = []
    for p in paths:
        out += [Case(path=p, label=f"c{j}", function="m:F", line=3 + j) for j in range(3)]
        out.append(SpecError(p, "inputs", "broken", line=9))
    return out


def where(item: Case | SpecError) -> tuple[Path, str]:
    return Path(item.path).resolve(), item.label if isinstance(item, Case) else f":{item.line}"


def ident(item: Case | SpecError) -> str:
    return item.name if isinstance(item, Case) else f"{item.path}:{item.line}"


@pytest.mark.parametrize("count", range(1, 10))
def test_shards_partition_cases_and_spec_errors_with_sizes_differing_by_one_at_most(count):
    items = items_of([f"specs/s{i}.yaml" for i in range(5)] + [f"specs/sub/t{i}.yml" for i in range(3)])
    shards = [plan.shard(items, i, count) for i in range(1, count + 1)]
    got = [ident(x) for s in shards for x in s]
    assert sorted(got) == sorted(ident(x) for x in items)  # each item in exactly one shard
    sizes = [len(s) for s in shards]
    assert max(sizes) - min(sizes) <= 1, sizes


def test_seven_cases_over_two_shards_are_four_and_three():
    # was: 7 and 0 for some names (the shard was a hash of the name)
    for stem in ("linear", "a", "specs/x", "conv2d"):
        items: list[Case | SpecError] = [Case(path=f"{stem}.yaml", label=f"c{i}", function="m:F") for i in range(7)]
        assert [len(plan.shard(items, i, 2)) for i in (1, 2)] == [4, 3], stem


def test_a_shard_keeps_the_order_of_the_items_and_ignores_it(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    items = items_of([f"specs/s{i}.yaml" for i in range(6)])
    shuffled = random.Random(0).sample(items, len(items))
    for i in (1, 2, 3):
        one, other = plan.shard(items, i, 3), plan.shard(shuffled, i, 3)
        assert sorted(map(ident, one)) == sorted(map(ident, other))
        assert [ident(x) for x in shuffled if x in other] == list(map(ident, other))


def test_shards_are_the_same_however_the_paths_are_written(tmp_path, monkeypatch):
    (tmp_path / "work").mkdir()
    monkeypatch.chdir(tmp_path / "work")
    names = [f"s{i}.yaml" for i in range(7)]
    spellings = (
        [f"specs/{n}" for n in names],
        [f"./specs/{n}" for n in names],
        [str(tmp_path / "work" / "specs" / n) for n in names],
        [f"../work/specs/{n}" for n in names],
    )
    for count in (2, 3, 4):
        shards = [
            [sorted(map(where, plan.shard(items_of(paths), i, count))) for i in range(1, count + 1)]
            for paths in spellings
        ]
        assert all(s == shards[0] for s in shards), count


def test_shards_outside_the_working_directory_are_the_same_however_the_paths_are_written(tmp_path, monkeypatch):
    # was: '../specs/a.yaml' and '/abs/specs/a.yaml' hashed differently
    (tmp_path / "work").mkdir()
    monkeypatch.chdir(tmp_path / "work")
    names = [f"s{i}.yaml" for i in range(9)]
    for count in (2, 3):
        relative = [plan.shard(items_of([f"../specs/{n}" for n in names]), i, count) for i in range(1, count + 1)]
        absolute = [
            plan.shard(items_of([str(tmp_path / "specs" / n) for n in names]), i, count) for i in range(1, count + 1)
        ]
        assert [[ident(x).replace("../", f"{tmp_path}/") for x in s] for s in relative] == [
            [ident(x) for x in s] for s in absolute
        ]


# ----------------------------------------------------------------------- end to end


def run_shards(invoke, target: str, count: int, root: Path) -> list[set[tuple[str, str]]]:
    """Per shard: the (spec path relative to ``root``, case) pairs of the JSON report."""
    out = []
    for i in range(1, count + 1):
        result = invoke(target, "--shard", f"{i}/{count}", "--format", "json", "--no-isolate")
        assert result.exit_code in (0, 3), result.output
        out.append(
            {
                (Path(r["spec"]).resolve().relative_to(root.resolve()).as_posix(), r["case"])
                for r in json.loads(result.stdout)["results"]
            }
        )
    return out


def test_cli_shards_balance_seven_cases(user_module, write_spec, invoke):
    user_module(SQUARE)
    write_spec(SEVEN, "specs/seven.yaml")
    sizes = [
        len(json.loads(invoke("specs/", "--shard", f"{i}/2", "--format", "json", "--no-isolate").stdout)["results"])
        for i in (1, 2)
    ]
    assert sizes == [4, 3]


def test_cli_shards_partition_whatever_the_spelling_and_the_checkout(
    user_module, write_spec, invoke, tmp_path, monkeypatch
):
    user_module(SQUARE)
    write_spec(SEVEN, "a/specs/seven.yaml")
    write_spec("function: usermod:Square\ninputs: [{shape: [3]}]\n", "a/specs/one.yaml")
    write_spec(
        "function: usermod:Square\ninputs: [{shape: [x]}]\n---\nfunction: usermod:Square\ninputs: [{shape: [2]}]\n",
        "a/specs/sub/broken.yaml",
    )
    shutil.copytree(tmp_path / "a", tmp_path / "b" / "elsewhere")  # another checkout, at another place
    everything = None
    for count in (2, 3, 4):
        monkeypatch.chdir(tmp_path / "a")
        runs = [
            run_shards(invoke, t, count, tmp_path / "a") for t in ("specs", "./specs/", str(tmp_path / "a" / "specs"))
        ]
        monkeypatch.chdir(tmp_path)
        runs.append(run_shards(invoke, "a/specs", count, tmp_path / "a"))
        monkeypatch.chdir(tmp_path / "b")
        runs.append(run_shards(invoke, "../a/specs", count, tmp_path / "a"))
        monkeypatch.chdir(tmp_path / "b" / "elsewhere")
        runs.append(run_shards(invoke, "specs/", count, tmp_path / "b" / "elsewhere"))
        assert all(r == runs[0] for r in runs), (count, runs)
        shards = runs[0]
        union = set().union(*shards)
        assert sum(map(len, shards)) == len(union)  # disjoint
        assert max(map(len, shards)) - min(map(len, shards)) <= 1
        everything = everything or union
        assert union == everything and len(union) == 10  # 7 + 1 + a spec error and a case of the broken file
