"""Dims shown whole, explained on hover, and listed in the Dims legend (issue 22, item 3).

A tiny Llama with grouped-query attention (6 heads, 2 key/value heads, random weights) is
traced once; its ``repeat_kv`` expand is a 5-D ``(B, KV, H/KV, T, D)`` that the inspector
once cut to ``(B, ?…T, D)``.
"""

from __future__ import annotations

import pytest
from PySide6.QtCore import QSettings

import tracing
from app.diagram.view import DiagramView
from app.panels.dims import DimsLegend
from app.panels.inspector import Inspector
from app.panels.module_tree import ModuleTree
from app.widgets.shape_table import ShapeTableModel
from app.windows.main_window import MainWindow
from tracing.dim_legend import NO_LETTERS, letter_legend, letters_used

pytest.importorskip("transformers")

FIVE_D = "(B, KV, H/KV, T, D)"


@pytest.fixture(scope="module")
def llama():
    from helpers.dims_models import build

    model, ids = build("llama")
    return tracing.trace(model, ids)


def _expand_step(trace) -> int:
    return next(
        s.index
        for s in trace.steps
        if s.op == "expand" and trace.tensors[s.outputs[0]].dims == ("B", "KV", "H/KV", "T", "D")
    )


def _out_row(model: ShapeTableModel) -> int:
    return next(r for r in range(model.rowCount()) if model.direction(r) == "out")


def test_a_5d_tensor_reads_whole_in_the_inspector(qtbot, llama):
    inspector = Inspector()
    qtbot.addWidget(inspector)
    inspector.resize(420, 600)
    inspector.show()
    inspector.set_trace(llama)
    inspector.set_step(_expand_step(llama))
    model = inspector.table_model
    row = _out_row(model)
    for col in (ShapeTableModel.DIMS, ShapeTableModel.SHAPE):
        text = model.data(model.index(row, col))
        assert "…" not in text
        # the column is wide enough for the whole text: Qt's eliding never starts
        need = inspector.table.fontMetrics().horizontalAdvance(text)
        assert inspector.table.columnWidth(col) >= need, (col, text)
    assert model.data(model.index(row, ShapeTableModel.DIMS)) == FIVE_D


def test_the_dims_cell_names_each_letters_size_and_origin(llama):
    model = ShapeTableModel()
    model.set_trace(llama)
    model.set_step(_expand_step(llama))
    tip = model.data(model.index(_out_row(model), ShapeTableModel.DIMS), 3)  # ToolTipRole
    assert f"{FIVE_D} = (3, 2, 3, 11, 16)" in tip
    assert "KV = 2 · key/value heads" in tip and "from config.num_key_value_heads" in tip
    assert "H = 6" in tip and "from config.num_attention_heads" in tip
    assert "D = 16" in tip and "from config.head_dim" in tip


def test_a_5d_box_in_the_diagram_is_whole_and_explains_its_letters(qtbot, llama):
    view = DiagramView()
    qtbot.addWidget(view)
    view.set_trace(llama)
    step = _expand_step(llama)
    view.reveal(step)
    node = view.layout_.nodes[step]
    assert node.shape == FIVE_D
    assert node.rect.width >= view.fonts.measure.detail_width(node.shape)  # the box grew
    assert "config.num_key_value_heads" in node.tooltip and "KV = 2" in node.tooltip


def test_the_module_tree_output_cell_explains_its_letters(qtbot, llama):
    tree = ModuleTree()
    qtbot.addWidget(tree)
    tree.set_trace(llama)
    index = tree.model.index_for_path("model.layers.0.self_attn")
    cell = tree.model.itemFromIndex(index.siblingAtColumn(2))
    assert cell.text() == "(B, T, C)"
    assert "C = 96" in cell.toolTip() and "from config.hidden_size" in cell.toolTip()


def test_the_legend_lists_exactly_the_traces_letters(qtbot, llama):
    legend = DimsLegend()
    qtbot.addWidget(legend)
    legend.set_trace(llama)
    listed = legend.letters()
    assert (
        set(listed)
        == set(llama.meta["dim_letters"])
        == letters_used(llama, letter_legend(llama.meta))
    )
    assert len(listed) == len(set(listed))
    assert {"B", "T", "C", "H", "KV", "D", "F", "V"} <= set(listed)
    row = listed.index("KV")
    assert legend.table.item(row, 1).text() == "2"
    assert legend.table.item(row, 2).text() == "config.num_key_value_heads"
    assert "second pass" in legend.note.text()
    legend.set_step(_expand_step(llama))  # the step's letters in bold, the others not
    bold = {x for r, x in enumerate(listed) if legend.table.item(r, 0).font().bold()}
    assert bold == {"B", "KV", "H", "T", "D"}


def test_an_old_trace_without_letters_opens_and_says_sizes_only(qtbot, tmp_path, llama, errors):
    path = tmp_path / "old.safetensors"
    tracing.save(llama, path)
    old = tracing.load(path)
    old.meta.pop("dim_letters")
    old.meta.pop("dims_evidence", None)
    tracing.save(old, path)
    settings = QSettings(str(tmp_path / "settings.ini"), QSettings.Format.IniFormat)
    window = MainWindow(settings=settings)
    qtbot.addWidget(window)
    assert window.open_path(path)
    assert errors == []
    window.go_to(_expand_step(window.trace))
    legend = window.dims_dock.legend
    assert legend.letters() == [] and legend.note.text().startswith("Sizes only")
    model = window.inspector.table_model
    row = _out_row(model)
    assert model.data(model.index(row, ShapeTableModel.DIMS)) == FIVE_D  # names still whole
    tip = model.data(model.index(row, ShapeTableModel.DIMS), 3)
    assert "(3, 2, 3, 11, 16)" in tip and NO_LETTERS in tip and "config." not in tip
