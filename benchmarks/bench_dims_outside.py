"""Dims on models from outside ``transformers``, at distinct and coinciding sizes (issue 31, 7).

    .venv/bin/python benchmarks/bench_dims_outside.py            # every model
    .venv/bin/python benchmarks/bench_dims_outside.py vit lstm -v  # these, with examples

The transformers survey (``bench_dims_architectures.py``) only sees Hugging Face models at
one set of sizes. This one traces models people write elsewhere (``outside_models.py``): a
vision transformer (timm-style fused q/k/v, and one on ``nn.MultiheadAttention``), an LSTM
and a GRU language model, attention written with einsum, the tutorial's classes and nanoGPT
(``tests/helpers/models``), ``nn.TransformerEncoderLayer`` (batch first, and in torch's
default layout, tokens first: ``(T, B)`` ids) and ``nn.TransformerDecoder``,
and, where installed for the benchmark only, x-transformers, litgpt and timm's ViT (install
them with ``--no-deps``, see below; an absent one is skipped). Each is traced at sizes that
all differ, then again with two sizes made equal (patches == head width, vocab == hidden,
T == D, B == T, H == D/2...), one variant at a time. Released models' real sizes (Llama-3-70B,
Mistral-7B, Qwen2-7B: two layers, on the meta device) are the coinciding variant of the same
architecture at small distinct sizes.

What a name claims is checked, not its spelling. A name is read as a size expression
(``B·T``, ``KV·D``, ``D/2``, ``1+D``, ``3C``, ``4·hidden_size``); each letter or knob in it
takes its size from the model's own truth table below where the truth is known (the
letters' sizes the trace reports are used only where the table is silent). Per run:

- **named**: the share of the axes of ≥2-D tensors that carry a name (not ``?``), as in the
  transformers survey;
- **wrong**: axes (of every tensor) whose name is false: its expression does not come to
  the axis's size, or it uses a standard letter the model has no such thing for (``D`` in a
  model without heads, ``V`` in an image classifier), or, in a coinciding variant, it does
  not hold at the distinct sizes for the same axis of the same step (``D`` on 16 patches is
  16, but the patches were 49 where D was 10): a name is a claim about what an axis is,
  so it must hold at every size;
- **changed**: axes named differently from the distinct run (same steps, same tensor);
- **unchecked**: names this table cannot evaluate (a letter with no known size, a slice);
- **maps**: attention maps the trace found (``attention_map_records``, on meta too) /
  attention layers.

Targets (issue 31): ≥ 90% named, no wrong name, no changed name, every map found.

Installing the libraries for the benchmark only (they pin their own torch or packages that
break ``transformers``; never let pip resolve their dependencies)::

    .venv/bin/pip install --no-deps x-transformers einops einx loguru frozendict \
        torch-einops-utils
    .venv/bin/pip install --no-deps litgpt lightning lightning-utilities torchmetrics psutil
    .venv/bin/pip install --no-deps timm  # its layers import torchvision: skipped without a
                                          # torchvision built for this torch (PyPI's is not)

litgpt's own ``__init__`` (its whole training stack) is not run: its ``model.py`` and
``config.py`` are imported alone.
"""

from __future__ import annotations

import argparse
import itertools
import os
import re
import sys
import time
import warnings
from dataclasses import dataclass, field
from fractions import Fraction
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).parent))
import outside_models as zoo

import tracing

os.environ.setdefault("SCRATCHFORMER_DIMS_STRICT", "1")  # a fault in naming is counted
from tracing.analysis.attention_maps import attention_map_records

STANDARD = ("B", "T", "C", "H", "KV", "D", "F", "V", "N")
"""Letters the truth tables rule on: one a model has no such thing for is a wrong name."""


# --------------------------------------------------------------------------- what is true


