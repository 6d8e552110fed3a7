"""Patching sweeps (tracing.patching): each cell equals the same patch made through a full
trace with a Patch from a values trace (an independent path: the tracer's instruments and
a trace's stored values instead of hooks and a kept dict)."""

from __future__ import annotations

import threading

import pytest
import torch
from helpers.tiny_models import tiny_gpt2

import scratchformer
import tracing
from tracing.capture.edits import Edit, Patch
from tracing.runs.patching import head_sites, logit_difference, sweep
from tracing.sites import site_steps


@pytest.fixture(scope="module")
def demo():
    model = scratchformer.demo_model()
    tok = scratchformer.ByteTokenizer()
    clean = torch.tensor([tok.encode("wordplay|yalp")])
    corrupted = torch.tensor([tok.encode("workplay|yalp")])
    return model, clean, corrupted


def _traced_metric(model, clean, corrupted, site, **options):
    """The metric of one patched run made through tracing.trace and a values trace."""
    clean_trace = tracing.trace(model, clean, capture="values")
    edit = Edit(site, Patch(clean_trace), **options)
    t = tracing.trace(model, corrupted, capture="values", edits=[edit])
    logits = t.value(site_steps(t, "")[0].outputs[0])
    with torch.no_grad():
        metric, _ = logit_difference(model(clean), model(corrupted))
    return metric(logits)


def test_head_sweep_cells_match_traced_patches(demo):
    model, clean, corrupted = demo
    result = sweep(model, clean, corrupted, over="heads")
    n_layers, n_heads = model.config.n_layers, model.config.n_heads
    assert result.values.shape == (n_layers, n_heads)
    assert result.rows == [f"layer {i}" for i in range(n_layers)]
    assert not result.cancelled and result.runs == n_layers * n_heads
    for layer, head in [(0, 1), (1, 3)]:
        site = f"blocks.{layer}.self_attn.attention"
        expected = _traced_metric(model, clean, corrupted, site, head=head)
        assert result.values[layer, head].item() == pytest.approx(expected, abs=1e-5)
    assert result.clean_metric > result.corrupted_metric  # the corruption changed the answer


def test_layer_and_position_sweeps_restore_the_clean_metric_at_the_end(demo):
    model, clean, corrupted = demo
    layers = sweep(model, clean, corrupted, over="layers")
    assert layers.rows == ["blocks.0", "blocks.1"]
    assert layers.values[-1, 0].item() == layers.clean_metric  # exactly: same residual
    positions = sweep(model, clean, corrupted, over="positions")
    assert positions.values.shape == (2, clean.shape[1])
    # logits at the last position depend on the last block's output there only
    assert positions.values[-1, -1].item() == positions.clean_metric
    assert positions.values[-1, 0].item() == positions.corrupted_metric  # a token unchanged
    norm = positions.normalized()
    assert norm[-1, -1].item() == pytest.approx(1.0)


def test_sweep_over_sites_and_csv(demo):
    model, clean, corrupted = demo
    result = sweep(model, clean, corrupted, over=["blocks.0.feed_forward", "blocks.1"])
    assert result.rows == ["blocks.0.feed_forward", "blocks.1"]
    lines = result.to_csv().splitlines()
    assert lines[0] == "sites,patched"
    assert lines[2].startswith("blocks.1,") and float(lines[2].split(",")[1]) == pytest.approx(
        result.clean_metric
    )


def test_progress_and_cancel(demo):
    model, clean, corrupted = demo
    seen = []
    stop = threading.Event()

    def progress(done, total):
        seen.append((done, total))
        if done == 3:
            stop.set()

    result = sweep(model, clean, corrupted, over="heads", progress=progress, cancel=stop)
    assert seen == [(1, 8), (2, 8), (3, 8)]
    assert result.cancelled and result.runs == 3
    assert int(torch.isfinite(result.values).sum()) == 3


def test_hf_gpt2_head_sites_and_sweep():
    model = tiny_gpt2(seed=2)
    clean = torch.randint(0, 97, (1, 8))
    corrupted = clean.clone()
    corrupted[0, 2] = (corrupted[0, 2] + 1) % 97
    sites = head_sites(tracing.trace(model, clean, capture="shapes"))
    assert [str(s) for s, _ in sites] == [
        "transformer.h.0.attn@0:matmul#1",
        "transformer.h.1.attn@0:matmul#1",
    ]
    result = sweep(model, clean, corrupted, over="heads")
    expected = _traced_metric(model, clean, corrupted, sites[1][0], head=2)
    assert result.values[1, 2].item() == pytest.approx(expected, abs=1e-5)


def test_mismatched_inputs_are_one_clear_error(demo):
    model, clean, _ = demo
    with pytest.raises(ValueError, match="same shape"):
        sweep(model, clean, clean[:, :-1])
    with pytest.raises(ValueError, match="over must be"):
        sweep(model, clean, clean, over="neurons")
