"""``scratchformer app [TRACE]``: the desktop debugger.

With no file it traces the bundled demo model on its default prompt, so a person sees a
real forward pass at once; with a trace file it opens that. ``--compare A B`` opens two
trace files side by side instead (``app.windows.compare_window``); several rank files of
one ``torch.distributed`` run open as one session (``app.windows.rank_window``).
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path


def register(subparsers: argparse._SubParsersAction) -> None:
    parser = subparsers.add_parser(
        "app",
        help="open the desktop debugger",
        description="Step through a traced forward pass on a block diagram.",
    )
    parser.add_argument(
        "trace",
        nargs="*",
        type=Path,
        help="a trace file to open (default: trace the demo); several rank files (or one "
        "name with .rank<N> files beside it) open as one session of ranks",
    )
    parser.add_argument(
        "--compare",
        nargs=2,
        type=Path,
        metavar=("A", "B"),
        help="open two trace files side by side, stepped together and coloured by divergence",
    )
    from app.commands.options import add_model_option

    add_model_option(parser)
    parser.add_argument(
        "--prompt", help="with --model: text (its tokenizer's tokens, else one per byte)"
    )
    parser.add_argument(
        "--capture", choices=("shapes", "stats", "values"), default="values",
        help="with --model: what to keep per tensor (default values)",
    )  # fmt: skip
    from app.commands.trace import add_input_arguments

    add_input_arguments(parser)
    parser.set_defaults(func=run)


def is_rank_set(paths: list[Path]) -> bool:
    """True when ``paths`` should open as ranks: several files, or one name whose
    ``.rank<N>`` files lie beside it. Qt-free and torch-free, so the command gets to its
    platform check (and a bad path to its error line) without loading either."""
    from tracing.file.rank_paths import rank_siblings

    if len(paths) > 1:
        return True
    return len(paths) == 1 and not paths[0].exists() and bool(rank_siblings(paths[0]))


def run(args: argparse.Namespace) -> int:
    from app.cli import UserError
    from app.commands.checks import input_file

    paths = list(args.trace or [])
    ranks = is_rank_set(paths)
    if not ranks:
        for path in paths:
            input_file(path, "trace file")
    args.trace = paths[0] if len(paths) == 1 and not ranks else None
    if getattr(args, "model", None):
        from app.core.model_sources import SourceSpec
        from app.core.user_model import UserCodeError

        if paths:
            raise UserError("give either trace files or --model, not both")
        try:
            spec = SourceSpec.parse(args.model)
        except UserCodeError as e:
            raise UserError(str(e)) from e
        if not spec.path.exists():
            raise UserError(f"no such model file: {spec.path}")
    compare = getattr(args, "compare", None)
    if compare is not None:
        if paths:
            raise UserError("give either trace files or --compare A B, not both")
        for path in compare:
            input_file(path, "trace file")
    from app.core.qt_platform import platform_problem

    problem = platform_problem()  # before Qt loads: it would abort on a missing library
    if problem is not None:
        raise UserError(problem)
    from PySide6.QtWidgets import QApplication

    own_app = QApplication.instance() is None  # (tests bring their own)
    qt_app = QApplication.instance() or QApplication(sys.argv[:1])
    qt_app.setApplicationName("Scratchformer")
    qt_app.setOrganizationName("Scratchformer")

    from app.theme import apply_theme

    apply_theme(qt_app)
    from app.signals import end_on_signals

    ending = end_on_signals(qt_app)  # SIGTERM, Ctrl-C: close the windows, end
    try:
        if compare is not None:
            code = _run_compare(qt_app, *compare)
        elif ranks:
            code = _run_ranks(qt_app, paths)
        else:
            code = _run_main(qt_app, args)
    finally:
        ending.restore()
    if ending.signal is not None and own_app:
        # the windows are closed (their closeEvent ran): end now, without the seconds of
        # the interpreter's teardown of Qt and torch that a signal's sender will not wait
        import os

        print("terminated" if code == 143 else "interrupted", file=sys.stderr)
        sys.stdout.flush()
        sys.stderr.flush()
        os._exit(code)
    return code


def _run_main(qt_app, args: argparse.Namespace) -> int:
    """The main window: a trace file, a ``--model``, or the demo."""
    from PySide6.QtCore import QTimer

    from app.windows.main_window import MainWindow, install_excepthook

    window = MainWindow()
    install_excepthook(window)
    window.show()
    _quit_after(qt_app, window)
    if getattr(args, "model", None):
        QTimer.singleShot(0, lambda: window.start_trace(model_request(args)))
    elif args.trace is not None:
        QTimer.singleShot(0, lambda: window.open_path(args.trace))
    else:
        QTimer.singleShot(0, window.load_demo)
    return qt_app.exec()


def _quit_after(qt_app, window) -> None:
    """``SCRATCHFORMER_QUIT_AFTER_MS``: close the window that long after its first trace is
    shown (or after a minute without one) and print where it was (for tests of
    ``tracing.show`` and scripted screenshots; unset in normal use)."""
    import os
    import time

    from PySide6.QtCore import QTimer

    from tracing.safe_text import inert

    ms = os.environ.get("SCRATCHFORMER_QUIT_AFTER_MS", "")
    if not ms.isdigit():
        return
    given_up = time.monotonic() + 60

    def report_and_quit() -> None:
        trace = window.trace
        where = window.status_text() if trace is not None else "no trace"
        print(f"shown: {inert(where)}", flush=True)  # names from a file: inert
        while (modal := qt_app.activeModalWidget()) is not None:  # an error box still open
            print(f"dialog: {modal.windowTitle()}", flush=True)
            modal.close()
            qt_app.processEvents()
            if qt_app.activeModalWidget() is modal:
                break
        window.close()
        qt_app.quit()

    def wait_for_a_trace() -> None:
        if window.trace is not None or time.monotonic() > given_up:
            QTimer.singleShot(int(ms), report_and_quit)
        else:
            QTimer.singleShot(100, wait_for_a_trace)

    QTimer.singleShot(0, wait_for_a_trace)


def model_request(args: argparse.Namespace):
    """The trace request ``--model FILE.py:NAME`` and its input options stand for."""
    from app.core.session import ModelSource, TraceRequest

    source = ModelSource(
        "file",
        model=args.model,
        input_shape=args.input_shape or "",
        input_dtype=args.input_dtype,
        device=args.device,
        tokenizer=args.tokenizer or "",
    )
    return TraceRequest(prompt=args.prompt or "", source=source, capture=args.capture)


def _run_ranks(qt_app, paths: list[Path]) -> int:
    """``scratchformer app t.rank0.sft t.rank1.sft``: the rank window on its own."""
    from app.cli import UserError
    from app.windows.main_window import install_excepthook
    from app.windows.rank_window import RankWindow
    from tracing.errors import TraceFileError

    try:
        window = RankWindow.from_files(paths if len(paths) > 1 else paths[0])
    except TraceFileError as e:
        raise UserError(str(e)) from e
    install_excepthook(window)
    window.show()
    return qt_app.exec()


def _run_compare(qt_app, path_a: Path, path_b: Path) -> int:
    """``scratchformer app --compare A B``: the compare window on its own."""
    from app.cli import UserError
    from app.core.session import SessionError
    from app.windows.compare_window import CompareWindow
    from app.windows.main_window import install_excepthook

    try:
        window = CompareWindow.from_files(path_a, path_b)
    except SessionError as e:
        raise UserError(str(e)) from e
    install_excepthook(window)
    window.show()
    return qt_app.exec()
