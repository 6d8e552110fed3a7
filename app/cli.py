"""``scratchformer`` command line: ``app``, ``trace``, ``report``, ``train``, ``generate``...

Each subcommand lives in ``app/commands/<name>.py``. Errors the user can fix (a missing
file, a bad prompt, a corrupt checkpoint, a bad option, a path the system refuses) print
one line ``error: ...`` on stderr and exit with status 2; they never end in a traceback,
and argparse's own errors take the same one-line form (:class:`OneLineParser`).
"""

from __future__ import annotations

import argparse
import importlib
import sys

from app.commands import COMMANDS


class UserError(Exception):
    """A problem with the user's input, reported as one line without a traceback."""


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
    parser = build_parser()
    args = parser.parse_args(argv)
    try:
        return int(args.func(args) or 0)
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
        try:
            from scratchformer.checkpoint import CheckpointError

            known += (CheckpointError,)
        except ImportError:  # pragma: no cover
            pass
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
