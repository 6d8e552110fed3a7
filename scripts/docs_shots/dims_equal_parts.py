"""Screenshot of a width proven by an op that cuts equal parts: a lucidrains-style einsum
attention (``tests/tracing/dims/test_outside_models.py``, no config, no rebuild) whose fused
``to_qkv(x).chunk(3, dim=-1)`` gives the values the queries' proven width ``H·D``, and the
values' view into heads ``(B, T, H, D)``.

    QT_QPA_PLATFORM=offscreen .venv/bin/python scripts/docs_shots/dims_equal_parts.py [OUT_DIR]

Writes ``dims_equal_parts.png`` (the window on the values' view) and
``dims_equal_parts_hover.png`` (the hover text of its dims cell) to ``docs/``.
"""

from __future__ import annotations

import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
sys.path[:0] = [str(ROOT), str(ROOT / "tests" / "tracing" / "dims"), str(Path(__file__).parent)]


def main() -> int:
    from dims_hover import shoot
    from test_outside_models import trace_einsum

    trace = trace_einsum()  # heads 6 of width 20: C / H would say 16
    views = [s.index for s in trace.steps if s.op == "view" and s.module == "attn"]
    return shoot(trace, views[2], "dims_equal_parts")  # the values'


if __name__ == "__main__":
    sys.exit(main())
