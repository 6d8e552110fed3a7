"""Dims on every causal-LM architecture of the installed ``transformers`` (issue 22, item 4).

    .venv/bin/python benchmarks/bench_dims_architectures.py              # all of them
    .venv/bin/python benchmarks/bench_dims_architectures.py llama qwen2  # only these
    .venv/bin/python benchmarks/bench_dims_architectures.py --failing    # the last run's misses

Each architecture of ``MODEL_FOR_CAUSAL_LM_MAPPING_NAMES`` is built from its own config,
shrunk with random weights and fed token ids of B=3, T=11. Every size the config has is set
to a small value that matches no other, so that a name can only be right by evidence:

- attention: 2 layers, C=96, H=6, 2 key/value heads, D=16, F=200, V=101, N=76 positions
  (not 64: that is 2KV·D, and the chunk length linear-attention models fix in code);
  latent attention R=8 (its ``head_dim``), Dn=12, Dv=10, Lkv=28, Lq=24, its keys and
  values per query head (KV = H); experts E=5, top-K=3, FE=40, the shared expert FS=56
  (top-2 would be KV's size, and hid names that were K only by size: a complex rotation's
  pairs, Inkling's two shared experts; top-3 is H/KV's, which the words of the module
  tell apart);
- state-space mixers: state S=14, conv kernel W=19 (not 7, the width of Inkling's routing
  scores, 5 experts + 2 shared), dt rank Dt=13, inner width I = expand × C = 192, Mamba-2
  heads 4 × head width 48 (= I), groups 1, chunk Q=36 (longer than T: one chunk, as at
  real lengths' first chunk); RecurrentGemma's U=120;
- linear attention: key heads Hk=9, value heads Hv=18, key and value head widths
  Dk=23 (not 20, latent attention's Dn+R in Kimi-Linear's other layers) and Dvl=26;
  Inkling's sliding-window layers 30 heads, 15 key/value heads, width 22, relative
  features 17 over 50 (45 in the window); a sparse-attention indexer's
  21 heads of width 34;
- hyper-connections (DeepSeek-V4): 7 streams (its default 4 gives hc_mult·hc_mult = 16 = D and
  (hc_mult+2)·hc_mult = 24, the query latent rank);
- a hybrid's two layers are one of each kind (a mixer, then attention): two layers of its
  default pattern are often both mixers, and some then fail to build their mask.

A config that refuses these at construction gets the basic sizes set after. What cannot be
built, or whose plain forward fails here, is skipped and counted. Per model it prints:

- **named**: the share of the axes of ≥2-D tensors that carry a name (not ``?``);
- **wrong**: axes whose standard letter (B, T, C, H, D, V) stands for another size than the
  axis has: the letter's size in the trace, and the survey's B and T (must be zero);
- **maps**: the trace's attention maps against eager ``output_attentions`` (1e-6), where
  the model returns maps: ``=``, ``≠`` (or a different count) or ``-`` (none returned).
  Only rank-4 ``(B, H, T, S)`` tensors whose rows are the T queries count as returned maps:
  RWKV's ``attentions`` are its time-mixing blocks' outputs ``(B, T, C)``, MiniMax's
  lightning-attention layers return their key-value state ``(B, H, D, D)`` (``KᵀV``, no
  softmax): neither is a map, and the trace rightly shows none there. CPM-Ant puts its 32
  learned prompt tokens before the input and its eager maps drop their rows and columns;
  the trace keeps the softmax the model computed, ``(B, H, Pr+T, Pr+T)``, whose last
  ``T × T`` block is compared.

Targets: median ≥ 98% named, none below 90%, no wrong letters, every map equal. A run
writes its rows to ``benchmarks/.dims_architectures.json`` (``--failing`` reads it).
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import signal
import statistics
import sys
import time
import warnings
from pathlib import Path

import torch

import tracing

os.environ.setdefault("SCRATCHFORMER_DIMS_STRICT", "1")  # a fault in naming is counted

B, T = 3, 11
SIZES = dict(C=96, H=6, KV=2, D=16, F=200, V=101)
STANDARD = ("B", "T", "C", "H", "D", "V")
LAST = Path(__file__).with_name(".dims_architectures.json")

_SET = {
    "hidden_size": 96, "n_embd": 96, "d_model": 96, "embed_dim": 96, "dim": 96, "d_embed": 96,
    "num_attention_heads": 6, "n_head": 6, "n_heads": 6, "num_heads": 6,
    "decoder_attention_heads": 6, "encoder_attention_heads": 6,
    "num_key_value_heads": 2, "num_kv_heads": 2, "n_head_kv": 2, "multi_query_group_num": 2,
    "head_dim": 16, "kv_channels": 16, "intermediate_size": 200, "n_inner": 200,
    "ffn_dim": 200, "d_ff": 200, "ffn_hidden_size": 200, "decoder_ffn_dim": 200,
    "encoder_ffn_dim": 200, "vocab_size": 101,
    "num_hidden_layers": 2, "n_layer": 2, "n_layers": 2, "num_layers": 2,
    "decoder_layers": 2, "encoder_layers": 2, "num_decoder_layers": 2,
    "max_position_embeddings": 76, "n_positions": 76, "n_ctx": 76,
    "pad_token_id": 0, "bos_token_id": 1, "eos_token_id": 2, "decoder_start_token_id": 1,
}  # fmt: skip


def shrink(config, depth: int = 0, layout: bool = True, full: bool = True, keep=frozenset()):
    """``config`` (and its sub-configs: ``text_config``...) at the survey's sizes: those of
    :func:`survey_kwargs` for each (so what the constructor was given is not undone after,
    as ``_SET``'s ``head_dim=16`` once undid latent attention's ``head_dim=8``). ``layout``:
    also a hybrid's layer pattern (not for a config built with it: its pattern is set)."""
    for name, value in survey_kwargs(config, layout, full).items():
        if name in keep:
            continue
        with contextlib.suppress(AttributeError, TypeError, ValueError):
            setattr(config, name, value)
    for value in list(vars(config).values()):
        if depth < 2 and hasattr(value, "to_dict") and hasattr(value, "model_type"):
            shrink(value, depth + 1, full=full)
    with contextlib.suppress(AttributeError, TypeError, ValueError):
        config._attn_implementation = "eager"
    return config


