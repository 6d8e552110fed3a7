"""The import direction is part of the design: app -> tracing, app -> scratchformer.

``tracing`` never imports Qt or ``scratchformer`` (it traces any nn.Module), and
``scratchformer`` imports neither ``tracing`` nor ``app`` nor Qt. Inside ``app/`` the plain
logic (:data:`QT_FREE_APP`: the diagram's layout, folding, routing and geometry, the
sessions, the theme's colours) runs without Qt, so it can be used and tested headless.
Checked two ways: by reading every import statement, and by importing the modules in a
fresh interpreter.
"""

from __future__ import annotations

import ast
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
QT = {"PySide6", "pyqtgraph", "shiboken6", "PyQt5", "PyQt6"}
FORBIDDEN = {
    "tracing": QT | {"scratchformer", "app"},
    "scratchformer": QT | {"tracing", "app"},
}
#: app modules that import no Qt, not even through the app modules they import
QT_FREE_APP = [
    "app.diagram.geometry",
    "app.diagram.folding",
    "app.diagram.layout",
    "app.diagram.routing",
    "app.session",
    "app.generation_session",
    "app.edit_session",
    "app.progress",
    "app.theme",
]


def imported_top_level_names(path: Path) -> set[str]:
    tree = ast.parse(path.read_text(encoding="utf-8"), filename=str(path))
    names: set[str] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            names.update(alias.name.split(".")[0] for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            names.add(node.module.split(".")[0])
    return names


@pytest.mark.parametrize("package", sorted(FORBIDDEN))
def test_package_imports_only_allowed_layers(package: str) -> None:
    files = sorted((ROOT / package).rglob("*.py"))
    assert files, f"no sources found for {package}"
    bad = {
        str(f.relative_to(ROOT)): sorted(imported_top_level_names(f) & FORBIDDEN[package])
        for f in files
    }
    bad = {f: names for f, names in bad.items() if names}
    assert not bad, f"{package} imports forbidden layers: {bad}"


def module_level_imports(path: Path) -> set[str]:
    """Top-level names imported when the module loads (not inside functions, nor under
    ``if TYPE_CHECKING``)."""
    tree = ast.parse(path.read_text(encoding="utf-8"), filename=str(path))
    names: set[str] = set()
    for node in tree.body:
        if isinstance(node, ast.Import):
            names.update(alias.name.split(".")[0] for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            names.add(node.module.split(".")[0])
    return names


@pytest.mark.parametrize("module", QT_FREE_APP)
def test_plain_app_modules_import_no_qt(module: str) -> None:
    path = ROOT / (module.replace(".", "/") + ".py")
    assert not module_level_imports(path) & QT, f"{module} imports Qt"


@pytest.mark.slow
def test_importing_tracing_and_model_loads_no_qt() -> None:
    code = (
        f"import sys, tracing, tracing.record, scratchformer, {', '.join(QT_FREE_APP)}\n"
        "loaded = sorted(m for m in sys.modules if m.split('.')[0] in "
        f"{sorted(QT)!r})\n"
        "print(','.join(loaded))\n"
    )
    out = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, check=True, cwd=ROOT
    )
    assert out.stdout.strip() == ""
