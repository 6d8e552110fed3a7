"""The model: config, parameter counts, causality, switches, generation."""

from __future__ import annotations

import json

import pytest
import torch
from helpers.tiny_models import tiny_config

from scratchformer import (
    ByteTokenizer,
    DecoderOnlyTransformer,
    LearnedPositionalEncoding,
    ModelConfig,
    SinusoidalPositionalEncoding,
)

pytestmark = pytest.mark.usefixtures("one_thread")


def tiny(**overrides) -> ModelConfig:
    """The shared tiny config at other widths (C=24, H=3, F=48)."""
    return tiny_config(**{"d_model": 24, "n_heads": 3, "d_ff": 48, **overrides})


# --- config


def test_config_round_trips_through_json():
    cfg = ModelConfig.preset("gpt2-small")
    assert ModelConfig.from_dict(json.loads(json.dumps(cfg.to_dict()))) == cfg
    assert cfg.d_head == 64


@pytest.mark.parametrize(
    "bad, message",
    [
        (dict(d_model=30, n_heads=4), "not divisible"),
        (dict(activation="swish"), "activation"),
        (dict(norm_position="middle"), "norm_position"),
        (dict(positional="rotary"), "positional"),
        (dict(n_layers=0), "n_layers"),
    ],
)
def test_config_rejects_bad_values(bad, message):
    with pytest.raises(ValueError, match=message):
        tiny(**bad)


def test_config_from_dict_names_unknown_fields():
    data = tiny().to_dict() | {"n_experts": 8}
    with pytest.raises(ValueError, match="n_experts"):
        ModelConfig.from_dict(data)


def test_unknown_preset():
    with pytest.raises(ValueError, match="gpt5"):
        ModelConfig.preset("gpt5")


# --- parameters


def test_gpt2_small_has_124_439_808_parameters():
    with torch.device("meta"):  # shapes only, no memory
        model = DecoderOnlyTransformer(ModelConfig.preset("gpt2-small"))
    assert model.lm_head.weight is model.token_embedding.weight
    unique = {id(p): p.numel() for p in model.parameters()}
    assert sum(unique.values()) == 124_439_808
    assert model.num_parameters() == 124_439_808


def test_parameter_count_matches_torchinfo():
    torchinfo = pytest.importorskip("torchinfo")
    # untied: torchinfo counts a tied matrix once per module that holds it, we count it once
    model = DecoderOnlyTransformer(tiny(tie_weights=False))
    stats = torchinfo.summary(model, input_data=torch.zeros(1, 8, dtype=torch.long), verbose=0)
    assert stats.total_params == model.num_parameters() == 12_576


def test_untied_model_has_separate_head():
    model = DecoderOnlyTransformer(tiny(tie_weights=False))
    assert model.lm_head.weight is not model.token_embedding.weight
    tied = DecoderOnlyTransformer(tiny())
    assert model.num_parameters() - tied.num_parameters() == 50 * 24


def test_module_paths_the_app_shows():
    names = dict(DecoderOnlyTransformer(tiny()).named_modules())
    for path in (
        "token_embedding",
        "position_encoding",
        "dropout",
        "blocks.1.norm1",
        "blocks.1.self_attn.W_q",
        "blocks.1.self_attn.attention",
        "blocks.1.dropout",
        "blocks.1.norm2",
        "blocks.1.feed_forward.linear1",
        "blocks.1.feed_forward.activation",
        "blocks.1.feed_forward.linear2",
        "final_norm",
        "lm_head",
    ):
        assert path in names, path


# --- forward


def test_forward_shapes_and_loss():
    model = DecoderOnlyTransformer(tiny())
    idx = torch.randint(0, 50, (3, 10))
    logits = model(idx)
    assert logits.shape == (3, 10, 50)
    logits2, loss = model(idx, idx)
    torch.testing.assert_close(logits, logits2)
    # untrained GPT-2-style init predicts close to uniform: loss near ln(V)
    assert abs(loss.item() - torch.log(torch.tensor(50.0)).item()) < 0.5


def test_causality_future_tokens_do_not_change_the_past():
    model = DecoderOnlyTransformer(tiny()).eval()
    idx = torch.randint(0, 50, (2, 12))
    t = 6
    changed = idx.clone()
    changed[:, t + 1 :] = (changed[:, t + 1 :] + 7) % 50
    a, b = model(idx), model(changed)
    torch.testing.assert_close(a[:, : t + 1], b[:, : t + 1], rtol=0, atol=1e-6)
    assert (a[:, t + 1 :] - b[:, t + 1 :]).abs().max() > 1e-3  # and the future does change


@pytest.mark.parametrize("cfg", [tiny(norm_position="post"), tiny(positional="sinusoidal")])
def test_causality_holds_for_every_switch(cfg):
    model = DecoderOnlyTransformer(cfg).eval()
    idx = torch.randint(0, 50, (1, 10))
    changed = idx.clone()
    changed[:, 5:] = (changed[:, 5:] + 1) % 50
    torch.testing.assert_close(model(idx)[:, :5], model(changed)[:, :5], rtol=0, atol=1e-6)


