"""``scratchformer`` command line: ``app``, ``trace``, ``report``, ``train``, ``generate``...

Each subcommand lives in ``app/commands/<name>.py``. Errors the user can fix (a missing
file, a bad prompt, a corrupt checkpoint) print one line ``error: ...`` and exit with
status 2; they never end in a traceback.
"""

from __future__ import annotations

import argparse
import importlib
import sys

from app.commands import COMMANDS


class UserError(Exception):
    """A problem with the user's input, reported as one line without a traceback."""


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
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
    except UserError as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    except Exception as e:
        # Known, user-facing failures from the library carry a clear message already.
        from tracing.errors import TraceError, TraceFileError

        if isinstance(e, (TraceFileError, TraceError, FileNotFoundError, ValueError)):
            print(f"error: {e}", file=sys.stderr)
            return 2
        try:
            from scratchformer.checkpoint import CheckpointError
        except ImportError:  # pragma: no cover
            CheckpointError = ()  # type: ignore[assignment]
        if CheckpointError and isinstance(e, CheckpointError):
            print(f"error: {e}", file=sys.stderr)
            return 2
        raise


if __name__ == "__main__":  # pragma: no cover
    # ``python -m app.cli``: run the imported module's main, so that ``UserError`` raised by
    # the commands (``app.cli.UserError``) is the class caught here, not ``__main__``'s copy
    from app.cli import main as _main

    sys.exit(_main())
