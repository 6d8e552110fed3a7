"""Screenshot of an axis's proof in the hover: Llama-3-70B's sizes (2 layers on ``meta``,
the real model's config: H = 64 = D/2), its rotary halves, each axis with why it has its
name and each letter with the passes that moved it.

    QT_QPA_PLATFORM=offscreen .venv/bin/python scripts/docs_shots/dims_proof.py [OUT_DIR]

Writes ``dims_proof_hover.png`` (the hover text of the dims cell) and ``dims_proof.png``
(the window) to ``docs/``.
"""

from __future__ import annotations

import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
sys.path[:0] = [str(ROOT), str(ROOT / "tests")]


def main() -> int:
    import torch
    from dims_hover import shoot
    from transformers import LlamaConfig, LlamaForCausalLM

    import tracing

    config = LlamaConfig(  # meta-llama/Meta-Llama-3-70B's config.json, 2 of its 80 layers
        hidden_size=8192, intermediate_size=28672, num_attention_heads=64,
        num_key_value_heads=8, vocab_size=128256, max_position_embeddings=8192,
        num_hidden_layers=2, rope_theta=500000.0, attn_implementation="eager",
    )  # fmt: skip
    with torch.device("meta"):
        model = LlamaForCausalLM(config).eval()
        ids = torch.randint(0, 128256, (1, 12))
    trace = tracing.trace(model, ids, capture="shapes")
    step = next(
        s.index
        for s in trace.steps
        if s.op == "getitem" and s.module == "model.layers.0.self_attn" and s.outputs
    )
    return shoot(trace, step, "dims_proof")


if __name__ == "__main__":
    sys.exit(main())
