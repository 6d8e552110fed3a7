"""The main window, offscreen: stepping keeps every pane on one step; files and errors."""

from __future__ import annotations

import csv
import io
import json
import sys

import networkx as nx
import pytest
from helpers.app_fixtures import tiny_trace
from PySide6.QtCore import QMimeData, QPointF, QSettings, Qt, QUrl
from PySide6.QtGui import QDropEvent

from app.core import session
from app.windows.main_window import MainWindow, install_excepthook


@pytest.fixture
def window(qtbot, tmp_path, errors):
    settings = QSettings(str(tmp_path / "settings.ini"), QSettings.Format.IniFormat)
    w = MainWindow(settings=settings)
    qtbot.addWidget(w)
    w.show()
    qtbot.waitExposed(w)
    return w


def _index(trace, module, kind="module", op=None):
    return next(
        s.index
        for s in trace.steps
        if s.module == module and s.kind == kind and (op is None or s.op == op)
    )


def _assert_panes_on(window, index):
    trace = window.trace
    step = trace.steps[index]
    assert window.current == index
    assert window.status_text() == f"step {index + 1} / {len(trace.steps)} · {step.label}"
    assert window.step_bar.slider.value() == index
    assert window.tree.selected_path() == step.module
    assert window.diagram.highlighted_key == window.diagram.key_for_step(index)
    assert window.diagram.items_by_key[window.diagram.highlighted_key].highlighted
    # the root step has no user line when the app ran the model (never the app's own);
    # the failing step shows the line that raised
    failure = trace.failure
    source = failure.location if failure and failure.step == index else step.source
    assert window.source_view.current_line == (source.line if source else None)
    assert window.inspector.step_index == index
    # the inspector's header counts the same way as the status line (1-based)
    assert window.inspector._title.text().startswith(f"Step {index + 1} / {len(trace.steps)} · ")


def test_step_forward_and_back_with_keys_moves_every_pane(qtbot, window):
    trace = tiny_trace()
    window.set_trace(trace)
    _assert_panes_on(window, 0)
    for _ in range(3):
        qtbot.keyClick(window, Qt.Key.Key_Right)
    _assert_panes_on(window, 3)
    qtbot.keyClick(window, Qt.Key.Key_Left)
    _assert_panes_on(window, 2)
    qtbot.keyClick(window, Qt.Key.Key_End)
    _assert_panes_on(window, len(trace.steps) - 1)
    qtbot.keyClick(window, Qt.Key.Key_Home)
    _assert_panes_on(window, 0)
    window.step_bar.slider.setValue(40)
    _assert_panes_on(window, 40)


def test_step_over_out_and_next_nonfinite_keys(qtbot, window):
    trace = tiny_trace(inf_at="blocks.1.ff.act")
    window.set_trace(trace)
    block0 = _index(trace, "blocks.0")
    window.go_to(block0)
    qtbot.keyClick(window, Qt.Key.Key_F10)  # step over the whole block
    assert window.current == trace.steps[block0].end + 1
    softmax = _index(trace, "blocks.1.attn.sdpa", kind="op", op="softmax")
    window.go_to(softmax)
    qtbot.keyClick(window, Qt.Key.Key_F11, Qt.KeyboardModifier.ShiftModifier)  # step out
    sdpa = trace.steps[trace.steps[softmax].parent]
    assert window.current == sdpa.end + 1
    window.go_to(0)
    qtbot.keyClick(window, Qt.Key.Key_N)  # run to the Inf
    assert session.step_has_nonfinite(trace, window.current)
    assert trace.steps[window.current].module.startswith("blocks.1.ff.act")
    _assert_panes_on(window, window.current)
    before = window.current
    window.go_to(len(trace.steps) - 2)
    window.run_to_nonfinite()  # none left: stays
    assert window.current == len(trace.steps) - 2 != before


def test_play_advances_and_stops_at_the_end(qtbot, window):
    window.set_trace(tiny_trace())
    window.step_bar.speed.setValue(120)
    window.go_to(len(window.trace.steps) - 4)
    window.step_bar.play()
    qtbot.waitUntil(lambda: not window.step_bar.playing, timeout=3000)
    assert window.current == len(window.trace.steps) - 1


