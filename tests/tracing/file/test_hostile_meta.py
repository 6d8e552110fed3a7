"""Meta fields the tools read (tokens, rank, world_size, the distributed tables) are
checked when a file is opened: a wrong type or a value out of range is one
``TraceFileError`` naming the field, fast and in little memory, never a traceback."""

from __future__ import annotations

import json
import time
from pathlib import Path

import pytest
from helpers.golden.handmade import handmade_trace

import tracing
from app.cli import main
from app.widgets.tensor_view import token_labels
from tracing.analysis.ranks import collectives_of, load_ranks
from tracing.errors import TraceFileError


def write_rank_files(folder: Path, world: int = 2, **edits) -> list[Path]:
    """Two rank files of one run of ``world`` ranks (``t.rank0.sft``, ``t.rank1.sft``);
    ``edits`` replace meta keys of rank 0 (``distributed`` as a whole)."""
    paths = []
    for rank in (0, 1):
        trace = handmade_trace()
        trace.meta.update(
            rank=rank,
            world_size=world,
            backend="gloo",
            distributed={
                "host": "h",
                "local_rank": rank,
                "collectives": [{"op": "all_reduce", "step": 3, "group": "WORLD", "ranks": [0, 1]}],
                "dtensors": {
                    1: {
                        "mesh": [0, 1],
                        "mesh_dims": ["dp"],
                        "coordinate": [rank],
                        "placements": [["shard", 0]],
                        "local_shape": [1, 3, 2],
                        "global_shape": [1, 3, 4],
                    }
                },
            },
        )
        if rank == 0:
            trace.meta.update(edits)
        path = folder / f"t.rank{rank}.sft"
        trace.save(path)
        paths.append(path)
    return paths


def _dist(**changes) -> dict:
    base = {
        "host": "h",
        "collectives": [{"op": "all_reduce", "step": 3}],
        "dtensors": {},
    }
    base.update(changes)
    return base


HOSTILE = [
    ({"world_size": 10**12}, "meta.world_size"),
    ({"world_size": [2]}, "meta.world_size"),
    ({"world_size": True}, "meta.world_size"),
    ({"rank": 10**30}, "meta.rank"),
    ({"rank": 5}, "meta.rank"),
    ({"rank": "0"}, "meta.rank"),
    ({"distributed": 5}, "meta.distributed"),
    ({"distributed": _dist(collectives="all")}, "meta.distributed.collectives"),
    ({"distributed": _dist(collectives=[{"step": 3}])}, "collectives[0].op"),
    ({"distributed": _dist(collectives=[{"op": "x", "step": "3"}])}, "collectives[0].step"),
    ({"distributed": _dist(collectives=[{"op": "x", "step": 10**9}])}, "collectives[0].step"),
    ({"distributed": _dist(collectives=[{"op": "x", "step": -1}])}, "collectives[0].step"),
    ({"distributed": _dist(collectives=[{"op": "x", "index": 10**9}])}, "collectives[0].index"),
    ({"distributed": _dist(collectives=[{"op": "x", "index": None}])}, "collectives[0].index"),
    ({"distributed": _dist(collectives=[{"op": "redistribute", "placements": 3}])}, "placements"),
    ({"distributed": _dist(dtensors=[1, 2])}, "meta.distributed.dtensors"),
    ({"distributed": _dist(dtensors={10**6: {}})}, "a tensor id"),
    ({"distributed": _dist(dtensors={1: {"mesh": "x", "placements": []}})}, "mesh"),
    (
        {"distributed": _dist(dtensors={1: {"mesh": [0, 1], "placements": [["bogus"]]}})},
        "placements",
    ),
    ({"tokens": 5}, "meta.tokens"),
    ({"tokens": {"a": 1}}, "meta.tokens"),
    ({"tokens": [1, "x"]}, "meta.tokens[1]"),
]


@pytest.mark.parametrize(("edits", "field"), HOSTILE)
def test_a_hostile_meta_field_is_one_error_naming_it(tmp_path, edits, field):
    paths = write_rank_files(tmp_path, **edits)
    with pytest.raises(TraceFileError, match=field.replace("[", r"\[").replace("]", r"\]")):
        tracing.load(paths[0])
    with pytest.raises(TraceFileError):
        load_ranks(paths)


def test_the_report_of_rank_files_with_a_huge_world_size_is_one_line(tmp_path, capsys):
    paths = write_rank_files(tmp_path, world_size=10**12)
    start = time.perf_counter()
    assert main(["report", str(tmp_path / "t.sft")]) == 2
    assert time.perf_counter() - start < 5
    err = capsys.readouterr().err.splitlines()
    assert len(err) == 1 and "meta.world_size" in err[0], err
    assert paths[0].exists()


def test_well_formed_rank_files_still_load_and_report(tmp_path):
    paths = write_rank_files(tmp_path, world=4)  # ranks 2 and 3 never copied back
    ranks = load_ranks(paths)
    assert ranks.world_size == 4 and ranks.missing == [2, 3]


def test_an_older_files_collective_step_is_read_as_its_index(tmp_path, capsys):
    """Files written before ``index`` called a collective's 0-based index ``step``."""
    paths = write_rank_files(tmp_path)  # {"op": "all_reduce", "step": 3, ...}: the old way
    (entry,) = collectives_of(tracing.load(paths[0]))
    assert entry["index"] == 3 and "step" not in entry
    assert main(["report", str(tmp_path / "t.sft"), "--format", "json"]) == 0
    (row,) = json.loads(capsys.readouterr().out)["collectives"]
    assert row["step"] == 4 and row["op"] == "all_reduce"  # step 4 is steps[3], as the app counts


def test_a_rank_beyond_the_world_size_is_refused(tmp_path):
    paths = write_rank_files(tmp_path)
    odd = tmp_path / "t.rank99999999999999.sft"
    trace = handmade_trace()
    trace.save(odd)
    with pytest.raises(TraceFileError, match="rank"):
        load_ranks([paths[0], odd])


@pytest.mark.parametrize("tokens", [5, {"a": 1}, [10**30], "abc", [[1, 2], 3]])
def test_the_tensor_view_survives_odd_tokens_in_memory(tokens):
    trace = handmade_trace()
    trace.meta["tokens"] = tokens
    labels = token_labels(trace)
    assert labels is None or all(isinstance(x, str) for x in labels)
