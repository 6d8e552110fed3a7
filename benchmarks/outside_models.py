"""Models from outside ``transformers`` for ``bench_dims_outside.py`` (issue 31, item 7).

Each builder takes one dict of sizes and returns ``(model, inputs)``, so the survey can build
the same architecture at distinct sizes and again with two sizes made equal. The models are
written the way people write them (timm's fused q/k/v, an LSTM whose comment says
``# (B, T, Hd)``, lucidrains-style einsum attention, ``B, C, H, W = x.shape`` on an image),
not the way the namer would like them. Libraries installed for the benchmark only
(``x_transformers``, ``litgpt``, ``timm``) are imported inside their builders; a missing one
raises ``ImportError`` and the survey skips it.
"""

from __future__ import annotations

import importlib
import importlib.util
import sys
import types
from fractions import Fraction
from pathlib import Path

import torch
import torch.nn as nn

TESTS = Path(__file__).resolve().parents[1] / "tests"

# --------------------------------------------------------------------------- a ViT


class PatchEmbed(nn.Module):
    """An image cut into ``patch_size`` squares, each projected to ``embed_dim``."""

    def __init__(self, image_size, patch_size, in_chans, embed_dim):
        super().__init__()
        self.image_size, self.in_chans = image_size, in_chans
        self.num_patches = (image_size // patch_size) ** 2
        self.proj = nn.Conv2d(in_chans, embed_dim, patch_size, stride=patch_size)

    def forward(self, x):
        B, C, H, W = x.shape  # the image's letters, as vision code writes them
        assert H == W == self.image_size and self.in_chans == C, f"image {B}×{C}×{H}×{W}"
        x = self.proj(x)
        return x.flatten(2).transpose(1, 2)


class ViTAttention(nn.Module):
    """timm's attention: one fused q/k/v projection, ``reshape`` then ``permute``."""

    def __init__(self, dim, num_heads):
        super().__init__()
        self.num_heads = num_heads
        self.head_dim = dim // num_heads
        self.scale = self.head_dim**-0.5
        self.qkv = nn.Linear(dim, dim * 3)
        self.proj = nn.Linear(dim, dim)

    def forward(self, x):
        B, N, C = x.shape
        qkv = self.qkv(x).reshape(B, N, 3, self.num_heads, self.head_dim).permute(2, 0, 3, 1, 4)
        q, k, v = qkv.unbind(0)
        attn = (q @ k.transpose(-2, -1)) * self.scale
        attn = attn.softmax(dim=-1)
        x = (attn @ v).transpose(1, 2).reshape(B, N, C)
        return self.proj(x)


class ViTBlock(nn.Module):
    def __init__(self, dim, num_heads, mlp_dim, torch_mha=False):
        super().__init__()
        self.norm1 = nn.LayerNorm(dim)
        self.torch_mha = torch_mha
        if torch_mha:
            self.attn = nn.MultiheadAttention(dim, num_heads, batch_first=True)
        else:
            self.attn = ViTAttention(dim, num_heads)
        self.norm2 = nn.LayerNorm(dim)
        self.mlp = nn.Sequential(nn.Linear(dim, mlp_dim), nn.GELU(), nn.Linear(mlp_dim, dim))

    def forward(self, x):
        h = self.norm1(x)
        x = x + (self.attn(h, h, h, need_weights=False)[0] if self.torch_mha else self.attn(h))
        return x + self.mlp(self.norm2(x))


class ViT(nn.Module):
    """Patches, a class token, learned positions, blocks, the class token's logits."""

    def __init__(self, image_size, patch_size, in_chans, embed_dim, num_heads, mlp_dim,
                 num_classes, depth=2, torch_mha=False):  # fmt: skip
        super().__init__()
        self.patch_embed = PatchEmbed(image_size, patch_size, in_chans, embed_dim)
        self.cls_token = nn.Parameter(torch.zeros(1, 1, embed_dim))
        self.pos_embed = nn.Parameter(torch.randn(1, self.patch_embed.num_patches + 1, embed_dim))
        self.blocks = nn.ModuleList(
            ViTBlock(embed_dim, num_heads, mlp_dim, torch_mha) for _ in range(depth)
        )
        self.norm = nn.LayerNorm(embed_dim)
        self.head = nn.Linear(embed_dim, num_classes)

    def forward(self, img):
        x = self.patch_embed(img)
        cls = self.cls_token.expand(x.shape[0], -1, -1)
        x = torch.cat((cls, x), dim=1) + self.pos_embed
        for block in self.blocks:
            x = block(x)
        return self.head(self.norm(x)[:, 0])


def vit(s: dict, torch_mha=False):
    model = ViT(s["img"], s["patch"], 3, s["C"], s["H"], s["F"], s["classes"],
                torch_mha=torch_mha)  # fmt: skip
    return model, (torch.randn(s["B"], 3, s["img"], s["img"]),)


# --------------------------------------------------------------------------- a recurrent LM


class RecurrentLM(nn.Module):
    """Embedding, a 2-layer LSTM (or GRU), a head: no heads, no feed-forward."""

    def __init__(self, vocab_size, embed_dim, hidden_size, num_layers=2, cell="lstm"):
        super().__init__()
        self.embed = nn.Embedding(vocab_size, embed_dim)
        rnn = nn.LSTM if cell == "lstm" else nn.GRU
        self.rnn = rnn(embed_dim, hidden_size, num_layers, batch_first=True)
        self.head = nn.Linear(hidden_size, vocab_size)

    def forward(self, ids):
        x = self.embed(ids)  # (B, T, E)
        out, _ = self.rnn(x)  # (B, T, Hd)
        return self.head(out)  # (B, T, V)


def recurrent(s: dict, cell="lstm"):
    model = RecurrentLM(s["V"], s["E"], s["Hd"], s["L"], cell)
    return model, (torch.randint(0, s["V"], (s["B"], s["T"])),)


# --------------------------------------------------------------------------- einsum attention


class EinsumAttention(nn.Module):
    """lucidrains-style: ``heads`` × ``dim_head`` wide, scores and mixing by einsum."""

    def __init__(self, dim, heads, dim_head):
        super().__init__()
        self.heads = heads
        self.scale = dim_head**-0.5
        self.to_qkv = nn.Linear(dim, 3 * heads * dim_head, bias=False)
        self.to_out = nn.Linear(heads * dim_head, dim)

    def forward(self, x):
        b, t, _ = x.shape
        q, k, v = self.to_qkv(x).chunk(3, dim=-1)
        q, k, v = (y.view(b, t, self.heads, -1).transpose(1, 2) for y in (q, k, v))
        sim = torch.einsum("bhid,bhjd->bhij", q, k) * self.scale
        causal = torch.ones(t, t, dtype=torch.bool, device=x.device).triu(1)
        attn = sim.masked_fill(causal, float("-inf")).softmax(dim=-1)
        out = torch.einsum("bhij,bhjd->bhid", attn, v)
        return self.to_out(out.transpose(1, 2).reshape(b, t, -1))


class EinsumLM(nn.Module):
    def __init__(self, vocab_size, dim, heads, dim_head, ff_dim, max_seq_len, depth=2):
        super().__init__()
        self.token_emb = nn.Embedding(vocab_size, dim)
        self.pos_emb = nn.Embedding(max_seq_len, dim)
        self.layers = nn.ModuleList()
        for _ in range(depth):
            ff = nn.Sequential(nn.Linear(dim, ff_dim), nn.GELU(), nn.Linear(ff_dim, dim))
            self.layers.append(nn.ModuleList([nn.LayerNorm(dim), EinsumAttention(dim, heads,
                                              dim_head), nn.LayerNorm(dim), ff]))  # fmt: skip
        self.to_logits = nn.Linear(dim, vocab_size)

    def forward(self, ids):
        x = self.token_emb(ids) + self.pos_emb(torch.arange(ids.shape[1], device=ids.device))
        for norm1, attn, norm2, ff in self.layers:
            x = x + attn(norm1(x))
            x = x + ff(norm2(x))
        return self.to_logits(x)


def einsum_lm(s: dict):
    model = EinsumLM(s["V"], s["C"], s["H"], s["D"], s["F"], s["N"])
    return model, (torch.randint(0, s["V"], (s["B"], s["T"])),)


# --------------------------------------------------------------------------- torch's layers


class EncoderLM(nn.Module):
    """``nn.TransformerEncoderLayer`` (causal mask) between embedding and head; batch first,
    or in torch's default layout, tokens first: ``ids`` is then ``(T, B)``."""

    def __init__(self, vocab_size, d_model, nhead, dim_feedforward, num_layers=2,
                 batch_first=True):  # fmt: skip
        super().__init__()
        self.embed = nn.Embedding(vocab_size, d_model)
        layer = nn.TransformerEncoderLayer(d_model, nhead, dim_feedforward, dropout=0.0,
                                           batch_first=batch_first)  # fmt: skip
        self.encoder = nn.TransformerEncoder(layer, num_layers, enable_nested_tensor=False)
        self.lm_head = nn.Linear(d_model, vocab_size)
        self.tokens_axis = 1 if batch_first else 0

    def forward(self, ids):
        mask = nn.Transformer.generate_square_subsequent_mask(ids.shape[self.tokens_axis])
        return self.lm_head(self.encoder(self.embed(ids), mask=mask, is_causal=True))


class DecoderLM(nn.Module):
    """``nn.TransformerDecoder`` (batch first) over its own embeddings as memory."""

    def __init__(self, vocab_size, d_model, nhead, dim_feedforward, num_layers=2):
        super().__init__()
        self.embed = nn.Embedding(vocab_size, d_model)
        layer = nn.TransformerDecoderLayer(d_model, nhead, dim_feedforward, dropout=0.0,
                                           batch_first=True)  # fmt: skip
        self.decoder = nn.TransformerDecoder(layer, num_layers)
        self.lm_head = nn.Linear(d_model, vocab_size)

    def forward(self, ids):
        x = self.embed(ids)
        mask = nn.Transformer.generate_square_subsequent_mask(ids.shape[1])
        return self.lm_head(self.decoder(x, x, tgt_mask=mask, tgt_is_causal=True))


def torch_layers(s: dict, kind="encoder"):
    if kind == "tokens first":
        model = EncoderLM(s["V"], s["C"], s["H"], s["F"], batch_first=False)
        return model, (torch.randint(0, s["V"], (s["T"], s["B"])),)
    cls = EncoderLM if kind == "encoder" else DecoderLM
    return cls(s["V"], s["C"], s["H"], s["F"]), (torch.randint(0, s["V"], (s["B"], s["T"])),)


# --------------------------------------------------------------------------- the tests' models


def _helper(name: str):
    if str(TESTS) not in sys.path:
        sys.path.insert(0, str(TESTS))
    return importlib.import_module(f"helpers.models.{name}")


def tutorial(s: dict):
    lm = _helper("tutorial_fixed").TutorialLM
    model = lm(s["V"], s["C"], s["H"], s["F"], num_layers=2, max_len=s["N"])
    return model, (torch.randint(0, s["V"], (s["B"], s["T"])),)


def nanogpt(s: dict):
    gpt = _helper("nanogpt").GPT
    model = gpt(vocab_size=s["V"], block_size=s["N"], n_layer=2, n_head=s["H"], n_embd=s["C"])
    return model, (torch.randint(0, s["V"], (s["B"], s["T"])),)


# --------------------------------------------------------------------------- other libraries


def x_transformers_model(num_tokens: int, max_seq_len: int, dim: int, depth: int,
                         heads: int, kv_heads: int, dim_head: int, ff_dim: int):  # fmt: skip
    """An x-transformers decoder LM by its sizes: the hook a user gives ``--rebuild`` where
    the model class takes its layers built (``TransformerWrapper(attn_layers=Decoder(...))``,
    whose own arguments are only ``num_tokens`` and ``max_seq_len``). The feed-forward
    width is a ``ff_mult`` there (``int(dim * mult)``): an exact fraction keeps it whole."""
    from x_transformers import Decoder, TransformerWrapper

    layers = Decoder(dim=dim, depth=depth, heads=heads, attn_kv_heads=kv_heads,
                     attn_dim_head=dim_head, ff_mult=Fraction(ff_dim, dim))  # fmt: skip
    return TransformerWrapper(num_tokens=num_tokens, max_seq_len=max_seq_len, attn_layers=layers)


def x_transformers_sizes(s: dict) -> dict:
    """:func:`x_transformers_model`'s arguments at the survey's sizes."""
    return dict(num_tokens=s["V"], max_seq_len=s["N"], dim=s["C"], depth=2, heads=s["H"],
                kv_heads=s["KV"], dim_head=s["D"], ff_dim=s["F"])  # fmt: skip


def x_transformers(s: dict):
    model = x_transformers_model(**x_transformers_sizes(s))
    return model, (torch.randint(0, s["V"], (s["B"], s["T"])),)


def _without_init(package: str) -> None:
    """``package`` importable without running its ``__init__``: litgpt's imports lightning
    and its whole training stack, its ``model.py`` and ``config.py`` need neither."""
    if package in sys.modules:
        return
    spec = importlib.util.find_spec(package)
    if spec is None or not spec.submodule_search_locations:
        raise ImportError(f"{package} is not installed")
    module = types.ModuleType(package)
    module.__path__ = list(spec.submodule_search_locations)
    sys.modules[package] = module


def litgpt(s: dict):
    _without_init("litgpt")
    from litgpt.config import Config
    from litgpt.model import GPT

    config = Config(n_layer=2, n_embd=s["C"], n_head=s["H"], n_query_groups=s["KV"],
                    head_size=s["D"], intermediate_size=s["F"], vocab_size=s["V"],
                    padded_vocab_size=s["V"], block_size=s["N"], bias=False,
                    mlp_class_name="LLaMAMLP", norm_class_name="RMSNorm",
                    parallel_residual=False, rotary_percentage=1.0)  # fmt: skip
    return GPT(config), (torch.randint(0, s["V"], (s["B"], s["T"])),)


def timm_vit(s: dict):
    try:  # timm's layers import torchvision; a wheel built for another torch fails to load
        from timm.models.vision_transformer import VisionTransformer
    except RuntimeError as e:
        raise ImportError(str(e), name="a torchvision built for this torch") from e

    model = VisionTransformer(img_size=s["img"], patch_size=s["patch"], in_chans=3,
                              num_classes=s["classes"], embed_dim=s["C"], depth=2,
                              num_heads=s["H"], mlp_ratio=s["F"] / s["C"])  # fmt: skip
    return model, (torch.randn(s["B"], 3, s["img"], s["img"]),)


# --------------------------------------------------------------------------- released sizes

RELEASED = {  # the config.json sizes of the released checkpoints, two layers
    "llama-3-70b": ("LlamaConfig", dict(hidden_size=8192, intermediate_size=28672,
                    num_attention_heads=64, num_key_value_heads=8, vocab_size=128256,
                    max_position_embeddings=8192, rope_theta=500000.0)),
    "mistral-7b": ("MistralConfig", dict(hidden_size=4096, intermediate_size=14336,
                   num_attention_heads=32, num_key_value_heads=8, vocab_size=32000,
                   max_position_embeddings=32768, sliding_window=None)),
    "qwen2-7b": ("Qwen2Config", dict(hidden_size=3584, intermediate_size=18944,
                 num_attention_heads=28, num_key_value_heads=4, vocab_size=152064,
                 max_position_embeddings=32768)),
}  # fmt: skip


def hf_causal(s: dict, config_class: str):
    """A ``transformers`` causal LM of the given sizes, two layers, on ``device``."""
    import transformers

    sizes = dict(hidden_size=s["C"], intermediate_size=s["F"], num_attention_heads=s["H"],
                 num_key_value_heads=s["KV"], vocab_size=s["V"], head_dim=s["D"],
                 max_position_embeddings=s["N"])  # fmt: skip
    config = getattr(transformers, config_class)(
        **sizes, **s.get("extra", {}), num_hidden_layers=2, attn_implementation="eager"
    )
    with torch.device(s.get("device", "cpu")):
        model = transformers.AutoModelForCausalLM.from_config(config).eval()
        ids = torch.randint(0, s["V"], (s["B"], s["T"]))
    return model, (ids,)


def released_sizes(name: str) -> dict:
    _, c = RELEASED[name]
    extra = {k: v for k, v in c.items() if k in ("rope_theta", "sliding_window")}
    return dict(B=3, T=11, C=c["hidden_size"], F=c["intermediate_size"],
                H=c["num_attention_heads"], KV=c["num_key_value_heads"],
                D=c["hidden_size"] // c["num_attention_heads"], V=c["vocab_size"],
                N=c["max_position_embeddings"], extra=extra)  # fmt: skip
