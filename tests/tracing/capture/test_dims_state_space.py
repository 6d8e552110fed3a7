"""Dims on state-space, linear-attention and hybrid models (issue 22): the mixer steps of
Mamba, Qwen3-Next's gated delta rule and Jamba's Mamba beside attention, written out axis
by axis. Each letter is proven by a config attribute (``state_size`` is ``S``,
``linear_num_value_heads`` is ``Hv``...), carried through the ops by their shape rules, and
the chunk length Qwen3-Next fixes in its code (64) by the name its source passes in a
shape (``chunk_size``). Tiny configs with every size distinct, random weights."""

from __future__ import annotations

import pytest
import torch
from helpers.dims_models import steps_of

import tracing

pytest.importorskip("transformers")
pytestmark = pytest.mark.usefixtures("one_thread")

# B=3, T=11, C=96, S=14 (state), W=7 (conv kernel), Dt=13 (dt rank), I=2C=192 (inner);
# linear attention: Hk=9 key heads, Hv=18 value heads, Dk=20, Dvl=26
SSM = dict(
    vocab_size=101, hidden_size=96, num_hidden_layers=1, use_cache=False, expand=2,
    state_size=14, conv_kernel=7, time_step_rank=13,
)  # fmt: skip
LINEAR = dict(
    linear_conv_kernel_dim=7, linear_num_key_heads=9, linear_num_value_heads=18,
    linear_key_head_dim=20, linear_value_head_dim=26,
)  # fmt: skip
ATTENTION = dict(
    vocab_size=101, hidden_size=96, intermediate_size=200, num_attention_heads=6,
    num_key_value_heads=2, head_dim=16, max_position_embeddings=64, use_cache=False,
)  # fmt: skip
MIXER = {"mamba": "layers.0.mixer", "qwen3_next": "layers.0.linear_attn", "jamba": "layers.0.mamba"}


def build(kind: str):
    """(model, token ids) for one architecture at the sizes above."""
    import transformers as tf

    if kind == "mamba":
        config = tf.MambaConfig(**SSM)
    elif kind == "qwen3_next":
        config = tf.Qwen3NextConfig(
            **ATTENTION, **LINEAR, num_hidden_layers=2,
            layer_types=["linear_attention", "full_attention"],
            num_experts=5, num_experts_per_tok=2, moe_intermediate_size=40,
            shared_expert_intermediate_size=56,
        )  # fmt: skip
    else:  # Jamba: a Mamba layer, then an attention layer
        config = tf.JambaConfig(
            **ATTENTION, num_hidden_layers=2, attn_layer_period=2, attn_layer_offset=1,
            expert_layer_period=2, expert_layer_offset=1, num_experts=5, num_experts_per_tok=2,
            mamba_d_state=14, mamba_d_conv=7, mamba_expand=2, mamba_dt_rank=13,
            use_mamba_kernels=False,
        )  # fmt: skip
    config._attn_implementation = "eager"
    torch.manual_seed(0)
    model = tf.AutoModelForCausalLM.from_config(config).eval()
    return model, torch.randint(0, 101, (3, 11))


def subsequence(expected: list, got: list) -> list:
    """The expected steps ``got`` lacks, in order (empty: all there, in that order)."""
    at = 0
    missing = []
    for step in expected:
        try:
            at = got.index(step, at) + 1
        except ValueError:
            missing.append(step)
    return missing


def named_share(trace) -> float:
    axes = [
        d for r in trace.tensors if len(r.shape) >= 2 for d in (r.dims or ("?",) * len(r.shape))
    ]
    return sum(d != "?" for d in axes) / len(axes)


SCAN = [  # Mamba's selective scan, as Mamba and Jamba's Mamba layers run it without kernels
    ("in_proj", "linear", "(B,T,2I)"),  # x and z
    ("", "transpose", "(B,2I,T)"),
    ("", "neg", "(I,S)"),  # A = -exp(A_log)
    ("", "chunk", "(B,I,T) (B,I,T)"),
    ("", "unsqueeze", "(I,1,W)"),  # the depthwise causal convolution's kernel
    ("", "conv1d", "(B,I,T+W-1)"),
    ("", "getitem", "(B,I,T)"),  # cut back to T
    ("", "transpose", "(B,T,I)"),
    ("x_proj", "linear", "(B,T,Dt+2S)"),  # time step, B and C
    ("", "split", "(B,T,Dt) (B,T,S) (B,T,S)"),
    ("", "matmul", "(B,I,T)"),  # dt_proj
    ("", "softplus", "(B,I,T)"),
    ("", "mul", "(B,I,T,S)"),  # discretized A
    ("", "exp", "(B,I,T,S)"),
    ("", "zeros", "(B,I,S)"),  # the state
    ("", "getitem", "(B,I,S)"),  # one time step of the scan, in a loop
    ("", "add", "(B,I,S)"),
    ("", "getitem", "(B,S)"),
    ("", "matmul", "(B,I,1)"),
    ("", "stack", "(B,I,T)"),
    ("out_proj", "linear", "(B,T,C)"),
]

