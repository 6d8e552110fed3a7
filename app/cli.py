"""``scratchformer`` command line: ``app``, ``trace``, ``report``, ``train``, ``generate``...

Each subcommand lives in ``app/commands/<name>.py``. Errors the user can fix (a missing
file, a bad prompt, a corrupt checkpoint, a bad option, a path the system refuses) print
one line ``error: ...`` on stderr and exit with status 2; they never end in a traceback,
and argparse's own errors take the same one-line form (:class:`OneLineParser`).
"""

from __future__ import annotations

import argparse
import contextlib
import importlib
import sys

from app.commands import COMMANDS


class UserError(Exception):
    """A problem with the user's input, reported as one line without a traceback."""


class Terminated(KeyboardInterrupt):
    """SIGTERM, raised where Ctrl-C would be: a capture ends the same way (the partial
    trace kept, a streamed file closed), and the command exits with 128 + 15."""


def _on_sigterm(signum, frame) -> None:
    raise Terminated


def _end_on_sigterm() -> None:
    """Let SIGTERM end the command as Ctrl-C does (main thread, default handler only)."""
    import signal
    import threading

    main_thread = threading.current_thread() is threading.main_thread()
    if main_thread and signal.getsignal(signal.SIGTERM) is signal.SIG_DFL:
        signal.signal(signal.SIGTERM, _on_sigterm)


@contextlib.contextmanager
def signals_held(said: str):
    """Ctrl-C and SIGTERM wait while the block runs (a save: the file is written whole),
    then act as they would have, after ``said`` (where the file went) is printed. Only in
    the main thread, where Python runs its signal handlers; elsewhere a plain block."""
    import signal
    import threading

    if threading.current_thread() is not threading.main_thread():
        yield
        return
    held: list[int] = []
    before = {}
    for signum in (signal.SIGINT, signal.SIGTERM):
        before[signum] = signal.signal(signum, lambda n, frame: held.append(n))
    try:
        yield
    finally:
        for signum, handler in before.items():
            signal.signal(signum, signal.SIG_DFL if handler is None else handler)
    if held:
        print(said, file=sys.stderr)
        signal.raise_signal(held[0])  # the handler it would have met: Terminated, Ctrl-C...


def _exit_despite_threads(code: int) -> None:
    """Exit now if threads a user's model started (non-daemon) would keep the process
    alive after its work is done: they are not waited for."""
    import os
    import threading

    stray = [t for t in threading.enumerate() if not t.daemon and t is not threading.main_thread()]
    if not stray:
        return
    names = ", ".join(t.name for t in stray[:3])
    print(
        f"note: not waiting for {len(stray)} thread(s) the model started ({names})",
        file=sys.stderr,
    )
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(code)


class OneLineParser(argparse.ArgumentParser):
    """argparse, but a usage error is one ``error: ...`` line (exit 2), not the usage
    block; ``--help`` still shows the usage. Subcommand parsers are of this class too."""

    def error(self, message: str):  # type: ignore[override]
        command = self.prog.removeprefix("scratchformer").strip()
        where = f"{command}: " if command else ""
        self.exit(2, f"error: {where}{' '.join(message.split())} (see --help)\n")


def _one_line(e: BaseException) -> str:
    """The message of ``e`` on one line (a path that holds a newline stays one line)."""
    try:
        text = str(e) or type(e).__name__
    except Exception:  # an exception whose __str__ itself raises
        text = f"{type(e).__name__} (its message cannot be shown)"
    if isinstance(e, OSError) and e.strerror:
        text = f"{e.filename}: {e.strerror}" if e.filename else e.strerror
    from tracing.safe_text import inert

    # one line, and inert: an error may quote a file's text (ESC, CR, bidi overrides)
    return inert(" ".join(text.split()) if "\n" in text or "\r" in text else text)


def build_parser() -> argparse.ArgumentParser:
    parser = OneLineParser(
        prog="scratchformer",
        description="A tensor-tracing debugger for a decoder-only Transformer.",
    )
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")
    sub.required = True
    for name in COMMANDS:
        try:
            module = importlib.import_module(f"app.commands.{name}")
        except ModuleNotFoundError as e:  # a subcommand not built yet
            if e.name == f"app.commands.{name}":
                continue
            raise
        module.register(sub)
    return parser


def main(argv: list[str] | None = None) -> int:
    """Run the command ``argv`` (default: ``sys.argv``); as the program itself (no
    ``argv``), it also ends on SIGTERM as on Ctrl-C and does not wait for threads a
    user's model left running."""
    as_program = argv is None
    code = _main(argv, as_program)
    if as_program:
        _exit_despite_threads(code)
    return code


def _main(argv: list[str] | None, as_program: bool) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    if as_program:
        _end_on_sigterm()
    try:
        return int(args.func(args) or 0)
    except Terminated:
        print("terminated", file=sys.stderr)
        return 143
    except KeyboardInterrupt:
        print("interrupted", file=sys.stderr)
        return 130
    except Exception as e:
        # Known, user-facing failures carry a clear message already; an OSError is a path
        # or a disk the system refused; MemoryError a size this machine cannot hold.
        from app.commands.checks import PathProblem
        from tracing.errors import TraceError, TraceFileError

        known: tuple[type[BaseException], ...] = (
            UserError,
            PathProblem,
            TraceFileError,
            TraceError,
            OSError,
            ValueError,
            MemoryError,
        )
        # a CheckpointError was raised by a loaded scratchformer.checkpoint: where none is
        # loaded there is none to catch, and no torch to import just to say an error
        checkpoint = sys.modules.get("scratchformer.checkpoint")
        if checkpoint is not None:
            known += (checkpoint.CheckpointError,)
        if isinstance(e, known):
            prefix = "out of memory: " if isinstance(e, MemoryError) else ""
            print(f"error: {prefix}{_one_line(e)}", file=sys.stderr)
            return 2
        raise


if __name__ == "__main__":  # pragma: no cover
    # ``python -m app.cli``: run the imported module's main, so that ``UserError`` raised by
    # the commands (``app.cli.UserError``) is the class caught here, not ``__main__``'s copy
    from app.cli import main as _main

    sys.exit(_main())