def test_clicking_tree_and_diagram_jumps_to_the_step(qtbot, window):
    trace = tiny_trace()
    window.set_trace(trace)
    window.tree.filter_edit.setText("fc2")
    assert set(window.tree.visible_paths()) >= {"blocks.0.ff.fc2", "blocks.1.ff.fc2"}
    proxy = window.tree.proxy
    index = proxy.mapFromSource(window.tree.model.index_for_path("blocks.1.ff.fc2"))
    window.tree.view.setCurrentIndex(index)
    _assert_panes_on(window, _index(trace, "blocks.1.ff.fc2"))
    window.tree.filter_edit.setText("")
    ln_f = _index(trace, "ln_f")
    window.diagram.stepActivated.emit(ln_f)  # what a click on its box emits
    _assert_panes_on(window, ln_f)
    window.inspector.stepRequested.emit(3)  # an attention thumbnail asking for a step
    _assert_panes_on(window, 3)


def test_expand_current_and_collapse_all(window):
    trace = tiny_trace()
    window.set_trace(trace)
    softmax = _index(trace, "blocks.0.attn.sdpa", kind="op", op="softmax")
    window.go_to(softmax)
    assert window.diagram.highlighted_key == _index(trace, "blocks.0")
    window.expand_current()
    assert window.diagram.highlighted_key == softmax
    window.collapse_all()
    assert window.diagram.highlighted_key == _index(trace, "blocks.0")


def test_open_a_saved_trace_and_recent_files(tmp_path, window, errors):
    path = tmp_path / "tiny.safetensors"
    tiny_trace().save(path)
    assert window.open_path(path)
    assert errors == []
    assert window.trace_path == path and "tiny.safetensors" in window.windowTitle()
    assert len(window.trace.steps) == len(tiny_trace().steps)
    assert window.recent_files()[0] == str(path.resolve())
    # a trace from a file names source files; they are read only when the user asks
    view = window.source_view
    assert view.show_file_button.isVisibleTo(window)
    assert "not read until you ask" in view.toPlainText()
    view.show_file_button.click()
    assert not view.show_file_button.isVisibleTo(window)
    _assert_panes_on(window, 0)


def test_the_source_pane_never_reads_what_a_stranger_names(tmp_path, window):
    """/etc/passwd, /dev/zero, a FIFO, a huge file: refused with a message, even when
    the user asks; a real .py file is shown once asked for."""
    import os

    from tracing.file.source_files import MAX_SOURCE_BYTES
    from tracing.record import SourceLocation

    fifo = tmp_path / "pipe.py"
    os.mkfifo(fifo)
    huge = tmp_path / "huge.py"
    huge.write_bytes(b"#" * (MAX_SOURCE_BYTES + 1))
    link = tmp_path / "passwd.py"
    link.symlink_to("/etc/passwd")
    good = tmp_path / "model.py"
    good.write_text("import torch\nx = torch.ones(2)\n")
    view = window.source_view
    view.set_ask_before_reading(True)
    cases = [
        ("/etc/passwd", "not a Python source file"),
        ("/dev/zero", "not a Python source file"),
        (str(link), "/etc/passwd is not a Python source file"),
        (str(fifo), "not a regular file"),
        (str(huge), "more than"),
        (str(good), None),
    ]
    for file, why in cases:
        view.show_location(SourceLocation(file=file, line=2, text="recorded text"))
        assert "not read until you ask" in view.toPlainText()
        view.confirm_pending()
        if why is None:
            assert view.highlighted_text() == "x = torch.ones(2)"
        else:
            assert why in view.toPlainText() and "recorded text" in view.toPlainText()


def test_a_value_that_cannot_be_read_is_a_dialog_not_a_crash(qtbot, tmp_path, window, errors):
    """The file is overwritten in place while open (``cp other open``): a memory map
    would kill the app with SIGBUS; here it is one dialog and the value shows as absent."""
    import shutil

    path, other = tmp_path / "open.sft", tmp_path / "other.sft"
    tiny_trace().save(path)
    tiny_trace(n_layers=1).save(other)
    assert window.open_path(path)
    shutil.copyfile(other, path)
    for index in range(len(window.trace.steps)):
        window.go_to(index)
    qtbot.waitUntil(lambda: len(errors) == 1)
    title, text = errors[0]
    assert title == "Cannot read a value" and "changed on disk" in text
    window.go_to(0)
    qtbot.wait(10)
    assert len(errors) == 1  # once per trace, not once per value


def test_a_corrupt_file_gives_a_dialog_and_the_window_survives(qtbot, tmp_path, window, errors):
    window.set_trace(tiny_trace())
    bad = tmp_path / "broken.safetensors"
    bad.write_bytes(b"\x08\x00\x00\x00\x00\x00\x00\x00{not json")
    assert not window.open_path(bad)
    assert len(errors) == 1 and "broken.safetensors" in errors[0][1]
    assert window.trace is not None  # the previous trace is still on show
    qtbot.keyClick(window, Qt.Key.Key_Right)
    _assert_panes_on(window, 1)