class _Timeout(Exception):
    pass


@contextlib.contextmanager
def _limit(seconds: int):
    def alarm(*_):
        raise _Timeout(f"over {seconds} s")

    old = signal.signal(signal.SIGALRM, alarm)
    signal.alarm(seconds)
    try:
        yield
    finally:
        signal.alarm(0)
        signal.signal(signal.SIGALRM, old)


_MLA = {"qk_rope_head_dim": 8, "qk_nope_head_dim": 12, "v_head_dim": 10, "kv_lora_rank": 28}
_MOE = {
    "num_local_experts": 5, "num_experts": 5, "n_routed_experts": 5, "moe_num_experts": 5,
    "num_experts_per_tok": 3, "moe_topk": 3, "moe_intermediate_size": 40,
    "n_group": 1, "topk_group": 1, "shared_expert_intermediate_size": 56,
    "shared_intermediate_size": 56, "moe_shared_expert_intermediate_size": 56,
}  # fmt: skip


_SSM = {  # state-space mixers (Mamba, Mamba-2 and the hybrids around them)
    "state_size": 14, "ssm_state_size": 14, "mamba_d_state": 14, "d_state": 14,
    "conv_kernel": 19, "mamba_d_conv": 19, "d_conv": 19, "conv1d_width": 19, "conv_L_cache": 19,
    "linear_conv_kernel_dim": 19, "short_conv_kernel_size": 19, "conv_kernel_size": 19,
    "time_step_rank": 13, "mamba_dt_rank": 13, "dt_rank": 13,
    "expand": 2, "mamba_expand": 2, "mamba_d_ssm": 192,  # the inner width: 2 × C = 192
    "mamba_n_heads": 4, "mamba_num_heads": 4, "n_mamba_heads": 4,
    "mamba_d_head": 48, "mamba_head_dim": 48, "mamba_headdim": 48,  # 4 × 48 = 192
    "n_groups": 1, "mamba_n_groups": 1, "mamba_ngroups": 1,
    "chunk_size": 36, "mamba_chunk_size": 36,
    "lru_width": 120,  # RecurrentGemma's recurrent block
}  # fmt: skip
_SLIDING = {  # Inkling: sliding-window layers with their own heads, relative logits
    "swa_num_attention_heads": 30, "swa_num_key_value_heads": 15, "swa_head_dim": 22,
    "d_rel": 17, "rel_extent": 50, "sliding_window_size": 45, "sconv_kernel_size": 19,
}  # fmt: skip
_INDEXER = {"index_n_heads": 21, "index_head_dim": 34}  # sparse attention's indexer
_STREAMS = {"hc_mult": 7}  # hyper-connections: 4 streams would make hc_mult·hc_mult == D (16)
_LINEAR = {  # linear attention (gated delta rule, KDA): its own heads and head widths
    "linear_num_key_heads": 9, "linear_num_heads": 9, "linear_num_value_heads": 18,
    "linear_key_head_dim": 23, "linear_head_dim": 23, "linear_value_head_dim": 26,
}  # fmt: skip


