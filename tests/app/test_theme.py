"""Every colour comes from app/theme.py: no hex literal elsewhere in app/, a complete stylesheet."""

from __future__ import annotations

import re
from pathlib import Path

from app import theme

APP = Path(__file__).resolve().parents[2] / "app"
HEX = re.compile(r"#[0-9a-fA-F]{6}\b|#[0-9a-fA-F]{3}\b")


def test_no_colour_literals_outside_the_theme() -> None:
    found = {
        str(path.relative_to(APP)): HEX.findall(path.read_text(encoding="utf-8"))
        for path in APP.rglob("*.py")
        if path.name != "theme.py"
    }
    assert not {name: hexes for name, hexes in found.items() if hexes}
    assert not HEX.findall((APP / "style.qss").read_text(encoding="utf-8"))


def test_stylesheet_fills_every_placeholder_with_a_theme_colour() -> None:
    qss = theme.stylesheet()
    assert "$" not in qss
    assert f"QMainWindow, QDialog {{ background: {theme.WINDOW}; }}" in qss


def test_accent_stripes_by_name() -> None:
    assert theme.accent_for("MultiHeadAttention") == theme.accent_for("attn")
    assert theme.accent_for("LayerNorm") != theme.OP_ACCENT
    assert theme.accent_for("some_unknown_op") == theme.OP_ACCENT
