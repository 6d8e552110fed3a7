"""Head edits addressed to the attention module, on every attention the tracer recognises.

``Edit(<attention module>, Zero(), head=h)`` finds the head's output inside the module from
what the trace recorded; the reference is independent of the tracer: a copy of the model
whose output projection has head h's input columns zeroed (``W_o``, ``o_proj``,
``c_proj``, ``out_proj``; HF GPT-2's ``Conv1D`` is ``x @ W``, so there its *rows*).
"""

from __future__ import annotations

import pytest
import torch
from helpers.head_models import KINDS
from helpers.head_models import ids as _ids
from helpers.head_models import surgery as _surgery

import tracing
from tracing.capture.edits import Edit, EditError, Zero
from tracing.runs.edit_run import run_edited
from tracing.runs.patching import output_logits, sweep

transformers = pytest.importorskip("transformers")


@pytest.fixture(scope="module", params=list(KINDS))
def kind(request):
    k = KINDS[request.param]
    return k, k.build()


def _logits(output):
    return output_logits(output)


@pytest.mark.parametrize("layer,head", [(0, 0), (1, -1)])
def test_zeroing_a_head_by_module_path_equals_out_projection_surgery(kind, layer, head):
    kind, model = kind
    head = head % kind.heads
    ids = _ids(kind.vocab)
    path = kind.attention.format(layer)
    edit = Edit(path, Zero(), head=head)
    with torch.no_grad():
        expected = _logits(_surgery(kind, model, layer, head)(ids))
        plain = _logits(model(ids))
        hooked = _logits(run_edited(model, ids, edits=[edit]))
    traced = tracing.trace(model, ids, capture="values", edits=[edit])
    from_trace = _logits(traced.value(traced.steps[0].outputs[0]))
    torch.testing.assert_close(hooked, expected, rtol=0, atol=2e-6)
    torch.testing.assert_close(from_trace, expected, rtol=0, atol=2e-6)
    assert (hooked - plain).abs().max() > 1e-3  # the head mattered
    (entry,) = traced.meta["edits"]
    assert entry["steps"]  # it applied
    if kind.resolved:  # found inside the attention module, from the recorded map
        assert entry["site"] == kind.resolved.format(layer) and entry["via"] == path
        assert f"its per-head output {kind.resolved.format(layer)}" in entry["describe"]
    else:  # nn.MultiheadAttention: the module itself (tracing.capture.heads)
        assert entry["site"] == path and entry["via"] is None
    if kind.kv_heads:  # GQA: the query head, and the key/value head it reads
        group = kind.heads // kind.kv_heads
        assert (
            f"query head {head}; it shares key/value head {head // group} of 2"
            in (entry["describe"])
        )


def test_a_plan_resolves_once_and_keeps_the_site():
    """A plan reused on the same model does not look for the site again."""
    kind = KINDS["llama-sdpa-gqa"]
    model, ids = kind.build(), _ids(kind.vocab)
    from tracing.capture.edits import EditPlan

    plan = EditPlan.of([Edit("model.layers.0.self_attn", Zero(), head=5)])
    with torch.no_grad():
        first = run_edited(model, ids, edits=plan)
        resolved = plan.edits[0]
        second = run_edited(model, ids, edits=plan)
    assert plan.edits[0] is resolved and str(resolved.site).endswith("#0")
    assert torch.equal(first.logits, second.logits)


@pytest.mark.parametrize(
    "kind_name,path,message",
    [
        ("scratchformer", "", r"2 attention layers ran inside it.*blocks\.0\.self_attn\.attention"),
        ("transformer-decoder", "dec.layers.0", r"2 attention layers.*multihead_attn"),
        ("llama-sdpa-gqa", "model.layers.0.mlp", r"no attention map was recorded inside"),
    ],
)
def test_no_site_or_several_is_an_error_naming_the_sites(kind_name, path, message):
    kind = KINDS[kind_name]
    model, ids = kind.build(), _ids(kind.vocab)
    edit = Edit(path, Zero(), head=1)
    with pytest.raises(tracing.TraceError, match=message):
        tracing.trace(model, ids, capture="shapes", edits=[edit])
    with pytest.raises(EditError, match=message), torch.no_grad():
        run_edited(model, ids, edits=[edit])


def test_a_block_with_one_attention_resolves_to_it():
    kind = KINDS["nanogpt-sdpa"]
    model, ids = kind.build(), _ids(kind.vocab)
    with torch.no_grad():
        by_block = run_edited(model, ids, edits=[Edit("transformer.h.1", Zero(), head=2)])
        by_attn = run_edited(model, ids, edits=[Edit("transformer.h.1.attn", Zero(), head=2)])
    assert torch.equal(by_block, by_attn)


def test_heads_sweep_on_every_kind(kind):
    """One result per head per layer; a sweep that zeroes (``action=Zero()``) gives, in
    each cell, the metric of the single module-path edit of that head."""
    kind, model = kind
    clean = _ids(kind.vocab, seed=1, shape=(1, 6))
    corrupted = clean.clone()
    corrupted[0, 2] = (corrupted[0, 2] + 1) % kind.vocab
    rows = kind.rows()
    result = sweep(model, clean, corrupted, over="heads")
    assert result.values.shape == (len(rows), kind.heads) and torch.isfinite(result.values).all()
    assert result.runs == len(rows) * kind.heads
    assert result.rows == (rows if kind.extra else ["layer 0", "layer 1"])
    metric = _metric(model, clean)
    ablation = sweep(model, clean, clean, over="heads", action=Zero(), metric=metric)
    assert ablation.values.shape == (len(rows), kind.heads)
    for row, path, head in ((0, rows[0], 0), (len(rows) - 1, rows[-1], kind.heads - 1)):
        with torch.no_grad():
            single = metric(run_edited(model, clean, edits=[Edit(path, Zero(), head=head)]))
        assert ablation.values[row, head].item() == pytest.approx(single, abs=1e-5)
    assert (ablation.values - ablation.clean_metric).abs().max() > 1e-3  # heads mattered


def _metric(model, ids):
    with torch.no_grad():
        token = int(_logits(model(ids))[0, -1].argmax())

    def logit_of_clean_prediction(output):
        return float(_logits(output)[0, -1, token])

    return logit_of_clean_prediction
