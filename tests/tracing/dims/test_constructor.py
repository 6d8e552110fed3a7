"""Knob passes for a model built from arguments (``tracing.Constructor``), issue 31 item 3.

A vision transformer with no config: its sizes are its constructor's arguments. Given how
it was built, each argument is a knob a pass can move, so a size that two arguments share
(a patch of 4 beside 4 heads) is told apart by moving each, and the model's width is
proven by the argument that sets it.
"""

from __future__ import annotations

import pytest
import torch
from test_outside_models import ViT, output, param

import tracing
from tracing.dims.constructor import Constructor

pytestmark = pytest.mark.usefixtures("one_thread")


def vit_trace(patch_size: int, num_heads: int, rebuild: bool):
    torch.manual_seed(0)
    sizes = dict(image_size=28, patch_size=patch_size, embed_dim=60, num_heads=num_heads)
    model = ViT(**sizes).eval()
    image = torch.randn(2, 3, 28, 28)
    how = Constructor(ViT, **sizes) if rebuild else None
    return tracing.trace(model, image, capture="shapes", rebuild=how)


def test_the_constructor_is_the_config_and_the_rebuild():
    how = Constructor(ViT, image_size=28, patch_size=4, embed_dim=60, num_heads=4, mlp_dim=120)
    assert how.config == dict(image_size=28, patch_size=4, embed_dim=60, num_heads=4, mlp_dim=120)
    twin = how({**how.config, "num_heads": 6})
    assert twin.blocks[0].attn.num_heads == 6 and twin.blocks[0].attn.qkv.in_features == 60
    assert Constructor.of_defaults(ViT).config == dict(mlp_dim=120, classes=11)


def test_a_patch_as_wide_as_the_heads_count_is_not_the_heads():
    """patch 4 == 4 heads: moving ``patch_size`` moves the kernel and not the heads, and
    the kernel, which no letter names, is named after the argument that alone moves it."""
    trace = vit_trace(patch_size=4, num_heads=4, rebuild=True)
    assert "patch_size" in trace.meta["dims_evidence"]["knobs"]
    kernel = param(trace, "patch_embed.proj").dims
    assert kernel[2:] == ("patch_size", "patch_size")
    assert trace.meta["dim_letters"]["patch_size"]["moved_by"] == ["config.patch_size"]
    assert output(trace, "blocks.0.attn", "reshape").dims[3] == "H"


def test_the_width_is_proven_by_its_argument():
    """Without the constructor nothing declares the width (only heads and head width are
    attributes); with it, ``embed_dim`` names the residual stream and the kernel's rows."""
    bare = vit_trace(patch_size=4, num_heads=6, rebuild=False)
    built = vit_trace(patch_size=4, num_heads=6, rebuild=True)
    assert output(bare, "blocks.1", "add", 1).dims[2] == "?"
    assert output(built, "blocks.1", "add", 1).dims == ("B", "Tk", "C")  # Tk: attended
    assert param(built, "patch_embed.proj").dims[0] == "C"
    assert built.meta["dim_letters"]["C"]["origin"] == "config.embed_dim"


class TokensLM(torch.nn.Module):
    """x-transformers' spelling: ``num_tokens`` (no letter's) sizes the table and the head,
    ``width`` (no letter's either) the embedding's width."""

    def __init__(self, num_tokens: int = 50, width: int = 24):
        super().__init__()
        self.emb = torch.nn.Embedding(num_tokens, width)
        self.head = torch.nn.Linear(width, num_tokens)

    def forward(self, ids):
        return self.head(torch.tanh(self.emb(ids)))


def test_an_argument_that_moves_a_letter_read_off_a_layer_proves_that_letter():
    """The table's rows are ``V`` (read off the embedding); ``num_tokens`` moves them and
    nothing else, so it is ``V``'s proof, not a second name of the same size beside it
    (two names of one size in every pass: the logits read ``?`` before)."""
    torch.manual_seed(0)
    model = TokensLM(num_tokens=50, width=24).eval()
    ids = torch.randint(0, 50, (2, 7))
    how = Constructor(TokensLM, num_tokens=50, width=24)
    trace = tracing.trace(model, ids, capture="shapes", rebuild=how)
    assert "num_tokens" in trace.meta["dims_evidence"]["knobs"]
    logits = output(trace, "head", "linear")
    assert logits.shape == (2, 7, 50) and logits.dims == ("B", "T", "V")
    assert param(trace, "head").why[0] == "moved"  # the rows: carried to the logits
    assert trace.meta["dim_letters"]["V"]["moved_by"] == ["config.num_tokens"]
    assert "num_tokens" not in trace.meta["dims"]
    assert param(trace, "emb").dims == ("V", "C") and param(trace, "head").dims == ("V", "C")
    assert trace.meta["dim_letters"]["C"]["moved_by"] == ["config.width"]
