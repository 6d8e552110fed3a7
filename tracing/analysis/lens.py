"""Read the residual stream: the logit lens and what each attention head writes into it.

**Logit lens.** A decoder-only Transformer keeps one vector per position, the *residual
stream* ``(B, T, C)``, and every block adds to it. Only the last one is read out, through
the final LayerNorm and the LM head. The logit lens reads it out after *every* block in
the same way, asking "if the model stopped here, what would it predict?":

    logits_l = lm_head(final_norm(x_l))        # x_l: stream after block l, (B, T, C) -> (B, T, V)

For each layer and position this gives the top token and its probability, and the
probability each layer gives to the token the full model finally predicts (a layers x
tokens array: watch the answer form layer by layer). The last layer's read-out *is* the
model's output.

**Per-head contributions.** Multi-head attention concatenates the H heads' outputs
``(B, T, H*D)`` and projects them with ``W_o``. Because the projection is linear, that is a
sum of H separate writes plus the bias:

    W_o(concat) = sum_h  concat[..., h*D:(h+1)*D] @ W_o.weight[:, h*D:(h+1)*D].T  + b

so head ``h`` writes exactly its term into the residual stream, and the norm of that term
says how much it wrote. :func:`head_writes` gives the vectors, :func:`head_contributions`
their mean norms as a ``(layers, heads)`` array.

Both work on a trace captured with ``capture="values"`` plus the model (for the weights of
the final norm, the LM head and ``W_o``). This module never imports ``scratchformer``:
paths and attribute names are parameters with defaults that fit it (and fit Hugging Face
GPT-2 with ``final_norm="transformer.ln_f"``, ``out_proj="c_proj"``).
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import numpy as np
import torch
import torch.nn as nn

from tracing.formatting import step_text

if TYPE_CHECKING:  # pragma: no cover
    from tracing.record import Step, Trace

_INDEXED = re.compile(r"^(?P<list>.+)\.(?P<n>\d+)$")
_HEAD_ATTRS = ("n_heads", "num_heads", "n_head", "num_attention_heads", "h")

# --------------------------------------------------------------------------- helpers


def _need_values(trace: Trace, step: Step, what: str, which: str = "output") -> torch.Tensor:
    ids = step.outputs if which == "output" else step.inputs
    if not ids:
        raise ValueError(f"{what}: {step_text(step.index)} ({step.label}) has no {which} tensor")
    value = trace.value(ids[0])
    if value is None:
        raise ValueError(
            f"{what} needs tensor values, but the trace kept none for {step.label}: "
            "trace with capture='values' (and a size cap large enough for (B, T, C))"
        )
    return value


def _first_call(trace: Trace, path: str, what: str) -> Step:
    steps = trace.module_steps(path)
    if not steps:
        raise ValueError(f"{what}: module {path!r} did not run in this trace")
    return steps[0]


def _submodule(model: nn.Module, path: str, what: str) -> nn.Module:
    try:
        return model.get_submodule(path)
    except AttributeError as e:
        raise ValueError(f"{what}: the model has no module {path!r}") from e


def find_blocks(trace: Trace) -> list[str]:
    """Paths of the repeated blocks, in order: ``["blocks.0", "blocks.1", ...]``.

    Prefers modules named ``blocks.N``; otherwise the largest list container
    (``ModuleList``/``Sequential``) whose numbered children are all of one type, e.g.
    ``transformer.h.N`` in Hugging Face GPT-2.
    """
    groups: dict[str, list[tuple[int, str, str]]] = {}
    for path, info in trace.modules.items():
        m = _INDEXED.match(path)
        if m:
            groups.setdefault(m["list"], []).append((int(m["n"]), path, info.type))
    if not groups:
        raise ValueError("no repeated blocks (modules named like 'blocks.0') in this trace")

    def rank(item: tuple[str, list[tuple[int, str, str]]]):
        name, members = item
        same_type = len({t for _, _, t in members}) == 1
        named_blocks = name == "blocks" or name.endswith(".blocks")
        return (named_blocks, same_type, len(members))

    _, members = max(groups.items(), key=rank)
    return [p for _, p, _ in sorted(members)]


# --------------------------------------------------------------------------- logit lens


@dataclass
class LensResult:
    """The logit lens read-out. Arrays are numpy, for batch row ``batch`` of the trace.

    ``L`` layers (one per block, plus the embeddings first if asked), ``T`` positions,
    ``K`` top tokens.
    """

    layers: list[str]  # block paths ("embeddings" first when include_embeddings)
    top_tokens: np.ndarray  # (L, T, K) int64: the K most likely next tokens per layer
    top_probs: np.ndarray  # (L, T, K) float32: their probabilities
    final_tokens: np.ndarray  # (T,) int64: the token the last layer predicts per position
    final_token_probs: np.ndarray  # (L, T) float32: each layer's probability of that token
    input_tokens: list[int] | None = None  # the traced prompt, when the trace knows it
    meta: dict[str, Any] = field(default_factory=dict)

    @property
    def top_token(self) -> np.ndarray:
        """(L, T): the top prediction per layer and position."""
        return self.top_tokens[..., 0]

    @property
    def top_prob(self) -> np.ndarray:
        """(L, T): its probability."""
        return self.top_probs[..., 0]

    @property
    def shape(self) -> tuple[int, int]:
        """(layers, positions)."""
        return self.final_token_probs.shape  # type: ignore[return-value]

    def to_dict(self) -> dict[str, Any]:
        """JSON-ready data."""
        return {
            "layers": list(self.layers),
            "top_tokens": self.top_tokens.tolist(),
            "top_probs": self.top_probs.tolist(),
            "final_tokens": self.final_tokens.tolist(),
            "final_token_probs": self.final_token_probs.tolist(),
            "input_tokens": self.input_tokens,
        }


def _block_output(trace: Trace, path: str) -> torch.Tensor:
    step = _first_call(trace, path, "logit lens")
    out = _need_values(trace, step, "logit lens")
    if out.dim() != 3:
        raise ValueError(
            f"logit lens: {path} output is shaped {tuple(out.shape)}, expected (B, T, C)"
        )
    return out


def logit_lens(
    model: nn.Module,
    trace: Trace,
    *,
    final_norm: str | None = "final_norm",
    lm_head: str = "lm_head",
    block_outputs: list[str] | None = None,
    include_embeddings: bool = False,
    top_k: int = 5,
    batch: int = 0,
) -> LensResult:
    """Project the residual stream after each block through the final norm and LM head.

    ``block_outputs`` are the module paths whose (first) output is the stream after each
    layer; by default every ``blocks.N`` (see :func:`find_blocks`). ``final_norm=None``
    skips the norm (a model without one). With ``include_embeddings`` the stream entering
    the first block comes first, as layer ``"embeddings"``.
    """
    paths = list(block_outputs) if block_outputs is not None else find_blocks(trace)
    if not paths:
        raise ValueError("logit lens: no block outputs given")
    norm = _submodule(model, final_norm, "logit lens") if final_norm else nn.Identity()
    head = _submodule(model, lm_head, "logit lens")

    streams = [_block_output(trace, p) for p in paths]  # L x (B, T, C)
    layers = list(paths)
    if include_embeddings:
        first = _first_call(trace, paths[0], "logit lens")
        streams.insert(0, _need_values(trace, first, "logit lens", which="input"))
        layers.insert(0, "embeddings")
    if not 0 <= batch < streams[0].size(0):
        raise ValueError(f"logit lens: batch index {batch} out of range")

    param = next(iter(head.parameters()), None)
    device = param.device if param is not None else torch.device("cpu")
    dtype = param.dtype if param is not None else torch.float32
    probs_per_layer = []
    with torch.no_grad():
        for x in streams:
            x = x[batch : batch + 1].to(device, dtype)  # (1, T, C)
            logits = head(norm(x))  # (1, T, V)
            probs_per_layer.append(torch.softmax(logits.float(), dim=-1)[0].cpu())  # (T, V)
    probs = torch.stack(probs_per_layer)  # (L, T, V)
    k = min(top_k, probs.size(-1))
    top = probs.topk(k, dim=-1)  # (L, T, K)
    final_tokens = probs[-1].argmax(-1)  # (T,)
    index = final_tokens.view(1, -1, 1).expand(probs.size(0), -1, 1)
    final_token_probs = probs.gather(-1, index)[..., 0]  # (L, T)

    tokens = trace.meta.get("tokens")
    input_tokens = None
    if isinstance(tokens, list) and tokens:
        row = tokens[batch] if isinstance(tokens[0], list) else tokens
        input_tokens = [int(t) for t in row]
    return LensResult(
        layers=layers,
        top_tokens=top.indices.numpy().astype(np.int64),
        top_probs=top.values.numpy().astype(np.float32),
        final_tokens=final_tokens.numpy().astype(np.int64),
        final_token_probs=final_token_probs.numpy().astype(np.float32),
        input_tokens=input_tokens,
        meta={"final_norm": final_norm, "lm_head": lm_head, "batch": batch},
    )


# --------------------------------------------------------------------------- heads


def find_attention_modules(trace: Trace, out_proj: str = "W_o") -> list[str]:
    """Paths of the modules that own an output projection named ``out_proj``, in the order
    they first ran (``blocks.0.self_attn``, ``blocks.1.self_attn``...)."""
    suffix = "." + out_proj
    owners = {p[: -len(suffix)] for p in trace.modules if p.endswith(suffix)}
    if out_proj in trace.modules:
        owners.add("")
    # keep the attention modules (an MLP may name its output projection the same way):
    # those with an attention map recorded in their subtree, or a head-count hint in extra_repr
    maps = list(trace.attention_maps())
    hints = ("head",)

    def is_attention(path: str) -> bool:
        info = trace.modules.get(path)
        if info is not None and any(h in info.extra.lower() for h in hints):
            return True
        prefix = path + "." if path else ""
        return any(m == path or m.startswith(prefix) for m in maps)

    first_run = {}
    for s in trace.steps:
        if s.kind == "module" and s.module in owners and s.module not in first_run:
            first_run[s.module] = s.index
    return [p for p in sorted(first_run, key=first_run.__getitem__) if is_attention(p)]


def _num_heads(module: nn.Module, trace: Trace, path: str) -> int:
    for attr in _HEAD_ATTRS:
        n = getattr(module, attr, None)
        if isinstance(n, int) and n > 0:
            return n
    # otherwise the attention map recorded inside this module: (B, H, T, T)
    for key, w in trace.attention_maps().items():
        if key == path or key.startswith(path + "."):
            return int(w.shape[1])
    raise ValueError(
        f"head contributions: cannot tell how many heads {path or '<root>'} has "
        f"(no attribute {' / '.join(_HEAD_ATTRS)}, no attention map)"
    )


def _projection_matrix(proj: nn.Module, path: str) -> tuple[torch.Tensor, torch.Tensor | None]:
    """``(weight (C_out, C_in), bias)`` of a Linear, or of HF's transposed Conv1D."""
    weight = getattr(proj, "weight", None)
    if not isinstance(weight, torch.Tensor) or weight.dim() != 2:
        raise ValueError(f"head contributions: {path} has no 2-D weight")
    bias = getattr(proj, "bias", None)
    if type(proj).__name__ == "Conv1D":  # Hugging Face GPT-2: y = x @ W + b, W (C_in, C_out)
        weight = weight.t()
    return weight.detach(), None if bias is None else bias.detach()


