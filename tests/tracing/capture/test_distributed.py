"""Tracing under torch.distributed: 2 CPU ranks over gloo, each writing its own file.

One spawn of two processes runs every scenario (module-scoped): a hand-split row-parallel
Linear with an explicit ``dist.all_reduce``, a tensor-parallel MLP (``ColwiseParallel`` /
``RowwiseParallel`` on a 2-rank ``DeviceMesh``), and the demo model under DDP, once as
is and once with one rank's weight nudged. Every result is checked against the same
layer or model run unsharded in this process.
"""

from __future__ import annotations

import json

import pytest
import torch
from helpers import dist_workers as workers
from helpers.once import shared_folder

import tracing
from tracing.analysis.ranks import collectives_of, load_ranks, pooled_stats, stitch
from tracing.capture.distributed import rank_path, rank_siblings
from tracing.stats import tensor_stats

pytestmark = pytest.mark.skipif(
    not torch.distributed.is_available(), reason="torch.distributed is not built in"
)


@pytest.fixture(scope="module")
def folder(tmp_path_factory):
    """Rank files of every scenario (``workers.every_scenario``), from one spawn per suite
    run: the xdist workers that run this module's tests share them (``helpers/once.py``);
    the tests only read them."""
    return shared_folder(
        tmp_path_factory, "ranks", lambda path: workers.run_ranks(workers.every_scenario, path)
    )


# --------------------------------------------------------------------------- files


def test_rank_path_names_each_rank_once(tmp_path):
    assert rank_path("out/trace.sft", 3).name == "trace.rank3.sft"
    assert rank_path("trace.rank3.sft", 3).name == "trace.rank3.sft"
    assert rank_path("trace.rank0.sft", 1).name == "trace.rank1.sft"
    assert rank_path("t[1]", 2).name == "t[1].rank2.sft"
    for r in (0, 1, 10):
        (tmp_path / f"t.rank{r}.sft").write_bytes(b"")
    (tmp_path / "t.rankx.sft").write_bytes(b"")
    (tmp_path / "other.rank0.sft").write_bytes(b"")
    (tmp_path / "a[1].rank0.sft").write_bytes(b"")
    assert [p.name for p in rank_siblings(tmp_path / "t.sft")] == [
        "t.rank0.sft", "t.rank1.sft", "t.rank10.sft"
    ]  # fmt: skip
    assert [p.name for p in rank_siblings(tmp_path / "a[1].sft")] == ["a[1].rank0.sft"]


def test_one_process_trace_has_no_rank_meta(tmp_path):
    layer = workers.mlp()
    trace = tracing.trace(layer, workers.mlp_input(), out=tmp_path / "t.sft")
    assert "rank" not in trace.meta and "distributed" not in trace.meta
    assert (tmp_path / "t.sft").is_file()  # no process group: the name as given


# --------------------------------------------------------------------------- row parallel


def test_row_parallel_all_reduce_is_a_step_with_group_and_tensors(folder):
    ranks = load_ranks(folder / "row.sft")
    assert ranks.ranks == [0, 1] and ranks.world_size == 2 and not ranks.missing
    full = workers.mlp()[0]
    x = workers.mlp_input()
    for rank in ranks:
        trace = ranks[rank]
        assert (trace.meta["rank"], trace.meta["world_size"], trace.meta["backend"]) == (
            rank, 2, "gloo"
        )  # fmt: skip
        (entry,) = trace.meta["distributed"]["collectives"]
        assert entry["op"] == "all_reduce" and entry["api"] == "torch.distributed"
        assert entry["ranks"] == [0, 1] and entry["reduce_op"] == "sum"
        step = trace.steps[entry["index"]]
        assert step.op == "all_reduce" and step.module == ""
        assert step.source is not None and "dist.all_reduce" in step.source.text
        # input: this rank's partial sum; output: the sum over ranks = the full matmul
        k = full.in_features // 2
        own = x[:, rank * k : (rank + 1) * k] @ full.weight[:, rank * k : (rank + 1) * k].T
        torch.testing.assert_close(trace.value(step.inputs[0]), own.detach())
        torch.testing.assert_close(trace.value(step.outputs[0]), (x @ full.weight.T).detach())
        root = trace.steps[0]
        torch.testing.assert_close(trace.value(root.outputs[0]), full(x).detach())
    # the all-reduce output should agree across ranks, and does
    assert ranks.first_divergence() is None