def _vit_truth(s: dict) -> dict:
    p = (s["img"] // s["patch"]) ** 2
    d = s["C"] // s["H"]
    return dict(B=s["B"], C=s["C"], H=s["H"], KV=s["H"], D=d, F=s["F"], T={p, p + 1}, Tk=p + 1,
                N={p, p + 1}, image_size=s["img"], img_size=s["img"], patch_size=s["patch"],
                in_chans=3, channels=3, num_classes=s["classes"], embed_dim=s["C"],
                num_heads=s["H"], head_dim=d, mlp_dim=s["F"], num_patches=p,
                mlp_ratio=Fraction(s["F"], s["C"]))  # fmt: skip


def _recurrent_truth(s: dict) -> dict:  # no heads, no feed-forward, no position table
    return dict(B=s["B"], T=s["T"], V=s["V"], C={s["E"], s["Hd"]}, E=s["E"], Hd=s["Hd"],
                embed_dim=s["E"], embedding_dim=s["E"], hidden_size=s["Hd"],
                num_layers=s["L"], L=s["L"], vocab_size=s["V"])  # fmt: skip


def _lm_truth(s: dict, **spellings: str) -> dict:
    """A decoder LM's letters, and each constructor argument (its knob) by its own name."""
    out = dict(B=s["B"], T=s["T"], C=s["C"], H=s["H"], KV=s.get("KV", s["H"]),
               D=s.get("D", s["C"] // s["H"]), F=s["F"], V=s["V"])  # fmt: skip
    if "N" in s:
        out.update(N=s["N"], R=out["D"])
    out.update({knob: out[letter] for knob, letter in spellings.items()})
    return out


@dataclass
class Case:
    """One architecture: its builder, its distinct sizes, what is true at given sizes, and
    the variants that make two sizes coincide (each a change to the distinct sizes)."""

    name: str
    build: object  # sizes -> (model, inputs)
    sizes: dict
    truth: object  # sizes -> {letter or knob: size, or a set of allowed sizes}
    variants: dict = field(default_factory=dict)
    attention_layers: int = 2
    hook: tuple | None = None  # (function of sizes, sizes -> its arguments): --rebuild's


VIT = dict(B=2, img=28, patch=4, C=60, H=6, F=120, classes=11)  # 49 patches, D=10
VIT_VARIANTS = {
    "patches == D, patch == D/2": dict(img=32, patch=8, C=96),  # the issue's: 16, 16, 8
    "B == channels": dict(B=3),
    "F == 3C (fused qkv)": dict(F=180),
    "H == patch": dict(H=4, C=60),  # D=15
    "classes == C": dict(classes=60),
}
LM = dict(B=3, T=11, V=101, C=96, H=6, F=200, N=76)  # D=16
LM_VARIANTS = {
    "T == D": dict(T=16),
    "B == T": dict(B=11),
    "V == C": dict(V=96),
    "H == D/2": dict(C=72),  # 6 heads of 12
    "F == V": dict(V=200),
}
EINSUM = dict(B=3, T=11, V=101, C=96, H=6, D=20, F=200, N=76)  # inner H·D = 120 ≠ C
RECURRENT = dict(B=3, T=11, V=50, E=24, Hd=40, L=2)
RECURRENT_VARIANTS = {
    "V == Hd": dict(V=40),
    "T == Hd": dict(T=40),
    "E == Hd": dict(E=40),
    "B == T": dict(B=11),
    "B == layers": dict(B=2),
}
GQA = dict(B=3, T=11, V=101, C=96, H=6, KV=2, D=16, F=200, N=76)  # the transformers survey's
OWN_GQA = dict(B=3, T=11, V=101, C=96, H=8, KV=2, D=20, F=200, N=76)  # H·D = 160 ≠ C, H/KV ≠ B
OWN_GQA_VARIANTS = {
    "T == D": dict(T=20),
    "B == T": dict(B=11),
    "H == D/2": dict(D=16),
    "H·D == C": dict(D=12),
    "(H+2KV)·D == F": dict(F=240),  # a fused q/k/v as wide as the MLP
    "F == V": dict(V=200),
}
TORCH_KNOBS = dict(d_model="C", nhead="H", dim_feedforward="F", vocab_size="V")

# fmt: off
CASES = [
    Case("vit", zoo.vit, VIT, _vit_truth, VIT_VARIANTS),
    Case("vit-mha", lambda s: zoo.vit(s, torch_mha=True), VIT, _vit_truth, VIT_VARIANTS),
    Case("lstm-lm", zoo.recurrent, RECURRENT, _recurrent_truth, RECURRENT_VARIANTS, 0),
    Case("gru-lm", lambda s: zoo.recurrent(s, "gru"), RECURRENT, _recurrent_truth,
         RECURRENT_VARIANTS, 0),
    Case("einsum-attention", zoo.einsum_lm, EINSUM,
         lambda s: _lm_truth(s, dim="C", heads="H", dim_head="D", ff_dim="F",
                             vocab_size="V", max_seq_len="N"),
         {"T == D": dict(T=20), "B == T": dict(B=11), "H == D/2": dict(H=8, D=16),
          "V == C": dict(V=96), "H·D == C": dict(D=16)}),
    Case("tutorial", zoo.tutorial, LM,
         lambda s: _lm_truth(s, d_model="C", num_heads="H", d_head="D", d_ff="F",
                             vocab_size="V", max_len="N"), LM_VARIANTS),
    Case("nanogpt", zoo.nanogpt, {**LM, "F": 384},
         lambda s: _lm_truth(s, n_embd="C", n_head="H", vocab_size="V", block_size="N"),
         {"T == D": dict(T=16), "B == T": dict(B=11), "V == C": dict(V=96),
          "H == D/2": dict(C=72, F=288), "N == T": dict(N=11),
          "V == F": dict(V=384)}),
    Case("torch-encoder", zoo.torch_layers, {k: v for k, v in LM.items() if k != "N"},
         lambda s: _lm_truth(s, **TORCH_KNOBS),
         {k: v for k, v in LM_VARIANTS.items() if k != "V == C"}),
    Case("torch-tokens-first", lambda s: zoo.torch_layers(s, "tokens first"),
         {k: v for k, v in LM.items() if k != "N"}, lambda s: _lm_truth(s, **TORCH_KNOBS),
         {k: v for k, v in LM_VARIANTS.items() if k != "V == C"}),
    Case("torch-decoder", lambda s: zoo.torch_layers(s, "decoder"),
         {k: v for k, v in LM.items() if k != "N"}, lambda s: _lm_truth(s, **TORCH_KNOBS),
         {k: v for k, v in LM_VARIANTS.items() if k != "V == C"}, 4),  # self and cross
    Case("x-transformers", zoo.x_transformers, {**OWN_GQA, "F": 384},
         lambda s: _lm_truth(s, dim="C", heads="H", kv_heads="KV", dim_head="D",
                             attn_dim_head="D", num_tokens="V", max_seq_len="N", ff_dim="F"),
         {**OWN_GQA_VARIANTS, "F == V": dict(V=384), "V == C": dict(V=96)},
         hook=(zoo.x_transformers_model, zoo.x_transformers_sizes)),
    Case("litgpt", zoo.litgpt, OWN_GQA,
         lambda s: _lm_truth(s, n_embd="C", n_head="H", n_query_groups="KV", head_size="D",
                             intermediate_size="F", vocab_size="V", padded_vocab_size="V",
                             block_size="N"), OWN_GQA_VARIANTS),
    Case("timm-vit", zoo.timm_vit, VIT, _vit_truth, VIT_VARIANTS),
]
# fmt: on
HF_KNOBS = dict(
    hidden_size="C",
    num_attention_heads="H",
    num_key_value_heads="KV",
    head_dim="D",
    intermediate_size="F",
    vocab_size="V",
    max_position_embeddings="N",
)  # fmt: skip
for _name, (_cls, _) in zoo.RELEASED.items():  # the same architecture, config and code
    _real = zoo.released_sizes(_name)  # paths (rope_theta, sliding_window) at small sizes
    CASES.append(Case(
        _name, lambda s, c=_cls: zoo.hf_causal(s, c), {**GQA, "extra": _real["extra"]},
        lambda s: _lm_truth(s, **HF_KNOBS), {"released sizes, meta": {**_real, "device": "meta"}},
    ))  # fmt: skip


# --------------------------------------------------------------------------- reading a name

_TOKEN = re.compile(r"\s*(\d+|[A-Za-z_][A-Za-z0-9_.]*|[()+\-·*×/²])")


def parse(name: str) -> list[str]:
    """The tokens of a size expression, ``ValueError`` where it is not one (a slice)."""
    tokens, at = [], 0
    while at < len(name):
        m = _TOKEN.match(name, at)
        if not m:
            raise ValueError(name)
        tokens.append(m.group(1))
        at = m.end()
    return tokens


def evaluate(tokens: list[str], sizes: dict) -> Fraction:
    """``tokens`` as arithmetic: ``+ -``, then ``· * × /`` and juxtaposition (``3C``,
    ``2Hk·Dk``), ``²``, parentheses; names take ``sizes``."""
    at = 0

    def peek():
        return tokens[at] if at < len(tokens) else None

    def take():
        nonlocal at
        at += 1
        return tokens[at - 1]

    def atom():
        tok = take()
        if tok == "(":
            value = expr()
            if take() != ")":
                raise ValueError("unbalanced")
        elif tok.isdigit():
            value = Fraction(int(tok))
        elif tok[0].isalpha() or tok[0] == "_":
            value = Fraction(sizes[tok])
        else:
            raise ValueError(tok)
        while peek() == "²":
            take()
            value *= value
        return value

    def term():
        value = atom()
        while peek() is not None and peek() not in "+-)":
            op = take() if peek() in ("·", "*", "×", "/") else "·"
            right = atom()
            value = value / right if op == "/" else value * right
        return value

    def expr():
        value = term()
        while peek() in ("+", "-"):
            value = value + term() if take() == "+" else value - term()
        return value

    value = expr()
    if at != len(tokens):
        raise ValueError("trailing")
    return value


def fits(name: str, size: int, truth: dict, own: dict) -> bool | None:
    """Whether ``name`` comes to ``size``: ``True``, ``False``, or ``None`` where it cannot
    be evaluated. A letter of the truth table takes its true size (the trace's own where
    that is one of the allowed ones); a standard letter the table lacks is false."""
    if name.startswith("?"):
        return True  # no claim
    try:
        tokens = parse(name)
    except ValueError:
        return None
    choices = {}
    for tok in {t for t in tokens if t[0].isalpha() or t[0] == "_"}:
        key = tok if tok in truth else tok.rsplit(".", 1)[-1]
        if key in truth:
            allowed = truth[key] if isinstance(truth[key], set) else {truth[key]}
            choices[tok] = [own[tok]] if own.get(tok) in allowed else sorted(allowed)
        elif key in STANDARD:
            return False  # a concept this model does not have
        elif tok in own:
            choices[tok] = [own[tok]]
        else:
            return None
    try:
        return any(
            evaluate(tokens, dict(zip(choices, combo))) == size
            for combo in itertools.product(*choices.values())
        )
    except (ValueError, ZeroDivisionError, IndexError, KeyError):
        return None


# --------------------------------------------------------------------------- one run


@dataclass
class Run:
    """One trace's names and what the sizes were."""

    keys: list
    tensors: list  # (shape, dims)
    truth: dict
    own: dict  # the letters' sizes the trace reports
    maps: int
    seconds: float


REBUILD = False
"""``--rebuild``: each model is traced with ``rebuild=tracing.Constructor(its class, the
arguments it was built with)``, as a user who says how it was built (the knob passes run).
A class that takes its layers built (x-transformers' ``TransformerWrapper(attn_layers=
Decoder(...))``) is rebuilt by the function of sizes that builds both (``Case.hook``), as
its user would write it: the class's own arguments are not its sizes."""


def _built_with(build, sizes: dict):
    """The model, its inputs, and the arguments its class was called with (recorded by a
    second build: the first says which class)."""
    import inspect

    model, _ = build(sizes)
    cls, calls = type(model), []
    if getattr(model, "config", None) is not None:
        return (*build(sizes), None)  # a config's model is rebuilt from its config already
    init, signature = cls.__init__, inspect.signature(cls)

    def recording(self, *args, **kwargs):
        if not calls:
            calls.append(signature.bind(*args, **kwargs).arguments)
        init(self, *args, **kwargs)

    cls.__init__ = recording
    try:
        torch.manual_seed(0)
        model, inputs = build(sizes)
    finally:
        cls.__init__ = init
    return model, inputs, tracing.Constructor(cls, **calls[0]) if calls else None


def run(case: Case, sizes: dict) -> Run:
    torch.manual_seed(0)
    started = time.perf_counter()
    if REBUILD and case.hook is not None:  # the class takes its layers built: the
        (model, inputs), rebuild = case.build(sizes), None  # user's function of sizes is
        function, arguments = case.hook  # the rebuild (tracing.Constructor takes either)
        rebuild = tracing.Constructor(function, **arguments(sizes))
    elif REBUILD:
        model, inputs, rebuild = _built_with(case.build, sizes)
    else:
        (model, inputs), rebuild = case.build(sizes), None
    trace = tracing.trace(model.eval(), *inputs, capture="shapes", rebuild=rebuild)
    own = {k: v.get("size") for k, v in (trace.meta.get("dim_letters") or {}).items()}
    maps = len(attention_map_records(trace))  # read from the records: on meta too
    return Run(
        keys=[(s.module, s.op, len(s.inputs), len(s.outputs)) for s in trace.steps],
        tensors=[(r.shape, r.dims or ("?",) * len(r.shape)) for r in trace.tensors],
        truth=case.truth(sizes),
        own=own,
        maps=maps,
        seconds=time.perf_counter() - started,
    )


@dataclass
class Figures:
    named: float
    wrong: list = field(default_factory=list)
    changed: list = field(default_factory=list)
    unchecked: int = 0
    aligned: bool = True


def figures(r: Run, base: Run | None = None) -> Figures:
    """This run's figures; against ``base`` (the distinct sizes), changed names and names
    that do not hold at the base's sizes too."""
    axes = named = 0
    out = Figures(named=0.0)
    pairs = zip(r.tensors, base.tensors) if base else ((t, None) for t in r.tensors)
    if base and (r.keys != base.keys or len(r.tensors) != len(base.tensors)):
        out.aligned, pairs = False, ((t, None) for t in r.tensors)
    for tid, ((shape, dims), other) in enumerate(pairs):
        if other and len(other[0]) != len(shape):
            other = None
        for i, (name, size) in enumerate(zip(dims, shape)):
            if len(shape) >= 2:
                axes += 1
                named += not name.startswith("?")
            where = f"#{tid} {shape}[{i}] {name}"
            ok = fits(name, size, r.truth, r.own)
            if other is not None:
                was, was_size = other[1][i], other[0][i]
                if name != was:
                    out.changed.append(f"#{tid}[{i}] {was}={was_size} -> {name}={size}")
                if ok and fits(name, was_size, base.truth, base.own) is False:
                    ok, where = False, f"{where} (not at the distinct sizes: {was}={was_size})"
                elif ok and fits(was, size, r.truth, r.own) is False:  # the distinct run's
                    ok, where = False, f"{where} (the distinct run's {was} is not {size} here)"
            if ok is None:
                out.unchecked += 1
            elif not ok:
                out.wrong.append(where)
    out.named = 100 * named / axes if axes else 100.0
    return out


# --------------------------------------------------------------------------- the survey


def survey(case: Case, verbose: bool) -> dict | None:
    """Print one model's rows; its totals, or ``None`` where it is skipped."""
    try:
        base = run(case, case.sizes)
    except ImportError as e:
        print(f"{case.name:<17} skip  cannot import {e.name or e} here")
        return None
    except Exception as e:
        print(f"{case.name:<17} ERROR {type(e).__name__}: {str(e)[:120]}")
        return {"error": True}
    rows = [("distinct", figures(base), base)]
    for label, change in case.variants.items():
        try:
            r = run(case, {**case.sizes, **change})
        except Exception as e:
            print(f"{case.name:<17} {label:<28} ERROR {type(e).__name__}: {str(e)[:80]}")
            continue
        rows.append((label, figures(r, base), r))
    for i, (label, f, r) in enumerate(rows):
        changed = "steps differ" if not f.aligned else (len(f.changed) if i else "-")
        print(
            f"{case.name if i == 0 else '':<17} {label:<28} named {f.named:5.1f}%  "
            f"wrong {len(f.wrong):<4} changed {changed!s:<5} unchecked {f.unchecked:<3} "
            f"maps {r.maps}/{case.attention_layers}  {r.seconds:4.1f} s"
        )
        if verbose:
            for text in f.wrong[:4]:
                print(f"{'':<19}wrong    {text}")
            for text in f.changed[:4]:
                print(f"{'':<19}changed  {text}")
    return {
        "min_named": min(f.named for _, f, _ in rows),
        "wrong": sum(len(f.wrong) for _, f, _ in rows),
        "changed": sum(len(f.changed) for _, f, _ in rows),
        "maps_missing": any(r.maps != case.attention_layers for _, _, r in rows),
    }


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("models", nargs="*", help=", ".join(c.name for c in CASES))
    parser.add_argument("--verbose", "-v", action="store_true", help="examples of misses")
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--rebuild", action="store_true", help="trace with tracing.Constructor")
    args = parser.parse_args()
    global REBUILD
    REBUILD = args.rebuild
    torch.set_num_threads(args.threads)
    warnings.simplefilter("ignore")
    try:
        import transformers

        transformers.logging.set_verbosity_error()
    except ImportError:
        pass
    cases = [c for c in CASES if not args.models or c.name in args.models]
    started = time.perf_counter()
    totals = {c.name: survey(c, args.verbose) for c in cases}
    done = {k: v for k, v in totals.items() if v and "error" not in v}
    print(f"\n{len(done)} models surveyed in {time.perf_counter() - started:.0f} s "
          f"(skipped {sum(v is None for v in totals.values())}, "
          f"errors {sum(bool(v) and 'error' in v for v in totals.values())})")  # fmt: skip
    for name, t in done.items():
        met = t["min_named"] >= 90 and not (t["wrong"] or t["changed"] or t["maps_missing"])
        print(
            f"  {name:<17} min named {t['min_named']:5.1f}%  wrong {t['wrong']:<4} "
            f"changed {t['changed']:<4} maps {'off' if t['maps_missing'] else 'all'}"
            f"  {'targets met' if met else 'targets NOT met'}"
        )
    return 0


if __name__ == "__main__":
    sys.exit(main())