_MOE_UNSET = (
    "n_routed_experts",
    "num_local_experts",
    "num_experts_per_tok",
    "n_group",
    "topk_group",
)


def survey_kwargs(defaults, layout: bool = True, full: bool = True) -> dict:
    """The survey's sizes for the attributes this config has (its own spelling); only the
    basic ones (``_SET``) unless ``full``."""
    aliases = getattr(defaults, "attribute_map", {})
    have = set(defaults.to_dict()) | set(aliases)
    out, targets = {}, set()
    for k, v in _SET.items():  # an alias of an attribute already set is not set again
        if k in have and aliases.get(k, k) not in targets:  # (Whisper's KV heads are its H)
            out[k] = v
            targets.add(aliases.get(k, k))
    if not full:
        return out
    for k, v in _MOE.items():  # None too, a size its model reads all the same (DeepSeek-V2's
        value = _attr(defaults, k)  # top-k), but Gemma-4's num_experts=None: no experts
        if k in have and (isinstance(value, int) or (value is None and k in _MOE_UNSET)):
            out[k] = v
    if "n_shared_experts" in have and _attr(defaults, "n_shared_experts") is None:
        out["n_shared_experts"] = 1  # dots1 leaves it unset and multiplies by it
    if "v_head_dim" in have and isinstance(_attr(defaults, "v_head_dim"), int):
        out["v_head_dim"] = _MLA["v_head_dim"]  # value heads of their own width (MiMo-V2)
    for k, v in {**_SSM, **_LINEAR, **_SLIDING, **_INDEXER, **_STREAMS}.items():
        if k in have and isinstance(_attr(defaults, k), int | type(None)):
            out[k] = v
    if "qk_rope_head_dim" in have:  # latent attention: its rotary width is its head_dim
        out.update({k: v for k, v in _MLA.items() if k in have}, head_dim=8)
        if getattr(defaults, "q_lora_rank", None):
            out["q_lora_rank"] = 24
        if "num_key_value_heads" in have:  # keys and values come per query head
            out["num_key_value_heads"] = _SET["num_attention_heads"]
    if _mamba2_heads(defaults, have):  # Mamba-2's own num_heads × head_dim is its inner width
        out.update(num_heads=4, head_dim=48)
    if isinstance(getattr(defaults, "rotary_dim", None), int):
        out["rotary_dim"] = 8
    if "per_layer_config" in have:  # Gemma-4's full-attention layers: their own head width
        out["global_head_dim"] = 52  # (its 512 is the per-layer inputs' 2 layers × 256)
    if "hidden_size_per_layer_input" in have:  # Gemma-4's per-layer input embeddings: a
        out.update(hidden_size_per_layer_input=18, vocab_size_per_layer_input=101)  # width,
        # and the vocabulary (the model's own, as its default is)
    if layout:
        out.update(_hybrid_layers(defaults, have))
    if "use_cache" in have:
        out["use_cache"] = False  # a plain forward, no cache object to hand back
    return out


def _attr(config, name: str):
    try:
        return getattr(config, name, None)
    except Exception:  # a config that refuses a global value
        return None


