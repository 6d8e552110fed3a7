"""Tracing a generation: one pass per token, same tokens as generate(), save and load."""

from __future__ import annotations

import json
from dataclasses import replace

import pytest
import torch

import tracing
from scratchformer import DecoderOnlyTransformer, ModelConfig
from tracing.dims.passes import in_pass
from tracing.errors import TraceFileError
from tracing.runs.generation import load_generation, trace_generate


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


# --------------------------------------------------------------------------- streamed to a folder


class _Flaky(torch.nn.Module):
    """The model, raising ``error`` in the pass that sees ``at`` tokens (after its blocks ran)."""

    def __init__(self, inner, at: int, error: BaseException):
        super().__init__()
        self.inner, self.at, self.error = inner, at, error

    def forward(self, idx):
        logits = self.inner(idx)
        if idx.size(1) >= self.at and not in_pass():  # (dims' pass at other sizes: not one)
            raise self.error
        return logits


def _same_passes(a, b) -> None:
    """Equal records and values (the root step's source is the caller's line, so apart)."""
    assert a.steps[1:] == b.steps[1:] and a.tensors == b.tensors and a.error == b.error
    assert replace(a.steps[0], source=None) == replace(b.steps[0], source=None)
    assert set(a.values) == set(b.values) and len(a.values) > 0
    for key in a.values:
        assert torch.equal(a.values[key], b.values[key]), key


def test_a_streamed_generation_equals_one_kept_in_memory(model, tmp_path):
    from tracing.file.lazy_values import LazyValues

    prompt = torch.tensor([[5, 17, 42]])
    memory = trace_generate(model, prompt, 3, capture="values")
    streamed = trace_generate(model, prompt, 3, capture="values", out=tmp_path / "run.gen")
    assert streamed.tokens == memory.tokens and streamed.probs == memory.probs
    assert all(isinstance(t.values, LazyValues) for t in streamed.passes)  # read from the files
    loaded = load_generation(tmp_path / "run.gen")
    assert loaded.complete and loaded.tokens == memory.tokens
    for m, s, f in zip(memory.passes, streamed.passes, loaded.passes, strict=True):
        _same_passes(m, s)
        _same_passes(m, f)
    names = sorted(p.name for p in (tmp_path / "run.gen").iterdir())
    assert names == ["index.json", "pass_000.trace", "pass_001.trace", "pass_002.trace"]
    # stream=False: the same folder, written at the end
    saved = trace_generate(
        model, prompt, 3, capture="values", out=tmp_path / "saved.gen", stream=False
    )
    assert isinstance(saved.passes[0].values, dict)
    for m, f in zip(memory.passes, load_generation(tmp_path / "saved.gen").passes, strict=True):
        _same_passes(m, f)


def test_a_pass_that_raises_leaves_a_valid_partial_folder(model, tmp_path):
    flaky = _Flaky(model, at=5, error=ValueError("boom"))  # prompt of 3: the 3rd pass raises
    with pytest.raises(tracing.TraceError, match="boom") as info:
        trace_generate(flaky, torch.tensor([[5, 17, 42]]), 4, capture="values", out=tmp_path)
    partial = info.value.generation
    assert len(partial.passes) == 2 and len(partial.tokens) == 2 and "boom" in partial.error
    loaded = load_generation(tmp_path)
    assert not loaded.complete and "boom" in loaded.error and loaded.tokens == partial.tokens
    assert not loaded.failed.complete and loaded.failed.meta["generation_pass"] == 2
    _same_passes(partial.failed, loaded.failed)  # the failing pass's values up to the raise
    assert any(s.module == "inner.blocks.1" for s in loaded.failed.steps)


def test_an_interrupted_generation_says_so_and_one_stopped_from_outside_is_no_generation(
    model, tmp_path
):
    prompt = torch.tensor([[5, 17, 42]])
    trace_generate(model, prompt, 2, out=tmp_path)  # a complete folder first ...
    with pytest.raises(KeyboardInterrupt):  # ... rewritten by a generation Ctrl-C stops
        trace_generate(_Flaky(model, 4, KeyboardInterrupt()), prompt, 3, out=tmp_path)
    loaded = load_generation(tmp_path)
    assert not loaded.complete and "KeyboardInterrupt" in loaded.error
    assert len(loaded.passes) == 1 and loaded.failed is not None
    with pytest.raises(SystemExit):  # stopped from outside: the stale index is gone too
        trace_generate(_Flaky(model, 4, SystemExit(3)), prompt, 3, out=tmp_path)
    with pytest.raises(TraceFileError, match=r"no index\.json"):
        load_generation(tmp_path)
    assert not [p for p in tmp_path.iterdir() if p.name.endswith(".partial")]


def test_generate_command_traces_to_a_folder(tmp_path, capsys):
    from app.cli import main

    argv = ["generate", "--demo", "--prompt", "hello|", "--temperature", "0"]
    argv += ["--max-new-tokens", "3"]
    assert main(argv) == 0
    plain = capsys.readouterr().out
    folder = tmp_path / "run.gen"
    assert main([*argv, "--trace", str(folder), "--capture", "values"]) == 0
    assert capsys.readouterr().out == plain  # the same text, traced
    generation = load_generation(folder)
    assert generation.complete and 1 <= len(generation.passes) <= 3
    assert generation.passes[0].values  # values streamed into the pass files
    (tmp_path / "file").write_text("x")
    assert main([*argv, "--trace", str(tmp_path / "file")]) == 2
    assert "not a folder" in capsys.readouterr().err
