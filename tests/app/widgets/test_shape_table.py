"""ShapeTableModel: a thin Qt adapter over one Step, checked against the trace and the tensors."""

from __future__ import annotations

import pytest
import torch
from PySide6.QtCore import Qt
from PySide6.QtGui import QColor

import scratchformer
from app import theme
from app.widgets.shape_table import ShapeTableModel
from tracing.record import Step, TensorRecord, TensorStats, Trace


def _text(model: ShapeTableModel, row: int, column: int) -> str:
    return model.data(model.index(row, column), Qt.ItemDataRole.DisplayRole)


def _softmax_step(trace: Trace) -> Step:
    return next(s for s in trace.steps if s.op == "softmax")


def test_model_passes_qtmodeltester(qtmodeltester, demo_values):
    model = ShapeTableModel()
    model.set_trace(demo_values)
    for index in (0, 12, _softmax_step(demo_values).index, len(demo_values) - 1):
        model.set_step(index)
        qtmodeltester.check(model)


def test_rows_show_the_steps_tensors_with_their_records(demo_values):
    step = _softmax_step(demo_values)
    model = ShapeTableModel()
    model.set_trace(demo_values)
    model.set_step(step)

    ids = list(step.inputs) + list(step.outputs)
    assert model.rowCount() == len(ids)
    assert model.columnCount() == 9
    for row, tensor_id in enumerate(ids):
        record = demo_values.tensor(tensor_id)
        direction = "in" if row < len(step.inputs) else "out"
        assert model.data(model.index(row, 0), ShapeTableModel.TensorIdRole) == tensor_id
        assert _text(model, row, ShapeTableModel.NAME).startswith(direction + " · ")
        assert _text(model, row, ShapeTableModel.SHAPE) == str(record.shape)
        assert _text(model, row, ShapeTableModel.DTYPE) == record.dtype
        assert _text(model, row, ShapeTableModel.DIMS) == "(" + ", ".join(record.dims) + ")"

        # stats against the tensor itself (an independent computation, finite elements)
        value = demo_values.value(tensor_id).double()
        finite = value[torch.isfinite(value)]
        for column, expected in (
            (ShapeTableModel.MIN, finite.min()),
            (ShapeTableModel.MAX, finite.max()),
            (ShapeTableModel.MEAN, finite.mean()),
            (ShapeTableModel.STD, finite.std()),
        ):
            assert float(_text(model, row, column)) == pytest.approx(
                float(expected), rel=2e-3, abs=1e-6
            )
        n_inf = int(torch.isinf(value).sum())
        expected_text = f"{n_inf} Inf" if n_inf else "0"
        assert _text(model, row, ShapeTableModel.NONFINITE) == expected_text

    # the softmax input holds the causal mask's -inf: counted, and painted red
    T = len(scratchformer.DEMO_PROMPT)
    assert _text(model, 0, ShapeTableModel.NONFINITE) == f"{4 * T * (T - 1) // 2} Inf"
    brush = model.data(model.index(0, ShapeTableModel.NONFINITE), Qt.ItemDataRole.BackgroundRole)
    assert brush.color() == QColor(theme.NONFINITE)

    # softmax output: (B, H, T, T), probabilities in [0, 1]
    out_row = model.default_row()
    assert out_row == len(step.inputs)
    assert _text(model, out_row, ShapeTableModel.SHAPE) == f"(1, 4, {T}, {T})"
    assert _text(model, out_row, ShapeTableModel.DIMS) == "(B, H, T, T)"
    assert float(_text(model, out_row, ShapeTableModel.MIN)) >= 0
    assert float(_text(model, out_row, ShapeTableModel.MAX)) <= 1


def test_shapes_capture_shows_dashes_for_stats(demo_shapes):
    trace = demo_shapes
    model = ShapeTableModel()
    model.set_trace(trace)
    model.set_step(_softmax_step(trace))
    for column in (*ShapeTableModel.STAT_COLUMNS, ShapeTableModel.NONFINITE):
        assert _text(model, 0, column) == "—"
    assert _text(model, 0, ShapeTableModel.SHAPE) == str(trace.tensor(model.record(0).id).shape)


def _nonfinite_trace() -> Trace:
    """Hand-built: one op whose output holds 2 NaN and 1 Inf."""
    tensors = [
        TensorRecord(0, (2, 3), "float32", stats=TensorStats(-1.0, 1.0, 0.0, 0.5, 0, 0)),
        TensorRecord(1, (2, 3), "float32", stats=TensorStats(-1.0, 1.0, 0.0, 0.5, 2, 1)),
    ]
    step = Step(0, "op", "layer", "log", inputs=(0,), outputs=(1,), input_names=("x",),
                output_names=("output",))  # fmt: skip
    return Trace(steps=[step], tensors=tensors, meta={"capture": "stats"})


def test_nonfinite_cells_are_highlighted(qtmodeltester):
    model = ShapeTableModel()
    model.set_trace(_nonfinite_trace())
    model.set_step(0)
    qtmodeltester.check(model)
    col = ShapeTableModel.NONFINITE
    assert _text(model, 1, col) == "2 NaN · 1 Inf"
    brush = model.data(model.index(1, col), Qt.ItemDataRole.BackgroundRole)
    assert brush is not None and brush.color() == QColor(theme.NONFINITE)
    # a finite tensor, and the other cells of the bad one, stay unpainted
    assert model.data(model.index(0, col), Qt.ItemDataRole.BackgroundRole) is None
    assert model.data(model.index(1, ShapeTableModel.MIN), Qt.ItemDataRole.BackgroundRole) is None
    assert "2 NaN and 1 Inf" in model.data(model.index(1, col), Qt.ItemDataRole.ToolTipRole)


def test_set_step_by_index_needs_a_trace():
    with pytest.raises(ValueError, match="set_trace"):
        ShapeTableModel().set_step(0)