def _mamba2_heads(config, have) -> bool:
    return {"num_heads", "head_dim", "n_groups", "expand"} <= have


def _hybrid_layers(config, have) -> dict:
    """A hybrid's two layers are one of each kind (a mixer layer, then an attention one):
    two layers of its default pattern are often both mixers, and a model with no attention
    layer fails to build its mask (``get_seq_length`` on a cache of mixers only)."""
    if "block_types" in have:  # RecurrentGemma: its pattern is its block types
        return {"block_types": ["recurrent", "attention"]}
    if "layer_types" not in have and "layers_block_type" not in have:
        return {}
    kinds = list(dict.fromkeys(_attr(config, "layer_types") or ()))
    if not kinds and "conv_L_cache" in have:  # LFM2-MoE leaves its pattern unset
        kinds = ["conv", "full_attention"]
    mixers = [k for k in kinds if k in ("linear_attention", "conv", "mamba")]
    others = [k for k in kinds if k not in mixers]
    if not mixers:
        return {}
    attention = [k for k in others if "attention" in k or k == "hybrid"] or ["full_attention"]
    if attention[0] == "indexed_attention" and _attr(config, "indexer_n_heads") is None:
        return {}  # Qwen4-Exp's indexed attention needs an indexer the defaults leave unset
    layers = [mixers[0], attention[0]]
    if attention[0] == "hybrid":  # Zamba's shared block is tied across two hybrid layers
        layers *= 2
    out: dict = {"layer_types": layers}
    if len(layers) > 2:
        out.update({k: len(layers) for k in ("num_hidden_layers", "n_layer") if k in have})
    if "hybrid_layer_ids" in have:  # Zamba-2 derives it from its pattern once, at init
        out["hybrid_layer_ids"] = [i for i, k in enumerate(layers) if k == "hybrid"]
    if "attn_layer_indices" in have:  # Bamba's pattern is its attention layers' indices
        out = {"attn_layer_indices": [1]}
    for key in ("attn_layer_period", "attn_layer_offset"):  # Jamba, Zamba
        if key in have:
            out[key] = {"attn_layer_period": 2, "attn_layer_offset": 1}[key]
    return out


def build(model_type: str):
    """(model, ids) for one architecture, or raise."""
    from transformers import AutoConfig, AutoModelForCausalLM

    defaults = AutoConfig.for_model(model_type)
    try:  # sizes given to the constructor: what it derives from them follows
        kwargs = survey_kwargs(defaults)
        derived = _derived(model_type, kwargs, defaults)
        kwargs = {k: v for k, v in kwargs.items() if k not in derived}
        config = AutoConfig.for_model(model_type, **kwargs)
        config = shrink(config, layout=False, keep=derived)
    except Exception:  # a config that refuses them: the basic ones set after (ZAYA allows
        config = shrink(defaults, full=False)  # top-1 routing only: no MoE sizes forced)
    torch.manual_seed(0)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        model = AutoModelForCausalLM.from_config(config, attn_implementation="eager").eval()
    vocab = model.get_input_embeddings().num_embeddings if model.get_input_embeddings() else 101
    ids = torch.randint(3, min(vocab, 101), (B, T))
    return model, ids


_DERIVED = ("num_attention_heads", "n_head", "n_heads", "num_heads", "intermediate_size")


def _derived(model_type: str, kwargs: dict, defaults) -> set[str]:
    """The sizes a config's constructor derives from its others when not given them:
    JetMoE's heads are its key/value heads × top-k, Mamba's ``intermediate_size`` is its
    expand × C (192, its I). Forcing the survey's 6 heads or F = 200 on them makes a config
    no checkpoint has (JetMoE's attention still runs KV × K heads)."""
    from transformers import AutoConfig

    out = set()
    for name in (k for k in _DERIVED if k in kwargs):
        rest = {k: v for k, v in kwargs.items() if k != name}
        with contextlib.suppress(Exception):
            value = _attr(AutoConfig.for_model(model_type, **rest), name)
            if isinstance(value, int) and value not in (kwargs[name], _attr(defaults, name)):
                out.add(name)
    return out