# --------------------------------------------------------------------------- tensor parallel


def test_tensor_parallel_records_layouts_and_redistributions(folder):
    ranks = load_ranks(sorted(folder.glob("tp.rank*.sft")))
    trace = ranks[1]
    dtensors = trace.meta["distributed"]["dtensors"]
    weight0 = next(t for t in trace.tensors if t.role == "param" and t.id in dtensors)
    layout = dtensors[weight0.id]
    assert layout["placements"] == [["shard", 0]] and layout["mesh_dims"] == ["tp"]
    assert layout["global_shape"] == [workers.HIDDEN, workers.IN]
    assert layout["local_shape"] == [workers.HIDDEN // 2, workers.IN]
    assert weight0.shape == (workers.HIDDEN // 2, workers.IN)  # the record is the shard
    assert layout["coordinate"] == [1] and layout["mesh"] == [0, 1]
    moves = [c for c in trace.meta["distributed"]["collectives"] if c["op"] == "redistribute"]
    assert [["partial", "sum"]] in [m["placements"][0] for m in moves]
    last = next(m for m in moves if m["placements"][0] == [["partial", "sum"]])
    assert (
        last["placements"][1] == [["replicate"]]
        and last["ranks"] == [0, 1]
        and last["group"] == "tp"
    )


def test_stitched_shards_equal_the_layer_unsharded(folder):
    ranks = load_ranks(folder / "tp.rank0.sft")
    ref = workers.mlp()
    x = workers.mlp_input()
    hidden = ref[0](x).detach()  # ColwiseParallel: Shard(1) of (3, HIDDEN)
    first = ranks.first
    linear0 = next(s for s in first.steps if s.module == "0" and s.op == "linear")
    out_id = linear0.outputs[0]
    from tracing.analysis.ranks import layout_of

    assert layout_of(first, out_id)["placements"] == [["shard", 1]]
    torch.testing.assert_close(ranks.stitched(out_id), hidden)
    whole = tensor_stats(hidden)
    pooled = ranks.stitched_stats(out_id)
    assert pooled.min == pytest.approx(whole.min) and pooled.max == pytest.approx(whole.max)
    # the row-parallel linear's local output is Partial: stitched, the pending sum is done
    linear2 = next(s for s in first.steps if s.module == "2" and s.op == "linear")
    expected = (ref[2](ref[1](ref[0](x))) - ref[2].bias).detach() + ref[2].bias.detach()
    torch.testing.assert_close(ranks.stitched(linear2.outputs[0]), expected)
    # the model's output, replicated on every rank, is the unsharded model's
    for rank in ranks:
        trace = ranks[rank]
        torch.testing.assert_close(trace.value(trace.steps[0].outputs[0]), ref(x).detach())
    assert ranks.first_divergence() is None


def test_stitch_and_pooled_stats_against_torch():
    whole = torch.randn(4, 6)
    layout = {"mesh": [[0, 1], [2, 3]], "placements": [["shard", 0], ["shard", 1]]}
    shards = {(i, j): whole[2 * i : 2 * i + 2, 3 * j : 3 * j + 3] for i in (0, 1) for j in (0, 1)}
    torch.testing.assert_close(stitch(shards, layout), whole)
    partial = {"mesh": [0, 1], "placements": [["partial", "sum"]]}
    torch.testing.assert_close(stitch({(0,): whole, (1,): 2 * whole}, partial), 3 * whole)
    a, b = whole[:1], whole[1:]
    pooled = pooled_stats([(tensor_stats(a), a.numel()), (tensor_stats(b), b.numel())])
    expect = tensor_stats(whole)
    assert pooled.mean == pytest.approx(expect.mean, abs=1e-6)
    assert pooled.std == pytest.approx(expect.std, rel=1e-5)


# --------------------------------------------------------------------------- data parallel


def test_ddp_replicas_agree_and_record_the_buffer_broadcast(folder):
    ranks = load_ranks(folder / "ddp.sft")
    assert ranks.replicas_expected()
    assert ranks.first_divergence() is None
    ref = tracing.trace(workers.demo_model(), workers.DEMO_TOKENS)
    trace = ranks[0]
    inner = [s for s in trace.steps if s.module.startswith("module")]
    # the same ops as the model traced alone, one level down (DDP's "module.")
    assert [(s.op, s.module.removeprefix("module").lstrip(".")) for s in inner] == [
        (s.op, s.module) for s in ref.steps
    ]


def test_drifted_rank_is_found_at_the_first_op_reading_the_weight(folder):
    ranks = load_ranks(folder / "drift.sft")
    found = ranks.first_divergence()
    assert found is not None and found.rank == 1 and found.reason == "replica"
    assert found.label == "module.blocks.1.feed_forward.linear1 · linear"
    step = ranks.first.steps[found.step]
    assert "module.blocks.1.feed_forward.linear1.weight" in step.input_names
    # every earlier step agrees
    earlier = [d for d in ranks.divergences() if d.entry.order < found.entry.order]
    assert earlier == []


# --------------------------------------------------------------------------- command line


def test_cli_trace_under_ranks_writes_one_file_per_rank_and_report_reads_them(folder, capsys):
    from app.cli import main

    assert sorted(p.name for p in folder.glob("cli*.sft")) == ["cli.rank0.sft", "cli.rank1.sft"]
    ranks = load_ranks(folder / "cli.sft")
    assert ranks.first.meta["model_class"].endswith("DistributedDataParallel")
    assert ranks.first.meta["dims"]["C"] == 64  # read through DDP's .module
    assert main(["report", str(folder / "cli.sft")]) == 0
    text = capsys.readouterr().out
    assert text.startswith("# Ranks: 2 of 2 (gloo)")
    assert "| broadcast_coalesced | torch.distributed |" in text
    assert "| rank 0 | rank 1 |" in text
    assert main(["report", str(folder / "tp.rank0.sft"), str(folder / "tp.rank1.sft")]) == 0
    text = capsys.readouterr().out
    assert "Partial(sum) → Replicate" in text and "of (3, 16) Shard(1)" in text
    assert main(["report", str(folder / "drift.sft"), "--format", "json"]) == 0
    found = json.loads(capsys.readouterr().out)["divergence"]
    assert found["rank"] == 1 and found["label"].endswith("linear1 · linear")
    drift = load_ranks(folder / "drift.sft")  # the step number, as the app counts
    assert drift.first.steps[found["step"] - 1].label == found["label"]
    assert main(["report", str(folder / "tp.rank0.sft"), str(folder / "tp.rank0.sft")]) == 2
    assert "rank 0 is also" in capsys.readouterr().err


# --------------------------------------------------------------------------- the app


def _rank_window(qtbot, paths):
    from app.windows.rank_window import RankWindow

    window = RankWindow.from_files(paths)
    qtbot.addWidget(window)
    window.show()
    qtbot.waitExposed(window)
    return window


@pytest.mark.gui
def test_rank_window_opens_at_the_drifted_step_and_steps_ranks_together(qtbot, folder):
    window = _rank_window(qtbot, folder / "drift.sft")
    assert window.pair == (0, 1)
    entry = window.compare.current_entry
    assert entry.label == "module.blocks.1.feed_forward.linear1 · linear"
    assert window.across.count() == len(window.divergences) > 0
    assert window.tabs.tabText(0) == f"Across ranks ({len(window.divergences)})"
    # stepping moves both ranks: the entry pairs the same step of rank 0 and rank 1
    window.compare.next()
    moved = window.compare.current_entry
    assert moved.a_index == moved.b_index == entry.a_index + 1
    # the same rank on both sides: nothing differs
    window.rank_b.setCurrentIndex(window.rank_b.findData(0))
    assert window.pair == (0, 0) and window.compare.first is None
    window.go_to_first_divergence()
    assert window.pair == (0, 1)


@pytest.mark.gui
def test_rank_window_shows_shards_stitched_and_only_what_should_agree(qtbot, folder):
    window = _rank_window(qtbot, [folder / "tp.rank0.sft", folder / "tp.rank1.sft"])
    assert window.divergences == [] and window.compare.first is None
    # the column-parallel hidden layer differs across ranks by design: a shard, grey
    linear0 = next(s for s in window.ranks.first.steps if s.module == "0" and s.op == "linear")
    window.compare.go_to_step("a", linear0.index)
    assert window.compare.current_entry.status == "sharded"
    assert "differ by design" in window.compare.difference_heatmap.message  # no A − B
    assert "global (3, 16) · Shard(1)" in window.stitched_title.text()
    image = window.stitched_heatmap.image_item.image
    expected = workers.mlp()[0](workers.mlp_input()).detach()
    assert image.shape == tuple(expected.shape)
    torch.testing.assert_close(torch.as_tensor(image), expected)
    assert window.collectives.rowCount() == 2
    assert window.collectives.item(1, 4).text() == "Partial(sum) → Replicate"
    # without the filter the shards count as differences
    window.agree_only.setChecked(False)
    assert window.compare.first is not None


@pytest.mark.gui
def test_file_open_ranks_and_the_command_line(qtbot, folder, tmp_path, monkeypatch):
    from PySide6.QtCore import QSettings

    from app.windows import dialogs
    from app.windows.main_window import MainWindow
    from app.windows.rank_window import is_rank_set

    shown = []
    monkeypatch.setattr(dialogs, "show_error", lambda parent, t, x, details="": shown.append(x))
    window = MainWindow(QSettings(str(tmp_path / "s.ini"), QSettings.Format.IniFormat))
    qtbot.addWidget(window)
    assert window.ranks_launcher.action in window.menus["File"].actions()
    ranks = window.ranks_launcher.open_with([folder / "row.rank0.sft", folder / "row.rank1.sft"])
    assert ranks is not None and ranks.ranks.ranks == [0, 1]
    ranks.close()
    assert window.ranks_launcher.open_with([folder / "row.rank0.sft"] * 2) is None
    assert "rank 0 is also" in shown[0]
    assert is_rank_set([folder / "row.sft"]) and not is_rank_set([folder / "row.rank0.sft"])
    assert window.open_path(folder / "row.rank1.sft")  # one rank alone: a hint
    qtbot.waitUntil(lambda: window.statusBar().currentMessage().startswith("rank 1 of 2"))
    assert "row.rank0.sft, row.rank1.sft" in window.statusBar().currentMessage()
    # steps without tensors (a barrier) and without inputs (a recv) show like any other
    p2p = window.ranks_launcher.open_with([folder / "p2p.sft"])
    for position in range(len(p2p.compare.entries)):
        p2p.compare.go_to(position)
        assert p2p.compare.position == position


def test_cli_traces_your_own_tensor_parallel_model_on_every_rank(folder):
    ranks = load_ranks(folder / "own.sft")
    assert ranks.ranks == [0, 1] and ranks.first_divergence() is None
    first = ranks.first
    linear0 = next(s for s in first.steps if s.module == "0" and s.op == "linear")
    hidden = workers.mlp()[0](workers.mlp_input()).detach()  # the same seeds as the file
    torch.testing.assert_close(ranks.stitched(linear0.outputs[0]), hidden)
    for rank in ranks:
        out = ranks[rank].value(ranks[rank].steps[0].outputs[0])
        torch.testing.assert_close(out, workers.mlp()(workers.mlp_input()).detach())


# --------------------------------------------------------------------------- FSDP


def test_fsdp_unshard_all_gathers_are_steps_and_the_output_is_the_unsharded_models(folder):
    ranks = load_ranks(folder / "fsdp.sft")
    ref = workers.mlp()
    x = workers.mlp_input()
    for rank in ranks:
        trace = ranks[rank]
        gathers = [c for c in collectives_of(trace) if c["op"] == "all_gather_single"]
        assert len(gathers) == 2 and all(c["ranks"] == [0, 1] for c in gathers)
        for c in gathers:  # rank's flat shard in, every rank's shards out
            step = trace.steps[c["index"]]
            (shard,), (whole,) = step.inputs, step.outputs
            assert trace.tensors[whole].shape[0] == 2 * trace.tensors[shard].shape[0]
            n = trace.tensors[shard].shape[0]
            torch.testing.assert_close(
                trace.value(whole)[rank * n : (rank + 1) * n], trace.value(shard)
            )
        assert len([s for s in trace.steps if s.op == "all_gather_single"]) == 2  # once each
        torch.testing.assert_close(trace.value(trace.steps[0].outputs[0]), ref(x).detach())
    assert ranks.first_divergence() is None


# --------------------------------------------------------------------------- point to point


def test_send_recv_barrier_and_async_pairs_are_steps(folder):
    ranks = load_ranks(folder / "p2p.sft")
    x = workers.mlp_input()
    sender, receiver = ranks[0], ranks[1]
    ops = [c["op"] for c in collectives_of(sender)]
    assert ops == ["send", "barrier", "isend"]
    assert [c["op"] for c in collectives_of(receiver)] == ["recv", "barrier", "irecv"]
    recv = next(c for c in collectives_of(receiver) if c["op"] == "recv")
    assert recv["src"] == 0 and recv["ranks"] == [0, 1]
    step = receiver.steps[recv["index"]]
    assert step.inputs == () and len(step.outputs) == 1
    torch.testing.assert_close(receiver.value(step.outputs[0]), x)  # what rank 0 sent
    barrier = receiver.steps[collectives_of(receiver)[1]["index"]]
    assert barrier.inputs == () and barrier.outputs == ()
    irecv = receiver.steps[collectives_of(receiver)[2]["index"]]
    # issued, not yet written: the shape is kept, no statistics
    assert receiver.tensors[irecv.outputs[0]].stats is None
    assert receiver.graph.number_of_nodes() == len(receiver.steps)
    torch.testing.assert_close(receiver.value(receiver.steps[0].outputs[0]), 2 * x)


# --------------------------------------------------------------------------- DDP training step


def _twins(path):
    from safetensors.torch import load_file

    return load_file(str(path))


def _backward_collectives(trace):
    return [c for c in collectives_of(trace) if c.get("phase") == "backward"]


def _averaged_grads():
    """The traced step's gradients computed here, in one process: the warm-up step replayed
    (both ranks' batches, gradients averaged, SGD), then both batches again: the averaged
    gradients DDP's all-reduce should leave."""
    model = workers.demo_model()
    opt = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
    for _ in ("warm-up", "traced"):
        opt.zero_grad()
        for rank in (0, 1):
            x = workers.rank_tokens(rank)
            (workers.demo_loss(model(x), x) / 2).backward()
        grads = {n: p.grad.clone() for n, p in model.named_parameters()}
        opt.step()
    return grads


def test_traced_ddp_step_records_each_bucket_all_reduce_among_the_backward_steps(folder, capsys):
    ranks = load_ranks(folder / "ddp_step.sft")
    assert ranks.ranks == [0, 1] and not ranks.replicas_expected()  # each rank its own data
    averaged = _averaged_grads()
    for rank in ranks:
        trace = ranks[rank]
        reduces = _backward_collectives(trace)
        assert len(reduces) > 1  # small buckets: several all-reduces
        names = [n for c in reduces for n in c["params"]]
        assert sorted(names) == sorted("module." + n for n in averaged)  # each parameter once
        assert [c["bucket"] for c in reduces] == list(range(len(reduces)))  # in bucket order
        grads_at = {trace.steps[trace.tensors[rid].producer].index: n
                    for n, rid in trace.meta["param_grads"].items()}  # fmt: skip
        forward_steps = trace.meta["forward_steps"]
        for c in reduces:
            assert (c["api"], c["op"], c["reduce_op"]) == ("DDP", "all_reduce", "sum")
            assert c["ranks"] == [0, 1] and c["what"] == "gradient bucket"
            step = trace.steps[c["index"]]
            assert (step.kind, step.op) == ("backward", "all_reduce")
            assert step.index > forward_steps
            assert step.input_names == step.output_names == tuple(c["params"])
            # launched as its last gradient arrived: right after that AccumulateGrad step
            before = trace.steps[step.index - 1]
            assert before.op == "AccumulateGrad" and grads_at[before.index] in c["params"]
            assert all(i < step.index for i, n in grads_at.items() if n in c["params"])
            for name, sent, got in zip(c["params"], step.inputs, step.outputs):
                own = trace.tensors[trace.meta["param_grads"][name]]
                assert trace.tensors[sent].shape == trace.tensors[got].shape == own.shape
                # sent: this rank's gradient / world size; received: the average
                torch.testing.assert_close(trace.value(sent), trace.value(own.id) / 2)
                torch.testing.assert_close(
                    trace.value(got), averaged[name.removeprefix("module.")], rtol=1e-5, atol=1e-7
                )
                assert trace.meta["distributed"]["reduced_grads"][name] == got
        # interleaved: backward steps run after the first all-reduce, not all at the end
        assert reduces[0]["index"] < len(trace.steps) - 10
    # the bucket all-reduces should agree across ranks, and do; the ranks' own gradients differ
    first = ranks.first
    for c in _backward_collectives(first):
        assert ranks.should_agree(c["index"], replicas=False) == "all_reduce output"
        a, b = ranks[0].steps[c["index"]], ranks[1].steps[c["index"]]
        for ta, tb in zip(a.outputs, b.outputs):
            assert torch.equal(ranks[0].value(ta), ranks[1].value(tb))
    assert ranks.first_divergence() is None
    from app.cli import main

    assert main(["report", str(folder / "ddp_step.sft")]) == 0
    n = len(reduces[0]["params"])
    assert f"| all_reduce | DDP | 0 [0, 1] | sum, backward, bucket 0: {n} gradients |" in (
        capsys.readouterr().out
    )


def test_traced_ddp_step_leaves_gradients_and_weights_bit_for_bit_as_untraced(folder):
    for rank in (0, 1):
        saved = _twins(folder / f"ddp_step_grads.rank{rank}.safetensors")
        traced = {k.removeprefix("traced."): v for k, v in saved.items() if k.startswith("traced.")}
        for key, value in traced.items():
            assert torch.equal(value, saved[f"plain.{key}"]), key
        trace = load_ranks(folder / "ddp_step.sft")[rank]
        for name, rid in trace.meta["distributed"]["reduced_grads"].items():
            assert torch.equal(trace.value(rid), traced[f"grad.{name}"])  # what .grad holds


def test_traced_gradient_accumulation_reduces_the_sum_once(folder):
    local = load_ranks(folder / "ddp_local.sft")
    synced = load_ranks(folder / "ddp_sync.sft")
    for rank in (0, 1):
        assert _backward_collectives(local[rank]) == []
        assert any("no_sync" in n for n in local[rank].meta["notes"])
        trace = synced[rank]
        reduces = _backward_collectives(trace)
        saved = _twins(folder / f"ddp_sync_grads.rank{rank}.safetensors")
        micro = local[rank]
        for c in reduces:
            step = trace.steps[c["index"]]
            for name, sent, got in zip(c["params"], step.inputs, step.outputs):
                # what DDP sends is both micro-steps' gradients summed, / world size
                both = micro.value(micro.meta["param_grads"][name]) + trace.value(
                    trace.meta["param_grads"][name]
                )
                torch.testing.assert_close(trace.value(sent), both / 2)
                assert torch.equal(trace.value(got), saved[f"traced.grad.{name}"])
        for key in [k for k in saved if k.startswith("traced.")]:
            assert torch.equal(saved[key], saved["plain." + key.removeprefix("traced.")]), key


# --------------------------------------------------------------------------- FSDP training steps


def _sharded_step_checks(folder, stem):
    """A traced FSDP step: its backward reduce-scatters are steps after the forward, each
    rank keeps its shard of the averaged gradient, and the twins match bit for bit."""
    step = load_ranks(folder / f"{stem}.sft")
    ref = workers.mlp()
    for rank in (0, 1):  # the averaged gradient, computed here in one process
        (workers.mlp_loss(ref(workers.mlp_input() * (rank + 1))) / 2).backward()
    scattered = {}
    for rank in (0, 1):
        trace = step[rank]
        backward = _backward_collectives(trace)
        scatters = [c for c in backward if c["op"].startswith("reduce_scatter")]
        assert scatters and all(c["ranks"] == [0, 1] for c in scatters)
        for c in scatters:
            s = trace.steps[c["index"]]
            assert s.kind == "backward" and s.index > trace.meta["forward_steps"]
            (sent,), (got,) = s.inputs, s.outputs
            assert trace.tensors[sent].shape[0] == 2 * trace.tensors[got].shape[0]
            scattered.setdefault(rank, []).append(trace.value(got))
        saved = _twins(folder / f"{stem}_grads.rank{rank}.safetensors")
        for key in [k for k in saved if k.startswith("traced.")]:
            assert torch.equal(saved[key], saved["plain." + key.removeprefix("traced.")]), key
    assert step.first_divergence() is None
    return ref, scattered


def test_fsdp1_all_gathers_in_the_forward_and_reduce_scatters_in_the_backward(folder):
    forward = load_ranks(folder / "fsdp1.sft")
    ref = workers.mlp()
    for rank in (0, 1):
        trace = forward[rank]
        gathers = [c for c in collectives_of(trace) if c["op"].startswith("all_gather")]
        assert gathers and all(c["ranks"] == [0, 1] for c in gathers)
        x = workers.mlp_input() * (rank + 1)
        torch.testing.assert_close(trace.value(trace.steps[0].outputs[0]), ref(x).detach())
    ref, scattered = _sharded_step_checks(folder, "fsdp1_step")
    # one flat parameter for the whole MLP: rank r keeps part r of its averaged gradient
    flat = torch.cat([p.grad.flatten() for p in ref.parameters()])
    (mine0,), (mine1,) = scattered[0], scattered[1]
    got = torch.cat([mine0, mine1])[: flat.numel()]
    torch.testing.assert_close(got, flat, rtol=1e-5, atol=1e-7)


def test_fsdp2_training_step_records_backward_gathers_and_reduce_scatters(folder):
    step = load_ranks(folder / "fsdp_step.sft")
    ops = [c["op"] for c in _backward_collectives(step.first)]
    assert "all_gather_single" in ops  # resharded after the forward: gathered again
    ref, scattered = _sharded_step_checks(folder, "fsdp_step")
    # one reduce-scatter per Linear, the last one first; rank r keeps its rows of each of
    # the Linear's parameters, one after another
    for rank in (0, 1):
        assert len(scattered[rank]) == 2
        for got, layer in zip(scattered[rank], (ref[2], ref[0])):
            rows = [p.grad[rank * (len(p) // 2) : (rank + 1) * (len(p) // 2)] for p in
                    (layer.weight, layer.bias)]  # fmt: skip
            expect = torch.cat([r.flatten() for r in rows])
            torch.testing.assert_close(got[: expect.numel()], expect, rtol=1e-5, atol=1e-7)


def test_nothing_stays_attached_to_a_traced_ddp_model(folder):
    """After the traced steps: no comm hook or module hook, and untraced steps go on bit
    for bit like the twin that was never traced."""
    for rank in (0, 1):
        attached = json.loads((folder / f"ddp_attached.rank{rank}.json").read_text())
        assert attached == {"comm_hook": None, "comm_hooks": 0, "module_hooks": 0}
        saved = _twins(folder / f"ddp_after_grads.rank{rank}.safetensors")
        for key in [k for k in saved if k.startswith("traced.")]:
            assert torch.equal(saved[key], saved["plain." + key.removeprefix("traced.")]), key
