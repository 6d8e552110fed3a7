"""Screenshot of a name proven by what an attention does: a vision transformer (timm-style,
written in ``tests/tracing/dims/test_outside_models.py``, no config) whose token axis,
patches plus a class token, is ``Tk``: the keys its softmax attends over.

    QT_QPA_PLATFORM=offscreen .venv/bin/python scripts/docs_shots/dims_attended.py [OUT_DIR]

Writes ``dims_attended.png`` (the window on the attention's softmax) and
``dims_attended_hover.png`` (the hover text of its dims cell) to ``docs/``.
"""

from __future__ import annotations

import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
sys.path[:0] = [str(ROOT), str(ROOT / "tests" / "tracing" / "dims"), str(Path(__file__).parent)]


def main() -> int:
    from dims_hover import shoot
    from test_outside_models import trace_vit

    trace = trace_vit(2, 28, 4, 60)  # 49 patches of 4×4, a class token: 50 tokens
    step = next(s.index for s in trace.steps if s.op == "softmax")
    return shoot(trace, step, "dims_attended")


if __name__ == "__main__":
    sys.exit(main())