EXPECTED = {
    "mamba": SCAN,
    "jamba": [  # Jamba normalizes the time step, B and C (and computes A after the conv)
        *(step for step in SCAN[:10] if step[1] != "neg"),
        ("dt_layernorm", "mul", "(B,T,Dt)"),
        ("b_layernorm", "mul", "(B,T,S)"),
        *SCAN[10:],
    ],
    "qwen3_next": [  # the gated delta rule, chunked
        ("in_proj_qkvz", "linear", "(B,T,2Hk·Dk+2Hv·Dvl)"),
        ("in_proj_ba", "linear", "(B,T,2Hv)"),
        ("", "view", "(B,T,Hk,2Dk+2(Hv/Hk)·Dvl)"),
        ("", "view", "(B,T,Hk,2(Hv/Hk))"),  # 4, not the rotary width R = 4
        ("", "split", "(B,T,Hk,Dk) (B,T,Hk,Dk) (B,T,Hk,(Hv/Hk)·Dvl) (B,T,Hk,(Hv/Hk)·Dvl)"),
        ("", "split", "(B,T,Hk,Hv/Hk) (B,T,Hk,Hv/Hk)"),
        ("", "reshape", "(B,T,Hv,Dvl)"),
        ("", "reshape", "(B,T,Hk·Dk)"),
        ("", "cat", "(B,T,2Hk·Dk+Hv·Dvl)"),  # what the convolution runs over
        ("", "unsqueeze", "(2Hk·Dk+Hv·Dvl,1,W)"),
        ("", "conv1d", "(B,2Hk·Dk+Hv·Dvl,T+W-1)"),
        ("", "split", "(B,T,Hk·Dk) (B,T,Hk·Dk) (B,T,Hv·Dvl)"),
        ("", "reshape", "(B,T,Hk,Dk)"),
        ("", "repeat_interleave", "(B,T,Hv,Dk)"),  # keys shared by Hv/Hk value heads
        ("", "transpose", "(B,Hv,T,Dk)"),
        ("", "pad", "(B,Hv,Q,Dk)"),  # T padded to one chunk of Q = 64
        ("", "reshape", "(B,Hv,1,Q,Dk)"),
        ("", "ones", "(Q,Q)"),
        ("", "matmul", "(B,Hv,1,Q,Q)"),
        ("", "zeros", "(B,Hv,Dk,Dvl)"),  # the recurrent state
        ("", "matmul", "(B,Hv,Dk,Dvl)"),
        ("", "reshape", "(B,Hv,Q,Dvl)"),
        ("", "getitem", "(B,Hv,T,Dvl)"),  # the padding cut off
        ("", "transpose", "(B,T,Hv,Dvl)"),
        ("", "reshape", "(B·T·Hv,Dvl)"),  # the gated norm
        ("", "reshape", "(B,T,Hv·Dvl)"),
        ("out_proj", "linear", "(B,T,C)"),
    ],
}


@pytest.mark.parametrize("kind", sorted(EXPECTED))
def test_mixer_steps_read_in_full(kind):
    model, ids = build(kind)
    trace = tracing.trace(model, ids, capture="shapes")
    got = steps_of(trace, MIXER[kind], min_rank=2)
    assert subsequence(EXPECTED[kind], got) == [], got
    assert named_share(trace) >= 0.98


def test_each_mixer_letter_has_its_evidence():
    letters = tracing.trace(*build("mamba"), capture="shapes").meta["dim_letters"]
    origins = {k: (v["size"], v["origin"]) for k, v in letters.items()}
    assert origins["S"] == (14, "config.state_size")
    assert origins["W"] == (7, "config.conv_kernel")
    assert origins["Dt"] == (13, "config.time_step_rank")
    assert origins["I"] == (192, "config.expand × C")  # its intermediate_size: I, not F
    assert "F" not in letters
    letters = tracing.trace(*build("qwen3_next"), capture="shapes").meta["dim_letters"]
    assert letters["Hv"]["origin"] == "config.linear_num_value_heads"
    assert letters["Q"]["size"] == 64  # fixed in the code: the name its reshape passes
    assert letters["Q"]["origin"].startswith("source: `chunk_size` at modeling_qwen3_next.py:")


def test_mamba_names_do_not_change_when_tokens_match_the_state_size():
    """T == S == 14, then T == W == 7: per source line and op, the same names as with
    T = 11 (the scan's loop runs T times, so the steps are compared line by line)."""
    model, ids = build("mamba")

    def names(trace) -> dict:
        out: dict = {}
        for s in trace.steps:
            if s.kind == "op" and s.outputs and s.source is not None:
                key = (s.module, s.op, s.source.line)
                out.setdefault(key, set()).update(trace.tensor(i).dims for i in s.outputs)
        return out

    distinct = names(tracing.trace(model, ids, capture="shapes"))
    for t in (14, 7):
        same = names(tracing.trace(model, torch.randint(0, 101, (3, t)), capture="shapes"))
        assert same == distinct


def test_a_config_that_refuses_a_global_size_does_not_stop_the_trace():
    """A config whose heads vary per layer raises on ``config.num_attention_heads``
    (dots3_note's); the sizes come from elsewhere and the trace completes."""
    from tracing.dims.letters import house_sizes, letter_sizes

    class PerLayer:
        hidden_size = 96
        intermediate_size = None  # unset: GPT-2's convention, 4C

        @property
        def num_attention_heads(self):
            raise ValueError("a per-layer attribute: ask a layer's config")

    house = house_sizes(PerLayer(), None, None)
    assert house == {"C": 96, "F": 384}
    assert {k: v.size for k, v in letter_sizes(house, PerLayer(), None, None).items()} == house