def test_prompt_longer_than_block_size_is_a_clear_error():
    model = DecoderOnlyTransformer(tiny())
    with pytest.raises(ValueError, match=r"17 tokens.*block_size 16"):
        model(torch.zeros(1, 17, dtype=torch.long))


def test_bad_token_tensor_is_a_clear_error():
    model = DecoderOnlyTransformer(tiny())
    with pytest.raises(ValueError, match=r"\(B, T\)"):
        model(torch.zeros(5, dtype=torch.long))
    with pytest.raises(ValueError, match="integers"):
        model(torch.zeros(1, 5))


# --- switches


def test_post_ln_and_sinusoidal_run_and_differ():
    idx = torch.randint(0, 50, (2, 9))
    outputs = {}
    for name, cfg in {
        "pre/learned": tiny(),
        "post/learned": tiny(norm_position="post"),
        "pre/sinusoidal": tiny(positional="sinusoidal"),
        "relu": tiny(activation="relu"),
    }.items():
        torch.manual_seed(0)  # same initial weights wherever the parameters coincide
        model = DecoderOnlyTransformer(cfg).eval()
        outputs[name] = model(idx)
        assert torch.isfinite(outputs[name]).all()
    base = outputs.pop("pre/learned")
    for name, out in outputs.items():
        assert (out - base).abs().max() > 1e-4, name


def test_sinusoidal_table_is_the_vaswani_formula():
    pe = SinusoidalPositionalEncoding(block_size=10, d_model=8).pe
    t, i = 7, 2  # pe[t, 2i] = sin(t / 10000^(2i/C)), pe[t, 2i+1] = cos(...)
    angle = torch.tensor(t / 10000 ** (2 * i / 8))
    torch.testing.assert_close(pe[t, 2 * i], torch.sin(angle))
    torch.testing.assert_close(pe[t, 2 * i + 1], torch.cos(angle))
    model = DecoderOnlyTransformer(tiny(positional="sinusoidal"))
    assert not any("position_encoding" in n for n, _ in model.named_parameters())
    assert isinstance(DecoderOnlyTransformer(tiny()).position_encoding, LearnedPositionalEncoding)


def test_dropout_only_in_training_mode():
    model = DecoderOnlyTransformer(tiny(dropout=0.5))
    idx = torch.randint(0, 50, (1, 8))
    model.train()
    assert (model(idx) - model(idx)).abs().max() > 0
    model.eval()
    torch.testing.assert_close(model(idx), model(idx))


# --- generation


def test_greedy_generation_is_deterministic_argmax():
    model = DecoderOnlyTransformer(tiny()).eval()
    prompt = torch.randint(0, 50, (2, 4))
    a = model.generate(prompt, 8, temperature=0)
    b = model.generate(prompt, 8, temperature=0)
    assert a.shape == (2, 12)
    assert torch.equal(a, b) and torch.equal(a[:, :4], prompt)
    # the first new token is the argmax of the logits at the prompt's last position
    assert torch.equal(a[:, 4], model(prompt)[:, -1].argmax(-1))


def test_seeded_sampling_is_reproducible():
    model = DecoderOnlyTransformer(tiny()).eval()
    prompt = torch.randint(0, 50, (1, 3))

    def sample(seed):
        g = torch.Generator().manual_seed(seed)
        return model.generate(prompt, 12, temperature=1.5, top_k=10, generator=g)

    assert torch.equal(sample(1), sample(1))
    assert not torch.equal(sample(1), sample(2))


def test_top_k_one_equals_greedy():
    model = DecoderOnlyTransformer(tiny()).eval()
    prompt = torch.randint(0, 50, (1, 3))
    g = torch.Generator().manual_seed(0)
    sampled = model.generate(prompt, 6, temperature=0.7, top_k=1, generator=g)
    assert torch.equal(sampled, model.generate(prompt, 6, temperature=0))


def test_generation_crops_context_to_block_size():
    model = DecoderOnlyTransformer(tiny(block_size=8)).eval()
    out = model.generate(torch.randint(0, 50, (1, 6)), 10, temperature=0)
    assert out.shape == (1, 16)  # ran past block_size without error


def test_generation_stops_at_stop_token():
    model = DecoderOnlyTransformer(tiny()).eval()
    prompt = torch.randint(0, 50, (1, 3))
    free = model.generate(prompt, 6, temperature=0)
    stop = int(free[0, 4])  # the second generated token
    stopped = model.generate(prompt, 6, temperature=0, stop_token=stop)
    assert int(stopped[0, -1]) == stop and stopped.size(1) <= 5


# --- tokenizer


def test_byte_tokenizer_round_trips_any_text():
    tok = ByteTokenizer()
    text = "héllo, 世界 🙂\n\t"
    ids = tok.encode(text)
    assert ids == list(text.encode("utf-8")) and max(ids) < 256
    assert tok.decode(ids) == text
    assert tok.decode([*ids[:1], 0xE4]) == "h\N{REPLACEMENT CHARACTER}"  # cut-off character
    with pytest.raises(ValueError, match=r"0\.\.255"):
        tok.decode([300])