def test_drop_a_file_opens_it(qtbot, tmp_path, window):
    path = tmp_path / "dropped.safetensors"
    tiny_trace().save(path)
    mime = QMimeData()
    mime.setUrls([QUrl.fromLocalFile(str(path))])
    event = QDropEvent(
        QPointF(10, 10), Qt.DropAction.CopyAction, mime, Qt.MouseButton.LeftButton,
        Qt.KeyboardModifier.NoModifier,
    )  # fmt: skip
    window.dropEvent(event)
    qtbot.waitUntil(lambda: window.trace_path == path)


@pytest.mark.parametrize("fmt", ["md", "csv", "json", "html", "graphml"])
def test_export_each_report_format_and_read_it_back(tmp_path, window, errors, fmt):
    trace = tiny_trace()
    window.set_trace(trace)
    out = tmp_path / f"report.{fmt}"
    assert window.export_report(out, fmt)
    assert errors == []
    text = out.read_text(encoding="utf-8")
    if fmt == "md":
        assert "blocks.1.attn.sdpa" in text and "|" in text
    elif fmt == "csv":
        rows = list(csv.reader(io.StringIO(text)))
        assert len(rows) > len(trace.steps) // 2
        assert any("softmax" in cell for row in rows for cell in row)
    elif fmt == "json":
        data = json.loads(text)
        assert "blocks.1.attn.sdpa" in json.dumps(data)
    elif fmt == "html":
        assert "<html" in text.lower() and "blocks.1.attn.sdpa" in text
    else:
        graph = nx.read_graphml(out)
        assert graph.number_of_nodes() >= len(trace.steps) // 2


def test_export_a_report_with_axis_proofs(tmp_path, window, errors, monkeypatch):
    """File ▸ Export shape report with axis proofs…: ``report --proofs`` from the app."""
    assert not window.proofs_report_action.isEnabled()  # no trace yet
    trace = tiny_trace()
    window.set_trace(trace)
    assert window.proofs_report_action.isEnabled()
    file_menu = [a.text() for a in window.menus["File"].actions()]
    at = file_menu.index("Export shape &report…")
    assert file_menu[at + 1] == "Export shape report with axis &proofs…"
    out = tmp_path / "proofs"
    monkeypatch.setattr(
        "app.windows.main_window.QFileDialog.getSaveFileName",
        lambda *a, **k: (str(out), "Markdown (*.md)"),
    )
    window.proofs_report_action.trigger()
    assert errors == []
    text = (tmp_path / "proofs.md").read_text(encoding="utf-8")
    assert "| proofs |" in text and "output: [B, T, C]" in text
    assert window.export_report(tmp_path / "plain.md", "md")
    assert "| proofs |" not in (tmp_path / "plain.md").read_text(encoding="utf-8")


def test_export_diagram_and_heatmap(tmp_path, window, errors):
    window.set_trace(tiny_trace())
    window.go_to(_index(window.trace, "blocks.0.attn.sdpa", kind="op", op="softmax"))
    for name in ("d.png", "d.svg"):
        assert window.export_diagram(tmp_path / name)
        assert (tmp_path / name).stat().st_size > 500
    assert window.export_heatmap(tmp_path / "h.png")
    assert (tmp_path / "h.png").stat().st_size > 200
    assert errors == []


def test_launch_with_the_demo(window, errors):
    import scratchformer

    if not scratchformer.demo_checkpoint_path().is_file():
        pytest.skip("the bundled demo checkpoint is not built yet")
    window.load_demo(background=False)
    assert errors == []
    assert window.trace is not None and window.trace.meta["text"] == scratchformer.DEMO_PROMPT
    assert window.trace.meta["capture"] == "values"
    _assert_panes_on(window, 0)


def _preset(prompt="hi there", capture="shapes"):
    return session.TraceRequest(prompt, session.ModelSource("preset", preset="demo"), capture)


def test_new_trace_runs_in_a_worker(qtbot, window, errors):
    job = window.start_trace(_preset())
    assert job is not None
    with qtbot.waitSignal(window.traceJobEnded, timeout=30_000):
        pass
    assert errors == []
    assert window.trace is not None and window.trace.meta["tokens"] == list(b"hi there")
    assert window.job is None and window.progress_dialog is None


