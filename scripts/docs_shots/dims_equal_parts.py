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
    from dims_hover import save_step_shots
    from PySide6.QtWidgets import QApplication
    from test_outside_models import trace_einsum

    app = QApplication.instance() or QApplication(sys.argv[:1])
    from app.theme import apply_theme

    apply_theme(app)
    out = Path(sys.argv[1]) if len(sys.argv) > 1 else ROOT / "docs"
    trace = trace_einsum()  # heads 6 of width 20: C / H would say 16
    views = [s.index for s in trace.steps if s.op == "view" and s.module == "attn"]
    save_step_shots(app, trace, views[2], out, "dims_equal_parts")  # the values'
    return 0


if __name__ == "__main__":
    sys.exit(main())
