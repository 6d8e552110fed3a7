"""Checkpoints: safetensors round trip, and a clear CheckpointError for every bad file."""

from __future__ import annotations

import json

import pytest
import torch
from helpers.tiny_models import tiny_config
from safetensors.torch import save_file

from scratchformer import (
    CheckpointError,
    DecoderOnlyTransformer,
    ModelConfig,
    load_checkpoint,
    read_metadata,
    save_checkpoint,
)


def tiny(**overrides) -> ModelConfig:
    """The shared tiny config, smaller still (a checkpoint's size does not matter here)."""
    return tiny_config(**{"vocab_size": 40, "block_size": 12, "d_model": 16, "n_heads": 2,
                          "d_ff": 32, **overrides})  # fmt: skip


@pytest.fixture
def saved(tmp_path):
    model = DecoderOnlyTransformer(tiny()).eval()
    path = save_checkpoint(model, tmp_path / "m.safetensors", extra_meta={"step": 7})
    return model, path


@pytest.mark.parametrize(
    "cfg",
    [tiny(), tiny(tie_weights=False), tiny(positional="sinusoidal", norm_position="post")],
    ids=["tied", "untied", "sinusoidal-post"],
)
def test_round_trip_gives_equal_outputs(tmp_path, cfg):
    model = DecoderOnlyTransformer(cfg).eval()
    path = save_checkpoint(model, tmp_path / "m.safetensors")
    loaded = load_checkpoint(path)
    assert loaded.config == cfg and not loaded.training
    idx = torch.randint(0, 40, (2, 10))
    assert torch.equal(model(idx), loaded(idx))
    if cfg.tie_weights:
        assert loaded.lm_head.weight is loaded.token_embedding.weight


def test_tied_matrix_stored_once_and_metadata(saved):
    from safetensors import safe_open

    _, path = saved
    with safe_open(str(path), framework="pt") as f:
        assert "lm_head.weight" not in f.keys()  # noqa: SIM118 (safe_open has no __contains__)
        assert "token_embedding.weight" in f.keys()  # noqa: SIM118
        assert not any("causal_mask" in k for k in f.keys())  # noqa: SIM118 (buffers are rebuilt)
    meta = read_metadata(path)
    assert meta["config"] == tiny().to_dict()
    assert meta["tokenizer"] == "byte" and meta["extra"] == {"step": 7}


def test_no_pickle_in_file(saved):
    _, path = saved
    assert path.read_bytes()[:1] != b"\x80"  # a pickle stream starts with PROTO 0x80


# --- every bad file gets a CheckpointError naming the problem and the path


def test_missing_file(tmp_path):
    path = tmp_path / "nope.safetensors"
    with pytest.raises(CheckpointError, match="not found") as e:
        load_checkpoint(path)
    assert str(path) in str(e.value)


def test_directory_instead_of_file(tmp_path):
    with pytest.raises(CheckpointError, match="directory"):
        load_checkpoint(tmp_path)


def test_truncated_file(saved, tmp_path):
    _, path = saved
    data = path.read_bytes()
    for cut in (4, 40, len(data) // 2, len(data) - 1):
        bad = tmp_path / f"cut{cut}.safetensors"
        bad.write_bytes(data[:cut])
        with pytest.raises(CheckpointError, match="cut") as e:
            load_checkpoint(bad)
        assert "truncated" in str(e.value) or "corrupt" in str(e.value)


def test_garbage_file(tmp_path):
    bad = tmp_path / "garbage.safetensors"
    bad.write_bytes(b"this is not a checkpoint at all, just text" * 10)
    with pytest.raises(CheckpointError, match="not a valid safetensors"):
        load_checkpoint(bad)


def test_foreign_safetensors_without_our_metadata(tmp_path):
    path = tmp_path / "foreign.safetensors"
    save_file({"w": torch.zeros(3)}, str(path))
    with pytest.raises(CheckpointError, match="not a scratchformer checkpoint"):
        load_checkpoint(path)


def _rewrite(path, state_edit=None, meta_edit=None):
    from safetensors import safe_open

    with safe_open(str(path), framework="pt") as f:
        meta = dict(f.metadata())
        state = {k: f.get_tensor(k) for k in f.keys()}  # noqa: SIM118
    if state_edit:
        state_edit(state)
    if meta_edit:
        meta_edit(meta)
    save_file(state, str(path), metadata=meta)


def test_newer_format_version(saved):
    _, path = saved
    _rewrite(path, meta_edit=lambda m: m.update(format_version="99"))
    with pytest.raises(CheckpointError, match="version '99'"):
        load_checkpoint(path)


def test_bad_config_in_metadata(saved):
    _, path = saved

    def edit(meta):
        cfg = json.loads(meta["config"])
        cfg["n_heads"] = 5  # 16 is not divisible by 5
        meta["config"] = json.dumps(cfg)

    _rewrite(path, meta_edit=edit)
    with pytest.raises(CheckpointError, match=r"invalid model config.*divisible"):
        load_checkpoint(path)


def test_unreadable_config_json(saved):
    _, path = saved
    _rewrite(path, meta_edit=lambda m: m.update(config="{not json"))
    with pytest.raises(CheckpointError, match="config"):
        load_checkpoint(path)


def test_missing_tensor(saved):
    _, path = saved
    _rewrite(path, state_edit=lambda s: s.pop("blocks.1.norm2.bias"))
    with pytest.raises(CheckpointError, match=r"missing tensors blocks\.1\.norm2\.bias"):
        load_checkpoint(path)


def test_unexpected_tensor(saved):
    _, path = saved
    _rewrite(path, state_edit=lambda s: s.update({"blocks.2.norm1.weight": torch.ones(16)}))
    with pytest.raises(CheckpointError, match=r"unexpected tensors blocks\.2\.norm1\.weight"):
        load_checkpoint(path)


def test_wrong_shape(saved):
    _, path = saved
    _rewrite(path, state_edit=lambda s: s.update({"final_norm.weight": torch.ones(17)}))
    with pytest.raises(CheckpointError, match=r"'final_norm.weight' has shape \(17,\)"):
        load_checkpoint(path)


def test_checkpoint_error_is_a_value_error():
    assert issubclass(CheckpointError, ValueError)