def _attentions(model, ids):
    with torch.no_grad():
        out = model(ids, output_attentions=True)
    maps = getattr(out, "attentions", None) or getattr(out, "decoder_attentions", None)
    queries = ids.shape[1]  # the survey's T, a size nothing else has
    return [
        m
        for m in maps or ()
        if isinstance(m, torch.Tensor) and m.dim() == 4 and m.shape[-2] == queries
    ]


def survey_one(model_type: str, seconds: int = 120) -> dict:
    """One architecture's row: ``skip`` with a reason, or its figures."""
    row: dict = {"model": model_type}
    started = time.perf_counter()
    try:
        with _limit(seconds):
            model, ids = build(model_type)
    except BaseException as e:  # a survey counts what does not build
        return {**row, "skip": f"build: {type(e).__name__}: {str(e)[:100]}"}
    try:
        with _limit(seconds), torch.no_grad():
            model(ids)
    except BaseException as e:
        return {**row, "skip": f"forward: {type(e).__name__}: {str(e)[:100]}"}
    try:
        with _limit(seconds):
            trace = tracing.trace(model, ids, capture="shapes")
    except BaseException as e:
        return {**row, "error": f"trace: {type(e).__name__}: {str(e)[:160]}"}
    row.update(_figures(trace))
    try:
        with _limit(seconds):
            eager = _attentions(model, ids)
    except BaseException:  # a model that takes no output_attentions
        eager = []
    row["maps"] = _compare_maps(trace, eager)
    row["seconds"] = round(time.perf_counter() - started, 2)
    row["pass"] = (trace.meta.get("dims_evidence") or {}).get("pass")
    return row


def _figures(trace) -> dict:
    letters = {k: v["size"] for k, v in (trace.meta.get("dim_letters") or {}).items()}
    truth = {**letters, "B": B, "T": T}
    axes = named = 0
    wrong: list[str] = []
    unnamed: dict[str, int] = {}
    for r in trace.tensors:
        if len(r.shape) < 2:
            continue
        dims = r.dims or ("?",) * len(r.shape)
        for i, (name, size) in enumerate(zip(dims, r.shape)):
            axes += 1
            if name != "?":
                named += 1
            else:
                key = f"{r.shape}[{i}]"
                unnamed[key] = unnamed.get(key, 0) + 1
            if name in STANDARD and truth.get(name) != size:
                producer = trace.steps[r.producer].op if r.producer is not None else r.role
                wrong.append(f"#{r.id} {producer} {r.shape} {dims}")
    worst = sorted(unnamed.items(), key=lambda kv: -kv[1])[:4]
    return {
        "named": round(100 * named / axes, 2) if axes else 100.0,
        "axes": axes,
        "wrong": len(wrong),
        "wrong_examples": wrong[:4],
        "unnamed_examples": [f"{k}×{n}" for k, n in worst],
    }


def _compare_maps(trace, eager: list[torch.Tensor]) -> str:
    if not eager:
        return "-"
    from tracing.analysis.attention_maps import attention_map_records

    records = attention_map_records(trace)
    mine = list(trace.attention_maps().items())
    if len(mine) != len(eager):
        return f"≠ {len(mine)} maps, eager {len(eager)}"
    for (key, a), b in zip(mine, eager):
        dims = trace.tensors[records[key]].dims or ()
        if a.dim() == b.dim() and all("Pr" in d for d in dims[-2:]):  # eager drops the prompt
            a = a[..., -b.shape[-2] :, -b.shape[-1] :]
        if a.shape != b.shape or not torch.allclose(a.float(), b.float(), atol=1e-6, rtol=0):
            return "≠ values"
    return "="


def summary(rows: list[dict]) -> dict:
    ok = [r for r in rows if "named" in r]
    named = [r["named"] for r in ok]
    maps = [r["maps"] for r in ok if r["maps"] != "-"]
    return {
        "architectures": len(rows),
        "surveyed": len(ok),
        "skipped": sum("skip" in r for r in rows),
        "trace_errors": sum("error" in r for r in rows),
        "median_named": round(statistics.median(named), 2) if named else None,
        "min_named": min(named) if named else None,
        "below_90": sum(n < 90 for n in named),
        "below_98": sum(n < 98 for n in named),
        "wrong_letters": sum(r["wrong"] for r in ok),
        "models_with_wrong": sum(r["wrong"] > 0 for r in ok),
        "maps_returned": len(maps),
        "maps_equal": sum(m == "=" for m in maps),
    }


