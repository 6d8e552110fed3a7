"""Screenshot of names proven across the axes an op joins: nanoGPT's ``c_attn`` (written in
the test helpers, no config: its sizes are module attributes), whose 3·n_embd output is
``3C`` because the ``split`` after it cuts it into three ``C`` (proof ``sum split``).

    QT_QPA_PLATFORM=offscreen .venv/bin/python scripts/docs_shots/dims_joined.py [OUT_DIR]

Writes ``dims_joined.png`` (the window) and ``dims_joined_hover.png`` (the hover text of
the dims cell) to ``docs/``.
"""

from __future__ import annotations

import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
sys.path[:0] = [str(ROOT), str(ROOT / "tests"), str(Path(__file__).parent)]


def main() -> int:
    import torch
    from dims_hover import shoot
    from helpers.models.nanogpt import GPT

    import tracing

    torch.manual_seed(0)
    model = GPT().eval()
    trace = tracing.trace(model, torch.randint(0, 96, (2, 10)), capture="shapes")
    step = next(s.index for s in trace.steps if s.op == "linear" and s.module.endswith("c_attn"))
    return shoot(trace, step, "dims_joined")


if __name__ == "__main__":
    sys.exit(main())
