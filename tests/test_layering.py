"""The import direction is part of the design: app -> tracing, app -> scratchformer.

``tracing`` never imports Qt or ``scratchformer`` (it traces any nn.Module), and
``scratchformer`` imports neither ``tracing`` nor ``app`` nor Qt. Inside ``app/`` the plain
logic runs without Qt, so it can be used and tested headless: every module of the Qt-free
folders (:data:`QT_FREE_FOLDERS`: ``app/core/``, the sessions; ``app/diagram/plan/``, the
diagram's geometry, folding, layout and routing) imports no Qt anywhere, not even inside a
function, and imports only app modules that load no Qt (:data:`QT_FREE_APP`: those folders
and the theme's colours). Checked two ways: by reading every import statement, and by
importing the modules in a fresh interpreter.

Inside ``tracing/`` the stages have an order too (:data:`TRACING_STAGES`): the record at the
base, then ``dims/`` (axis names: the record only), ``file/``, ``capture/``, ``runs/``;
``analysis/`` reads the record and the file
only, never the tracer. Every import is checked, those inside functions too; the few lazy
ones that go the other way are listed in :data:`LAZY_EXCEPTIONS` with their reason.
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
#: app folders with no Qt in them at all: no module imports Qt, not even inside a function
QT_FREE_FOLDERS = ["app/core", "app/diagram/plan"]


def _modules_in(folder: str) -> list[str]:
    files = sorted((ROOT / folder).glob("*.py"))
    return [
        ".".join(f.relative_to(ROOT).with_suffix("").parts).removesuffix(".__init__") for f in files
    ]


#: app modules whose import loads no Qt, not even through the app modules they import: every
#: module of the Qt-free folders, and the theme (its colours; Qt only inside ``apply_theme``)
QT_FREE_APP = [m for folder in QT_FREE_FOLDERS for m in _modules_in(folder)] + ["app.theme"]


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


def _path_of(module: str) -> Path:
    path = ROOT / module.replace(".", "/")
    return path / "__init__.py" if path.is_dir() else path.with_suffix(".py")


@pytest.mark.parametrize("module", QT_FREE_APP)
def test_plain_app_modules_import_no_qt(module: str) -> None:
    """At module level, in the module and in every package ``__init__`` above it."""
    parts = module.split(".")
    for package in [".".join(parts[:i]) for i in range(1, len(parts))] + [module]:
        assert not module_level_imports(_path_of(package)) & QT, f"{package} imports Qt"


def app_imports(path: Path) -> set[str]:
    """Every app module ``path`` imports, those inside functions too (``from app import
    theme`` and ``from app.core import session`` name the modules ``theme`` and ``session``)."""
    tree = ast.parse(path.read_text(encoding="utf-8"), filename=str(path))
    found: set[str] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            found.update(a.name for a in node.names if a.name.split(".")[0] == "app")
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            if node.module.split(".")[0] != "app":
                continue
            for a in node.names:
                name = f"{node.module}.{a.name}"
                found.add(name if _is_module(name) else node.module)
    return found


def test_qt_free_folders_have_a_module_and_say_what_they_own() -> None:
    for folder in QT_FREE_FOLDERS:
        doc = ast.get_docstring(ast.parse(_path_of(folder.replace("/", ".")).read_text()))
        assert doc and len(doc.splitlines()[0]) > 20, f"{folder}/__init__.py: say what it owns"
        assert len(_modules_in(folder)) > 1, folder


@pytest.mark.parametrize("module", [m for folder in QT_FREE_FOLDERS for m in _modules_in(folder)])
def test_qt_free_folders_import_no_qt_even_through_what_they_import(module: str) -> None:
    path = _path_of(module)
    assert not imported_top_level_names(path) & QT, f"{module} imports Qt"
    loads_qt = sorted(app_imports(path) - set(QT_FREE_APP))
    assert not loads_qt, f"{module} imports app modules that may load Qt: {loads_qt}"


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


# --------------------------------------------------------------------------- tracing stages

#: stage -> the stages its modules may import (itself included)
TRACING_STAGES: dict[str, set[str]] = {
    "record": {"record"},
    "dims": {"record", "dims"},
    "file": {"record", "file"},
    "capture": {"record", "file", "dims", "capture"},
    "runs": {"record", "file", "dims", "capture", "runs"},
    "analysis": {"record", "file", "analysis"},
    "show": {"record", "file", "dims", "capture", "runs", "analysis", "show"},
}
#: (importing module, imported module) pairs allowed inside a function, and why
LAZY_EXCEPTIONS = {
    ("tracing.record", "tracing.file.saving"): "Trace.save(path), a convenience",
    ("tracing.record", "tracing.analysis.graph"): "Trace.graph, built on first use",
    ("tracing.record", "tracing.analysis.attention_maps"): "Trace.attention_maps()",
}


def stage_of(module: str) -> str:
    parts = module.split(".")
    if parts[:2] == ["tracing", "show_app"]:
        return "show"
    if len(parts) > 1 and parts[1] in {"file", "dims", "capture", "runs", "analysis"}:
        return parts[1]
    return "record"  # tracing/*.py: record, errors, sites, stats, breakpoints, formatting...


def _is_module(name: str) -> bool:
    path = ROOT / name.replace(".", "/")
    return path.with_suffix(".py").exists() or (path / "__init__.py").exists()


def tracing_imports(path: Path) -> list[tuple[str, bool]]:
    """``(imported tracing module, at module level)`` for every import in ``path``."""
    tree = ast.parse(path.read_text(encoding="utf-8"), filename=str(path))
    top = set(map(id, tree.body))
    out = []
    for node in ast.walk(tree):
        names: list[str] = []
        if isinstance(node, ast.Import):
            names = [a.name for a in node.names]
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            base = node.module
            # `from tracing.file import saving` imports the module tracing.file.saving
            names = [
                f"{base}.{a.name}" if _is_module(f"{base}.{a.name}") else base for a in node.names
            ]
        out += [(n, id(node) in top) for n in names if n.split(".")[0] == "tracing"]
    return out


def tracing_modules() -> list[tuple[str, Path]]:
    found = []
    for f in sorted((ROOT / "tracing").rglob("*.py")):
        rel = f.relative_to(ROOT).with_suffix("")
        name = ".".join(rel.parts).removesuffix(".__init__")
        found.append((name, f))
    return found


def test_every_tracing_module_has_a_stage_folder_or_is_the_record() -> None:
    folders = {p.name for p in (ROOT / "tracing").iterdir() if p.is_dir() and p.name[0] != "_"}
    assert folders <= {"file", "dims", "capture", "runs", "analysis", "__pycache__"}, folders
    for folder in folders - {"__pycache__"}:
        init = ROOT / "tracing" / folder / "__init__.py"
        doc = ast.get_docstring(ast.parse(init.read_text(encoding="utf-8")))
        assert doc and len(doc.splitlines()[0]) > 20, (
            f"tracing/{folder}/__init__.py: say what it owns"
        )


@pytest.mark.parametrize("module,path", tracing_modules(), ids=lambda v: str(v))
def test_tracing_stage_order(module: str, path: Path) -> None:
    if module == "tracing":
        return  # the facade names every stage, lazily, by string
    stage = stage_of(module)
    bad = []
    for imported, at_top in tracing_imports(path):
        if imported == "tracing":
            bad.append(f"{imported} (the facade: import the module that defines the name)")
            continue
        if stage_of(imported) in TRACING_STAGES[stage]:
            continue
        if not at_top and (module, imported) in LAZY_EXCEPTIONS:
            continue
        bad.append(imported)
    assert not bad, f"{module} ({stage}) may not import {bad}"