def meets_targets(s: dict) -> bool:
    return (
        s["median_named"] is not None
        and s["median_named"] >= 98
        and s["min_named"] >= 90
        and s["wrong_letters"] == 0
        and s["maps_equal"] == s["maps_returned"]
        and s["trace_errors"] == 0
    )


def architectures() -> list[str]:
    from transformers.models.auto.modeling_auto import MODEL_FOR_CAUSAL_LM_MAPPING_NAMES

    return sorted(MODEL_FOR_CAUSAL_LM_MAPPING_NAMES)


def survey_arguments(doc: str, failing: bool = True) -> argparse.ArgumentParser:
    """The command line the surveys share: model types (default: all), ``--threads``, and
    ``--failing`` (only the last run's misses) where the survey keeps its last run."""
    parser = argparse.ArgumentParser(description=doc.splitlines()[0])
    parser.add_argument("models", nargs="*", help="model types (default: all)")
    if failing:
        parser.add_argument("--failing", action="store_true", help="only the last run's misses")
    parser.add_argument("--threads", type=int, default=1)
    return parser


def quiet(threads: int) -> None:
    """torch on ``threads`` threads, warnings and transformers' logging off: a survey's
    output is its rows."""
    torch.set_num_threads(threads)
    warnings.simplefilter("ignore")
    import transformers

    transformers.logging.set_verbosity_error()


def main() -> None:
    parser = survey_arguments(__doc__)
    parser.add_argument("--verbose", "-v", action="store_true", help="examples of misses")
    args = parser.parse_args()
    quiet(args.threads)
    names = args.models or architectures()
    if args.failing and LAST.exists():
        last = json.loads(LAST.read_text())
        names = [r["model"] for r in last if _misses(r)]
    rows = []
    started = time.perf_counter()
    for name in names:
        row = survey_one(name)
        rows.append(row)
        print(_line(row, args.verbose), flush=True)
    s = summary(rows)
    print(f"\n{len(rows)} architectures in {time.perf_counter() - started:.0f} s")
    print(
        f"surveyed {s['surveyed']} (skipped {s['skipped']}: no build or no plain forward here; "
        f"trace errors {s['trace_errors']})"
    )
    print(
        f"named: median {s['median_named']}% (target ≥ 98), min {s['min_named']}% "
        f"(target ≥ 90; {s['below_90']} below 90, {s['below_98']} below 98)"
    )
    print(f"wrong letters: {s['wrong_letters']} in {s['models_with_wrong']} models (target 0)")
    print(f"attention maps equal to eager: {s['maps_equal']} of {s['maps_returned']} returned")
    print("targets met" if meets_targets(s) else "targets NOT met")
    if not args.models and not args.failing:
        LAST.write_text(json.dumps(rows, indent=1))
    elif LAST.exists():  # merge
        last = {r["model"]: r for r in json.loads(LAST.read_text())}
        last.update({r["model"]: r for r in rows})
        LAST.write_text(json.dumps(list(last.values()), indent=1))


def _misses(row: dict) -> bool:
    return "error" in row or (
        "named" in row and (row["named"] < 98 or row["wrong"] or row["maps"].startswith("≠"))
    )


def _line(row: dict, verbose: bool) -> str:
    if "skip" in row:
        return f"{row['model']:<28} skip  {row['skip']}"
    if "error" in row:
        return f"{row['model']:<28} ERROR {row['error']}"
    text = (
        f"{row['model']:<28} named {row['named']:6.2f}%  wrong {row['wrong']:<3} "
        f"maps {row['maps']:<4} {row['seconds']:5.1f} s  {row['pass']}"
    )
    if verbose and (row["named"] < 98 or row["wrong"]):
        text += "\n    unnamed: " + ", ".join(row["unnamed_examples"])
        if row["wrong_examples"]:
            text += "\n    wrong:   " + "\n             ".join(row["wrong_examples"])
    return text


if __name__ == "__main__":
    sys.exit(main())