def test_bad_prompt_and_raising_forward_show_dialogs(qtbot, window, errors, monkeypatch):
    window.start_trace(_preset(prompt="x" * 500))
    with qtbot.waitSignal(window.traceJobEnded, timeout=30_000):
        pass
    assert errors and "at most 64" in errors[-1][1]
    assert window.trace is None

    model, tokenizer = session.build_model(session.ModelSource("preset", preset="demo"))

    def explode(module, args, output):
        raise RuntimeError("boom in the last block")

    model.blocks[-1].register_forward_hook(explode)
    monkeypatch.setattr(session, "build_model", lambda source: (model, tokenizer))
    window.start_trace(_preset())
    with qtbot.waitSignal(window.traceJobEnded, timeout=30_000):
        pass
    assert errors[-1][0] == "The forward pass raised" and "boom" in errors[-1][1]
    assert window.trace is not None and not window.trace.complete
    assert window.trace.steps[window.current].error is not None
    _assert_panes_on(window, window.current)


def test_excepthook_shows_a_dialog(window, errors):
    previous = sys.excepthook
    try:
        install_excepthook(window)
        try:
            raise KeyError("surprise")
        except KeyError as e:
            sys.excepthook(type(e), e, e.__traceback__)
    finally:
        sys.excepthook = previous
    assert errors == [("Unexpected error", "KeyError: 'surprise'")]


def test_app_command_rejects_a_missing_file(capsys):
    from app.cli import build_parser, main

    args = build_parser().parse_args(["app"])
    assert not args.trace and args.func.__module__ == "app.commands.app"  # no files given
    assert main(["app", "/no/such/trace.safetensors"]) == 2
    assert "no such trace file" in capsys.readouterr().err


def test_panels_add_menu_entries_through_the_window(window):
    """Panels go through add_menu_action / add_dock: their entries sit where they belong."""
    from PySide6.QtGui import QAction

    def texts(menu):
        return [a.text() for a in window.menus[menu].actions() if not a.isSeparator()]

    file_menu = texts("File")
    assert file_menu.index("Trace &generation…") == file_menu.index("&New trace…") + 1
    assert file_menu.index("&Compare with…") == file_menu.index("Save &As…") + 1
    assert texts("View")[-4:] == [
        "&Breakpoints",
        "&Lens (logit lens, heads)",
        "&Dims legend (axis letters)",
        "&Generation timeline",
    ]
    assert texts("Debug")[-5:] == [
        "Run to next &breakpoint",
        "&Find…",
        "Find &next",
        "Find &previous",
        "&Go to step…",
    ]

    extra = QAction("Extra", window)
    window.add_menu_action("Help", extra, separator=True)
    assert window.menus["Help"].actions()[-1] is extra
    assert window.menus["Help"].actions()[-2].isSeparator()
    assert extra in window.actions()  # its shortcut works with the menu bar hidden
    with pytest.raises(KeyError, match="no menu 'Tools'; the menus are File, Debug, View, Help"):
        window.add_menu_action("Tools", QAction("x", window))


def test_a_compare_window_of_two_files_reports_an_unreadable_value(qtbot, tmp_path, errors):
    """Opened from files, changed on disk before the diff reads them: one dialog."""
    import shutil

    from app.windows.compare_window import CompareWindow

    a, b, other = tmp_path / "a.sft", tmp_path / "b.sft", tmp_path / "other.sft"
    tiny_trace().save(a)
    tiny_trace().save(b)
    tiny_trace(n_layers=1).save(other)
    from app.core import session

    trace_a, trace_b = session.open_trace(a), session.open_trace(b)
    shutil.copyfile(other, b)
    window = CompareWindow(trace_a, trace_b, "a", "b")
    qtbot.addWidget(window)
    qtbot.waitUntil(lambda: len(errors) == 1)
    assert errors[0][0] == "Cannot read a value" and "changed on disk" in errors[0][1]


def test_opening_pauses_the_collector_and_the_previous_trace_can_still_be_freed(tmp_path, window):
    """Opening freezes the new trace's objects (later collections skip them) and
    unfreezes the previous ones first, so a replaced trace is not kept alive."""
    import gc
    import weakref

    first, second = tmp_path / "a.sft", tmp_path / "b.sft"
    tiny_trace().save(first)
    tiny_trace(n_layers=1).save(second)
    assert window.open_path(first)
    assert gc.isenabled() and gc.get_freeze_count() > 0
    gone = weakref.ref(window.trace)
    window.trace.meta["itself"] = window.trace  # a reference cycle: only gc can free it
    assert window.open_path(second)
    gc.collect()
    assert gone() is None
    assert not window.open_path(tmp_path / "missing.sft") and gc.isenabled()