def head_writes(
    model: nn.Module, trace: Trace, attention: str, *, out_proj: str = "W_o", call: int = 0
) -> tuple[torch.Tensor, torch.Tensor | None]:
    """What each head of the attention module at path ``attention`` writes.

    Returns ``(writes (B, H, T, C), bias (C,) or None)``: summing ``writes`` over heads and
    adding the bias gives the projection's output exactly. Uses the kept input of the
    ``out_proj`` call (the concatenated heads, ``(B, T, H*D)``).
    """
    proj_path = f"{attention}.{out_proj}" if attention else out_proj
    proj = _submodule(model, proj_path, "head contributions")
    owner = _submodule(model, attention, "head contributions") if attention else model
    calls = trace.module_steps(proj_path)
    if len(calls) <= call:
        raise ValueError(f"head contributions: {proj_path} did not run (call {call})")
    concat = _need_values(trace, calls[call], "head contributions", which="input")
    H = _num_heads(owner, trace, attention)
    weight, bias = _projection_matrix(proj, proj_path)  # (C, H*D)
    C_out, HD = weight.shape
    if concat.size(-1) != HD or HD % H:
        raise ValueError(
            f"head contributions: {proj_path} input has {concat.size(-1)} features, "
            f"weight expects {HD} for {H} heads"
        )
    D = HD // H
    x = concat.to(weight.device, weight.dtype)
    x = x.reshape(*x.shape[:-1], H, D)  # (B, T, H, D)
    w = weight.reshape(C_out, H, D)  # (C, H, D)
    writes = torch.einsum("bthd,chd->bhtc", x, w)  # (B, H, T, C)
    return writes, bias


def head_contributions(
    model: nn.Module,
    trace: Trace,
    *,
    out_proj: str = "W_o",
    attention_modules: list[str] | None = None,
    per_position: bool = False,
    batch: int | None = None,
) -> np.ndarray:
    """The norm of each head's write into the residual stream: ``(layers, heads)``.

    Averaged over batch and positions (``batch`` picks one row instead); with
    ``per_position`` the positions are kept: ``(layers, heads, T)``. Layers are the modules
    owning ``out_proj`` (default: every ``...self_attn`` with a ``W_o``), in run order.
    """
    paths = attention_modules or find_attention_modules(trace, out_proj)
    if not paths:
        raise ValueError(f"head contributions: no module with an output projection {out_proj!r}")
    rows = []
    for path in paths:
        writes, _ = head_writes(model, trace, path, out_proj=out_proj)  # (B, H, T, C)
        if batch is not None:
            writes = writes[batch : batch + 1]
        norms = writes.norm(dim=-1)  # (B, H, T)
        rows.append(norms.mean(0) if per_position else norms.mean(dim=(0, 2)))
    return torch.stack(rows).float().numpy()
