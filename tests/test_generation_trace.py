"""Tracing a generation: one pass per token, same tokens as generate(), save and load."""

from __future__ import annotations

import json

import pytest
import torch

from scratchformer import DecoderOnlyTransformer, ModelConfig
from tracing.errors import TraceFileError
from tracing.generation import load_generation, trace_generate


@pytest.fixture(scope="module")
def model():
    torch.manual_seed(0)
    return DecoderOnlyTransformer(ModelConfig.preset("demo", n_layers=2, block_size=8)).eval()


@pytest.fixture(scope="module")
def generation(model):
    prompt = torch.tensor([[5, 17, 42]])
    return trace_generate(model, prompt, 4, capture="stats", decode=lambda ids: f"<{len(ids)}>")


def test_tokens_equal_greedy_generate(model, generation):
    expected = model.generate(torch.tensor([[5, 17, 42]]), 4, temperature=0)
    assert generation.sequence == expected[0].tolist()
    assert generation.prompt == [5, 17, 42] and len(generation.tokens) == 4
    assert len(generation) == 4


def test_attention_maps_grow_with_the_sequence(generation):
    for n in range(4):
        maps = generation.attention_maps(n)
        assert set(maps) == {"blocks.0.self_attn.attention", "blocks.1.self_attn.attention"}
        T = 3 + n
        for w in maps.values():
            assert tuple(w.shape) == (1, 4, T, T)  # (B, H, T, T)
        assert generation.passes[n].meta["tokens"] == generation.sequence[: 3 + n]
        assert generation.passes[n].meta["generation_pass"] == n
        assert generation.passes[n].meta["text"] == f"<{3 + n}>"


def test_context_is_cropped_to_block_size_like_generate(model):
    prompt = torch.tensor([[1, 2, 3, 4, 5, 6, 7]])  # block_size 8: the 3rd pass crops
    g = trace_generate(model, prompt, 3, capture="shapes")
    assert g.sequence == model.generate(prompt, 3, temperature=0)[0].tolist()
    assert [e.context_length for e in g.timeline()] == [7, 8, 8]
    assert g.passes[2].steps[0].inputs and g.passes[2].tensor(
        g.passes[2].steps[0].inputs[0]
    ).shape == (1, 8)


def test_timeline_and_global_step_navigation(model, generation):
    timeline = generation.timeline()
    assert [e.token for e in timeline] == generation.tokens
    assert [e.position for e in timeline] == [3, 4, 5, 6]
    # the recorded probability is the softmax of the model's last-position logits
    with torch.no_grad():
        logits = model(torch.tensor([generation.sequence[:3]]))[0, -1]
    assert timeline[0].prob == pytest.approx(float(torch.softmax(logits, -1).max()), rel=1e-5)
    n0 = len(generation.passes[0].steps)
    assert generation.locate(0) == (0, 0)
    assert generation.locate(n0) == (1, 0)
    assert generation.global_step(1, 5) == n0 + 5
    assert generation.locate(generation.step_count() - 1)[0] == 3
    with pytest.raises(IndexError):
        generation.locate(generation.step_count())


def test_sampling_is_reproducible_with_a_generator(model):
    prompt = torch.tensor([[9, 8]])
    g1 = trace_generate(model, prompt, 3, temperature=1.0, top_k=5, capture="shapes",
                        generator=torch.Generator().manual_seed(7))  # fmt: skip
    ref = model.generate(prompt, 3, temperature=1.0, top_k=5,
                         generator=torch.Generator().manual_seed(7))  # fmt: skip
    assert g1.sequence == ref[0].tolist()


def test_save_and_load(generation, tmp_path):
    folder = generation.save(tmp_path / "run.gen")
    index = json.loads((folder / "index.json").read_text())
    assert index["tokens"] == generation.tokens and len(index["passes"]) == 4
    loaded = load_generation(folder)
    assert loaded.tokens == generation.tokens and loaded.prompt == generation.prompt
    assert loaded.settings["capture"] == "stats"
    for a, b in zip(generation.passes, loaded.passes):
        assert a.steps == b.steps
        for key, w in a.attention_maps().items():
            torch.testing.assert_close(b.attention_maps()[key], w)


def test_bad_input_and_bad_folders(model, tmp_path):
    with pytest.raises(ValueError, match=r"shaped \(1, T\)"):
        trace_generate(model, torch.tensor([[1, 2], [3, 4]]), 2)
    with pytest.raises(ValueError, match="temperature"):
        trace_generate(model, torch.tensor([[1]]), 2, temperature=-1)
    with pytest.raises(TraceFileError, match=r"no index\.json"):
        load_generation(tmp_path)
    (tmp_path / "index.json").write_text(
        '{"format": "scratchformer-generation", "version": 1,'
        ' "prompt": [1], "tokens": [2], "passes": ["p.trace"]}'
    )
    with pytest.raises(TraceFileError, match=r"p\.trace is missing"):
        load_generation(tmp_path)
    (tmp_path / "index.json").write_text("{not json")
    with pytest.raises(TraceFileError, match="unreadable"):
        load_generation(tmp_path)
