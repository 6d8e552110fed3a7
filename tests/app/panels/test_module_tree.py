"""The module tree: a valid Qt item model over Trace.modules, a filter, selection sync."""

from __future__ import annotations

import pytest
from helpers.app_fixtures import tiny_trace
from PySide6.QtCore import QModelIndex

from app.panels.module_tree import (
    PATH_ROLE,
    ModuleFilterProxy,
    ModuleTree,
    ModuleTreeModel,
    format_count,
)


@pytest.fixture
def trace():
    return tiny_trace()


def test_model_passes_qtmodeltester(qtmodeltester, trace):
    model = ModuleTreeModel()
    model.set_trace(trace)
    qtmodeltester.check(model, force_py=True)


def test_filtered_model_passes_qtmodeltester(qtmodeltester, trace):
    model = ModuleTreeModel()
    model.set_trace(trace)
    proxy = ModuleFilterProxy()
    proxy.setSourceModel(model)
    proxy.set_text("ff")
    qtmodeltester.check(proxy, force_py=True)
    assert proxy.rowCount() == 1  # the root, kept as an ancestor of the matches


def test_rows_mirror_the_module_hierarchy(trace):
    model = ModuleTreeModel()
    model.set_trace(trace)

    def walk(parent: QModelIndex, out: list[str]) -> list[str]:
        for row in range(model.rowCount(parent)):
            index = model.index(row, 0, parent)
            out.append(model.data(index, PATH_ROLE))
            walk(index, out)
        return out

    paths = walk(QModelIndex(), [])
    assert sorted(paths) == sorted(trace.modules)  # every module once
    for path in paths:  # children come in definition order under their parent
        index = model.index_for_path(path)
        parent_path = model.path_for_index(model.parent(index))
        assert parent_path == trace.modules[path].parent
    sdpa = model.index_for_path("blocks.1.attn.sdpa")
    assert model.data(sdpa.siblingAtColumn(1)) == "ScaledDotProductAttention"
    assert model.data(sdpa.siblingAtColumn(2)) == "(B, H, T, D)"
    assert model.data(model.index_for_path("").siblingAtColumn(0)) == "model"


def test_filter_keeps_matches_and_their_ancestors(qtbot, trace):
    tree = ModuleTree()
    qtbot.addWidget(tree)
    tree.set_trace(trace)
    assert len(tree.visible_paths()) == len(trace.modules)
    tree.filter_edit.setText("layernorm")  # by type, case-insensitive
    kept = tree.visible_paths()
    norms = {p for p, m in trace.modules.items() if m.type == "LayerNorm"}
    assert norms <= set(kept)
    for path in kept:  # everything else is an ancestor of a match
        assert path in norms or any(n.startswith(path + ".") or path == "" for n in norms)
    assert "blocks.0.attn.W_q" not in kept
    tree.filter_edit.setText("")
    assert len(tree.visible_paths()) == len(trace.modules)


def test_select_module_follows_without_echo_and_clicks_emit(qtbot, trace):
    tree = ModuleTree()
    qtbot.addWidget(tree)
    tree.set_trace(trace)
    emitted: list[str] = []
    tree.moduleActivated.connect(emitted.append)
    tree.select_module("blocks.1.ff.fc2")
    assert tree.selected_path() == "blocks.1.ff.fc2"
    assert tree.view.isExpanded(tree.proxy.mapFromSource(tree.model.index_for_path("blocks.1.ff")))
    assert emitted == []  # following the step does not ask for a jump
    index = tree.proxy.mapFromSource(tree.model.index_for_path("ln_f"))
    tree.view.setCurrentIndex(index)  # what a click does
    assert emitted == ["ln_f"]


def test_format_count():
    assert format_count(124_439_808) == "124.4M"
    assert format_count(24_576) == "24.6K"
    assert format_count(512) == "512"
    assert format_count(0) == ""


def test_a_large_model_builds_its_rows_on_demand(qtbot, trace, monkeypatch, qtmodeltester):
    """Above LAZY_ABOVE modules, deeper rows are built when expanded, selected or filtered,
    and the tree then holds exactly what the eager one does."""
    import app.panels.module_tree as module_tree

    monkeypatch.setattr(module_tree, "LAZY_ABOVE", 0)
    tree = ModuleTree()
    qtbot.addWidget(tree)
    tree.set_trace(trace)
    built = set(tree.model._items)
    assert "blocks" in built and "blocks.0" not in built  # only the first levels
    qtmodeltester.check(tree.model, force_py=True)
    tree.select_module("blocks.1.ff.fc2")  # a step inside builds the rows down to it
    assert tree.selected_path() == "blocks.1.ff.fc2"
    assert "blocks.0" in tree.model._items and "blocks.0.attn" not in tree.model._items
    block0 = tree.proxy.mapFromSource(tree.model.index_for_path("blocks.0"))
    tree.view.expand(block0)  # expanding builds one more level
    assert "blocks.0.attn" in tree.model._items
    tree.filter_edit.setText("layernorm")  # a filter sees every row
    norms = {p for p, m in trace.modules.items() if m.type == "LayerNorm"}
    assert norms <= set(tree.visible_paths())
    tree.filter_edit.setText("")
    assert sorted(tree.visible_paths()) == sorted(trace.modules)
